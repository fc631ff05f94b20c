"""Unit tests of the session's artifacts (``plugin/artifacts.py``) without a pytest session: the files
each pair gets, summary.json's index of them, the report's place, the sensitivity and recipe files,
and the fp32 models loaded once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from pytest_qaccuracy.analysis.results import ComparisonResult, LayerResult, OutputResult
from pytest_qaccuracy.analysis.sensitivity_report import SensitivityReport
from pytest_qaccuracy.plugin import artifacts
from pytest_qaccuracy.plugin.artifacts import (
    OWNED,
    fp32_models,
    publish_artifacts,
    report_path,
    write_artifacts,
    write_report,
)
from pytest_qaccuracy.plugin.records import PairRecord, SensitivityEntry
from pytest_qaccuracy.report.completeness import SessionStatus
from tests.report.test_writer_units import SECOND, _cumulative, _recipe_result, _sensitivity, _step, _sweep, needs_cache


def _model(path: Path) -> str:
    """An fp32 model x -> a (Conv) -> b (Relu) -> y, saved."""
    chain = [("Conv", "x", "a"), ("Relu", "a", "b"), ("Identity", "b", "y")]
    nodes = [helper.make_node(op, [i], [o]) for op, i, o in chain]
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("x", "y")]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", info[:1], info[1:])), path)
    return str(path)


def _comparison(metrics: tuple[str, ...] = ("sqnr", "cosine")) -> dict[str, Any]:
    values = {"sqnr": 20.0, "cosine": 0.99, "mse": 0.01}
    chosen = {m: values[m] for m in metrics}
    return ComparisonResult(
        fp32_model="m.onnx",
        quantized_model="m.q.onnx",
        data="d.npz",
        records=2,
        metric_definitions={m: "" for m in metrics},
        outputs=[OutputResult("y", chosen)],
        layers=[LayerResult("a", "a_q", "n", "Conv", 0, chosen), LayerResult("b", "b_q", "r", "Relu", 1, chosen)],
        higher_is_better={"sqnr": True, "cosine": True, "mse": False},
    ).to_dict()


def _record(root: Path, pair_id: str, fp32: str, **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": pair_id,
        "key": f"{pair_id}|key",
        "stem": f"{pair_id}-0000000{len(pair_id)}",
        "fp32": fp32,
        "quantized": str(root / "m.q.onnx"),
        "data": str(root / "d.npz"),
        "backend": "onnxruntime",
        "scheme": "onnxruntime",
        "comparison": _comparison(),
    }
    return PairRecord(**{**base, **changes}).to_dict()


def test_write_artifacts_files_and_index(tmp_path: Path) -> None:
    fp32 = _model(tmp_path / "m.onnx")
    records = [
        _record(tmp_path, "p", fp32),
        _record(tmp_path, "qq", str(tmp_path / "gone.onnx"), comparison=_comparison(("mse",))),
        _record(tmp_path, "rrr", fp32, comparison=_comparison(("cosine",))),
    ]
    out = tmp_path / "out"
    written = write_artifacts(out, records, tmp_path)
    pairs = out / "pairs"
    assert written == [
        pairs / "p-00000001.comparison.json",
        pairs / "p-00000001.sqnr.visq.json",  # each metric's visq.json, then its DOT graph
        pairs / "p-00000001.sqnr.dot",
        pairs / "p-00000001.cosine.visq.json",
        pairs / "qq-00000002.comparison.json",
        pairs / "qq-00000002.mse.visq.json",
        pairs / "rrr-00000003.comparison.json",
        pairs / "rrr-00000003.cosine.visq.json",
        pairs / "rrr-00000003.cosine.dot",
        out / "report.html",
        out / "summary.json",
    ]
    assert all(p.is_file() for p in written)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["report"] == "report.html"
    assert [p["artifacts"] for p in summary["pairs"]] == [
        {
            "comparison": "pairs/p-00000001.comparison.json",
            "visq": {"sqnr": "pairs/p-00000001.sqnr.visq.json", "cosine": "pairs/p-00000001.cosine.visq.json"},
            "dot": "pairs/p-00000001.sqnr.dot",
        },
        {
            "comparison": "pairs/qq-00000002.comparison.json",
            "visq": {"mse": "pairs/qq-00000002.mse.visq.json"},
            # mse is a graph metric, but the fp32 model is gone: no DOT
        },
        {
            "comparison": "pairs/rrr-00000003.comparison.json",
            "visq": {"cosine": "pairs/rrr-00000003.cosine.visq.json"},
            "dot": "pairs/rrr-00000003.cosine.dot",
        },
    ]
    assert summary["status"] == "complete" and summary["missing"] is None
    assert json.loads((pairs / "qq-00000002.comparison.json").read_text()) == records[1]["comparison"]
    assert "digraph" in (pairs / "p-00000001.sqnr.dot").read_text()
    html = (out / "report.html").read_text()
    assert [f'"title":"{pair_id}: m.q.onnx vs m.onnx"' in html for pair_id in ("p", "qq", "rrr")] == [True] * 3


def test_write_artifacts_report_elsewhere_and_an_incomplete_session(tmp_path: Path) -> None:
    fp32 = _model(tmp_path / "m.onnx")
    out, report = tmp_path / "out", tmp_path / "site" / "page.html"
    status = SessionStatus("interrupted", "during the tests")
    written = write_artifacts(out, [_record(tmp_path, "p", fp32)], tmp_path, report, status)
    assert written[-2:] == [report, out / "summary.json"]
    assert not (out / "report.html").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["report"] == report.as_posix()  # outside the folder: absolute
    assert summary["status"] == "interrupted"
    assert summary["missing"] == {"reason": "during the tests", "not_run": [], "lost": [], "workers_lost": 0}
    assert status.headline() is not None and status.headline() in report.read_text()


def test_publish_artifacts_replaces_the_folder_and_keeps_the_users_files(tmp_path: Path) -> None:
    fp32 = _model(tmp_path / "m.onnx")
    out = tmp_path / "out"
    (out / "pairs").mkdir(parents=True)
    (out / "pairs" / "old.comparison.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    assert OWNED == ("summary.json", "report.html", "pairs")
    written = publish_artifacts(out, [_record(tmp_path, "p", fp32)], tmp_path)
    assert written[-2:] == [out / "report.html", out / "summary.json"]
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "pairs", "report.html", "summary.json"]
    assert sorted(p.name for p in (out / "pairs").iterdir()) == sorted(p.name for p in written[:-2])
    assert (out / "notes.txt").read_text() == "mine"
    # the report named inside the folder is the folder's own; named elsewhere, it is written there
    inside = publish_artifacts(out, [_record(tmp_path, "p", fp32)], tmp_path, out / "report.html")
    assert inside[-2:] == [out / "report.html", out / "summary.json"]
    report = tmp_path / "page.html"
    elsewhere = publish_artifacts(out, [_record(tmp_path, "p", fp32)], tmp_path, report)
    assert elsewhere[-2:] == [report, out / "summary.json"] and report.is_file()
    assert not (out / "report.html").exists()


def test_publish_artifacts_says_whether_the_session_is_complete(tmp_path: Path) -> None:
    fp32 = _model(tmp_path / "m.onnx")
    status = SessionStatus("incomplete", "a worker crashed", workers_lost=1)
    publish_artifacts(tmp_path / "out", [_record(tmp_path, "p", fp32)], tmp_path, None, status)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "incomplete" and summary["missing"]["workers_lost"] == 1
    assert "session incomplete (a worker crashed)" in (tmp_path / "out" / "report.html").read_text()


def test_write_artifacts_loads_each_fp32_model_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_qaccuracy.model as model

    fp32 = _model(tmp_path / "m.onnx")
    loaded: list[str] = []
    real = model.load_model
    monkeypatch.setattr(model, "load_model", lambda path: loaded.append(path) or real(path))
    write_artifacts(tmp_path / "out", [_record(tmp_path, "p", fp32), _record(tmp_path, "qq", fp32)], tmp_path)
    assert loaded == [fp32]  # for the DOT graphs and the report together


def test_publish_artifacts_takes_a_relative_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fp32 = _model(tmp_path / "m.onnx")
    monkeypatch.chdir(tmp_path)
    written = publish_artifacts(Path("out"), [_record(tmp_path, "p", fp32)], tmp_path, Path("out/report.html"))
    assert written[-2:] == [tmp_path / "out" / "report.html", tmp_path / "out" / "summary.json"]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["report"] == "report.html"


def test_sensitivity_files(tmp_path: Path) -> None:
    fp32 = _model(tmp_path / "m.onnx")
    report = SensitivityReport("ignored", _sensitivity(), _sweep(), _cumulative())
    entry = SensitivityEntry(mode="single", metric="sqnr", report=report.to_dict())
    unsupported = SensitivityEntry(mode="single", metric="sqnr", error="E: no")
    records = [
        _record(tmp_path, "p", fp32, sensitivity=entry),
        _record(tmp_path, "qq", fp32, sensitivity=unsupported),
    ]
    out = tmp_path / "out"
    write_artifacts(out, records, tmp_path)
    summary = json.loads((out / "summary.json").read_text())
    index = summary["pairs"][0]["artifacts"]
    names = {
        "sensitivity": "pairs/p-00000001.sensitivity.json",
        "sweep": "pairs/p-00000001.sweep.json",
        "cumulative": "pairs/p-00000001.cumulative.json",
        "cumulative_chart": "pairs/p-00000001.cumulative.chart.json",
    }
    assert {k: index[k] for k in names} == names
    assert json.loads((out / names["sweep"]).read_text()) == _sweep().to_dict()
    assert not set(names) & set(summary["pairs"][1]["artifacts"])
    assert not list((out / "pairs").glob("qq-*.sensitivity.json"))


#: a session's entry has a ranking report or this error (the recipe is searched either way)
RANKING_ERROR = "ranking not run: budget"


def _recipe_entry(tmp_path: Path, **kwargs: Any) -> SensitivityEntry:
    result = _recipe_result([_step(0, SECOND, True)], 0, arguments={"per_channel": True}, **kwargs)
    data = {**result.to_dict(), "calibration_records": 6}
    return SensitivityEntry(mode="single", metric="sqnr", error=RANKING_ERROR, recipe=data)


def test_recipe_files(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    fp32 = _model(tmp_path / "models" / "m.onnx")
    out = tmp_path / "out"
    record = _record(tmp_path, "p", fp32, data=str(tmp_path / "data" / "d.npz"), sensitivity=_recipe_entry(tmp_path))
    write_artifacts(out, [record], tmp_path)
    recipe = json.loads((out / "summary.json").read_text())["pairs"][0]["artifacts"]["recipe"]
    assert recipe == {
        "json": "pairs/p-00000001.recipe.json",
        "python": "pairs/p-00000001.recipe.py",
        "steps": "pairs/p-00000001.recipe.steps.txt",
    }
    document = json.loads((out / recipe["json"]).read_text())
    # the script runs in the root folder: the pair's files relative to it
    assert document["model_input"] == "models/m.onnx"
    assert document["calibration_records"] == 6 and document["quantize_static"] == {"per_channel": True}
    script = (out / recipe["python"]).read_text()
    assert "data/d.npz" in script and str(tmp_path) not in script
    assert (out / recipe["steps"]).read_text().endswith("pass best\n")
    # the report names the files the recipe was written to
    listed = "recipe files in the artifacts folder: " + ", ".join(recipe.values())
    assert listed in (out / "report.html").read_text()


def test_recipe_files_of_a_pair_outside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    fp32 = _model(tmp_path / "m.onnx")
    record = _record(root, "p", fp32, data="rel/d.npz", sensitivity=_recipe_entry(tmp_path))
    write_artifacts(tmp_path / "out", [record], root)
    document = json.loads((tmp_path / "out" / "pairs" / "p-00000001.recipe.json").read_text())
    assert document["model_input"] == fp32
    assert "rel/d.npz" in (tmp_path / "out" / "pairs" / "p-00000001.recipe.py").read_text()


@needs_cache
def test_recipe_files_with_ranges(tmp_path: Path) -> None:
    fp32 = _model(tmp_path / "m.onnx")
    result = _recipe_result(
        [_step(0, SECOND, True)], 0, arguments={"calibration_cache_path": None}, ranges={"x": (-1.0, 2.0)}
    )
    recipe = {**result.to_dict(), "ranges": {"x": [-1.0, 2.0]}}  # as the session adds them: JSON lists
    entry = SensitivityEntry(mode="single", metric="sqnr", error=RANKING_ERROR, recipe=recipe)
    write_artifacts(tmp_path / "out", [_record(tmp_path, "p", fp32, sensitivity=entry)], tmp_path)
    recipe = json.loads((tmp_path / "out" / "summary.json").read_text())["pairs"][0]["artifacts"]["recipe"]
    assert recipe["ranges"] == "pairs/p-00000001.ranges.json"
    document = json.loads((tmp_path / "out" / recipe["json"]).read_text())
    assert document["quantize_static"] == {"calibration_cache_path": "p-00000001.ranges.json"}
    assert "calibration_records" not in document
    # summary.json's arguments name the ranges file written with the artifacts
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    brief = summary["pairs"][0]["sensitivity"]["recipe"]
    assert brief["quantize_static"] == {"calibration_cache_path": "pairs/p-00000001.ranges.json"}


def test_no_recipe_files_without_a_best_step(tmp_path: Path) -> None:
    fp32 = _model(tmp_path / "m.onnx")
    result = _recipe_result([_step(0, SECOND, False)], None)
    entry = SensitivityEntry(mode="single", metric="sqnr", error=RANKING_ERROR, recipe=result.to_dict())
    write_artifacts(tmp_path / "out", [_record(tmp_path, "p", fp32, sensitivity=entry)], tmp_path)
    assert "recipe" not in json.loads((tmp_path / "out" / "summary.json").read_text())["pairs"][0]["artifacts"]
    assert not list((tmp_path / "out" / "pairs").glob("*.recipe.*"))


def test_fp32_models_loads_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_qaccuracy.model as model

    fp32 = _model(tmp_path / "m.onnx")
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    loaded: list[str] = []
    real = model.load_model

    def counting(path: str) -> Any:
        loaded.append(path)
        return real(path)

    monkeypatch.setattr(model, "load_model", counting)
    records = [
        {"fp32": fp32},
        {"fp32": str(tmp_path / "gone.onnx")},
        {"fp32": fp32},
        {"fp32": str(tmp_path / "bad.onnx")},
    ]
    models = fp32_models(records)
    assert loaded == [fp32, str(tmp_path / "gone.onnx"), str(tmp_path / "bad.onnx")]
    assert list(models) == loaded
    assert [n.op_type for n in models[fp32].graph.node] == ["Conv", "Relu", "Identity"]
    assert models[str(tmp_path / "gone.onnx")] is None and models[str(tmp_path / "bad.onnx")] is None


def test_write_report_loads_the_models_unless_given(tmp_path: Path) -> None:
    fp32 = _model(tmp_path / "m.onnx")
    record = _record(tmp_path, "p", fp32)
    with_graph = write_report(tmp_path / "a.html", [record])
    without = write_report(tmp_path / "b.html", [record], {})
    assert with_graph == tmp_path / "a.html" and without == tmp_path / "b.html"
    assert "<svg" in with_graph.read_text() and "<svg" not in without.read_text()
    status = SessionStatus("incomplete", "a worker crashed")
    noticed = write_report(tmp_path / "c.html", [record], {}, status).read_text()
    assert "session incomplete (a worker crashed)" in noticed
    assert "session incomplete" not in write_report(tmp_path / "d.html", [record], {}, SessionStatus()).read_text()


class _Settings:
    def __init__(self, report: Path | None, artifacts_dir: Path | None) -> None:
        self.report, self.artifacts_dir = report, artifacts_dir


def test_report_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = Path("out")
    assert report_path(_Settings(None, out), [out / "report.html"]) == tmp_path / "out" / "report.html"
    assert report_path(_Settings(None, out), [out / "summary.json"]) is None  # not written
    assert report_path(_Settings(Path("r.html"), out), [out / "report.html", Path("r.html")]) == tmp_path / "r.html"
    assert report_path(_Settings(Path("r.html"), out), [out / "report.html"]) is None
    assert report_path(_Settings(None, None), [out / "report.html"]) is None
    assert report_path(_Settings(Path("r.html"), None), [Path("r.html")]) == tmp_path / "r.html"


def test_shown_names_paths_inside_the_root_relative(tmp_path: Path) -> None:
    assert artifacts._shown(str(tmp_path / "a" / "m.onnx"), tmp_path) == "a/m.onnx"
    assert artifacts._shown(str(tmp_path.parent / "m.onnx"), tmp_path) == str(tmp_path.parent / "m.onnx")
    assert artifacts._shown("rel/m.onnx", tmp_path) == "rel/m.onnx"
