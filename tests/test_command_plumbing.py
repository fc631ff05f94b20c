"""What each sub-command passes to the library and prints, with the library's heavy calls replaced
by recorders: every option reaches the call it is for, every refusal is one line naming its option.

The end-to-end runs (tests/test_cli.py, tests/analysis/) show the commands work on real models; these
show, in milliseconds, that nothing the user asked for is dropped on the way."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_qaccuracy.cli import main
from pytest_qaccuracy.runtime import RuntimeOptions


class Calls:
    """Records each replaced function's arguments under its name; returns what ``returns`` says."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.seen: dict[str, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {}

    def replace(self, module: Any, name: str, returns: Any = None) -> None:
        def record(*args: Any, **kwargs: Any) -> Any:
            self.seen.setdefault(name, []).append((args, kwargs))
            return returns(*args, **kwargs) if callable(returns) else returns

        self.monkeypatch.setattr(module, name, record)

    def one(self, name: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        assert len(self.seen.get(name, [])) == 1, (name, self.seen.get(name))
        return self.seen[name][0]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    return Calls(monkeypatch)


# -- calibrate ----------------------------------------------------------------------------------


def _calibrate(calls: Calls, tmp_path: Path, selection: Any = None, warning: str = "") -> dict[str, Path]:
    import pytest_qaccuracy.analysis.calibration as calibration
    import pytest_qaccuracy.analysis.calibration.auto as auto
    import pytest_qaccuracy.analysis.calibration.quantize as quantize
    import pytest_qaccuracy.model.loading as loading

    paths = {"fp32": tmp_path / "net.onnx", "data": tmp_path / "d.npz", "out": tmp_path / "q.onnx"}
    result = SimpleNamespace(ranges={"a": 1, "b": 2}, records=7, selection=selection, to_dict=lambda: {"r": 1})
    calls.replace(calibration, "compute_ranges", result)
    calls.replace(calibration, "quantize_with_ranges", paths["out"])
    calls.replace(auto, "check_against_minmax", warning)
    calls.replace(auto, "selection_line", lambda s: f"selected {s}")
    calls.replace(quantize, "opset_note", "")
    calls.replace(loading, "load_model", "MODEL")
    paths["result"] = result  # type: ignore[assignment]
    return paths


def test_calibrate_passes_every_option(calls: Calls, tmp_path: Path, capsys) -> None:
    from pytest_qaccuracy.analysis.calibration import CalibrationOptions

    p = _calibrate(calls, tmp_path, warning="worse than min/max")
    argv = [
        "calibrate", str(p["fp32"]), "--data", str(p["data"]), "--out", str(p["out"]), "--method", "percentile",
        "--power2", "--per-channel", "--format", "qoperator", "--activation-type", "int8", "--weight-type", "uint8",
        "--percentiles", "2,98.5", "--moving-average", "8,0.5", "--bins", "101", "--exclude-nodes", "a, b",
        "--exclude-nodes", "c", "--threads", "2", "--batch-size", "3", "--json", str(tmp_path / "r.json"),
    ]  # fmt: skip
    assert main(argv) == 0
    want = CalibrationOptions(
        method="percentile", activation_type="int8", weight_type="uint8", per_channel=True, power2=True,
        percentiles=(2.0, 98.5), moving_average=(8, 0.5), bins=101, quant_format="qoperator",
    )  # fmt: skip
    options = RuntimeOptions(providers=("CPUExecutionProvider",), threads=2, batch_size=3)
    exclude = ["a", "b", "c"]
    assert calls.one("compute_ranges") == ((p["fp32"], p["data"], want, options), {"nodes_to_exclude": exclude})
    assert calls.one("quantize_with_ranges") == ((p["fp32"], p["out"], p["result"], want, exclude), {})
    check = ((p["fp32"], p["out"], p["result"], p["data"], want, options, exclude), {})
    assert calls.one("check_against_minmax") == check
    assert calls.one("opset_note") == (("MODEL", want), {})
    out, err = capsys.readouterr()
    assert out == (
        f"calibrated 2 tensor(s) on 7 record(s) with percentile\nwrote {tmp_path / 'r.json'}\nwrote {p['out']}\n"
    )
    assert err == "warning: worse than min/max\n"
    assert json.loads((tmp_path / "r.json").read_text()) == {"r": 1}


def test_calibrate_checks_against_minmax_only_when_it_can_differ(calls: Calls, tmp_path: Path, capsys) -> None:
    p = _calibrate(calls, tmp_path)
    base = ["calibrate", str(p["fp32"]), "--data", str(p["data"]), "--out", str(p["out"])]
    assert main(base) == 0  # minmax: nothing to check against
    assert main([*base, "--method", "kl", "--no-check"]) == 0
    assert "check_against_minmax" not in calls.seen
    assert main([*base, "--method", "kl"]) == 0  # no warning: nothing on stderr
    assert len(calls.seen["check_against_minmax"]) == 1
    assert capsys.readouterr().err == ""


def test_calibrate_auto_prints_its_selection_and_a_note(calls: Calls, tmp_path: Path, capsys) -> None:
    import pytest_qaccuracy.analysis.calibration.quantize as quantize

    p = _calibrate(calls, tmp_path, selection="SEL")
    calls.replace(quantize, "opset_note", "note: opset 13")
    assert (
        main(["calibrate", str(p["fp32"]), "--data", str(p["data"]), "--out", str(p["out"]), "--method", "auto"]) == 0
    )
    assert calls.one("selection_line") == (("SEL",), {})
    assert "check_against_minmax" not in calls.seen
    assert capsys.readouterr().out.splitlines()[1:] == ["note: opset 13", "selected SEL", f"wrote {p['out']}"]


def test_calibrate_refusals(calls: Calls, tmp_path: Path, capsys) -> None:
    from pytest_qaccuracy.commands.calibrate import _pair

    assert _pair("1,2") == (1.0, 2.0) and _pair(" 3 , 4.5") == (3.0, 4.5)
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected two comma-separated numbers, got '1'$"):
        _pair("1")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected two numbers, got 'a,2'$"):
        _pair("a,2")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected two numbers, got '1,b'$"):
        _pair("1,b")
    p = _calibrate(calls, tmp_path)
    base = ["calibrate", str(p["fp32"]), "--data", str(p["data"]), "--out", str(p["out"])]
    assert main([*base, "--moving-average", "2.5,0.1"]) == 2
    assert capsys.readouterr().err == "error: --moving-average batch must be an integer, got 2.5\n"
    (tmp_path / "dir.json").mkdir()
    assert main([*base, "--json", str(tmp_path / "dir.json")]) == 2
    assert capsys.readouterr().err == f"error: --json {tmp_path / 'dir.json'}: is a directory, expected a file\n"
    assert "compute_ranges" not in calls.seen


def test_calibrate_write_failures_name_the_option(calls: Calls, tmp_path: Path, capsys, monkeypatch) -> None:
    import pytest_qaccuracy.analysis.calibration as calibration
    import pytest_qaccuracy.atomic as atomic

    p = _calibrate(calls, tmp_path)

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    base = ["calibrate", str(p["fp32"]), "--data", str(p["data"]), "--out", str(p["out"])]
    monkeypatch.setattr(atomic, "atomic_write_json", full)
    assert main([*base, "--json", str(tmp_path / "r.json")]) == 2
    reason = "could not be written (No space left on device); left as it was"
    assert capsys.readouterr().err == f"error: --json {tmp_path / 'r.json'}: {reason}\n"
    monkeypatch.setattr(calibration, "quantize_with_ranges", full)
    assert main(base) == 2
    assert capsys.readouterr().err == f"error: --out {p['out']}: {reason}\n"


# -- sensitivity --------------------------------------------------------------------------------


class _Session:
    closed = False

    def close(self) -> None:
        self.closed = True


def _sensitivity(calls: Calls, tmp_path: Path, suggestion: Any = "keep") -> dict[str, Any]:
    import pytest_qaccuracy.analysis.cumulative as cumulative
    import pytest_qaccuracy.analysis.sensitivity as sensitivity
    import pytest_qaccuracy.analysis.sweep as sweep
    import pytest_qaccuracy.model as model
    import pytest_qaccuracy.report.sensitivity_tables as tables

    session = _Session()
    calls.replace(model, "ModelPair", lambda fp32, q: SimpleNamespace(fp32=Path(fp32), quantized_path=Path(q)))
    calls.replace(sensitivity, "open_session", session)
    calls.replace(sensitivity, "sensitivity_in", "RANKING")
    calls.replace(cumulative, "cumulative_in", "CURVES")
    calls.replace(sweep, "sweep_in", lambda *a: SimpleNamespace(target=a[3], suggestion=suggestion))
    calls.replace(tables, "sensitivity_table", lambda ranking, top=10: f"RANKED top={top}" * (ranking == "RANKING"))
    calls.replace(tables, "sweep_table", lambda sweep: f"SWEPT {sweep.suggestion}")
    calls.replace(tables, "cumulative_table", lambda curves: "CUMULATIVE" * (curves == "CURVES"))
    calls.replace(tables, "write_sensitivity_artifacts", [tmp_path / "a.json"])
    return {"session": session, "argv": ["sensitivity", "f.onnx", "net.q.onnx", "--data", str(tmp_path / "d.npz")]}


def test_sensitivity_passes_every_option(calls: Calls, tmp_path: Path, capsys) -> None:
    from pytest_qaccuracy.analysis.sweep import Target

    s = _sensitivity(calls, tmp_path)
    argv = [
        *s["argv"], "--metrics", "mse", "--target", "cosine>=0.9", "--records", "1", "--sweep", "0", "--top", "4",
        "--threads", "3", "--batch-size", "5", "--capture", "deployed", "--strategy", "naive", "--allow-nonfinite",
        "--output", "a,b", "--mode", "leave-one-out", "--granularity", "weight", "--nodes", "n1, n2",
    ]  # fmt: skip
    assert main(argv) == 0
    options = RuntimeOptions(providers=("CPUExecutionProvider",), threads=3, batch_size=5)
    args, _ = calls.one("open_session")
    assert args[1:] == (tmp_path / "d.npz", ["mse", "cosine"], options, "deployed", "naive", True, 1, ("a", "b"))
    assert calls.one("sensitivity_in") == ((s["session"], "leave-one-out", "weight", ("n1", "n2")), {})
    assert calls.one("sweep_in") == ((s["session"], "RANKING", 0, Target.parse("cosine>=0.9")), {})
    assert s["session"].closed
    stem, out_dir, json_path = calls.one("write_sensitivity_artifacts")[0]
    assert (stem, out_dir, json_path) == ("net.q", None, None)
    written = calls.one("write_sensitivity_artifacts")[1]
    assert set(written) == {"sensitivity", "sweep"} and written["sensitivity"] == "RANKING"
    assert written["sweep"].suggestion == "keep"
    assert capsys.readouterr().out == f"RANKED top=4\n\nSWEPT keep\nwrote {tmp_path / 'a.json'}\n"
    pair = calls.one("ModelPair")[0]
    assert pair == (Path("f.onnx"), Path("net.q.onnx")) and args[0].fp32 == Path("f.onnx")


def test_sensitivity_defaults_and_a_missed_target(calls: Calls, tmp_path: Path, capsys) -> None:
    s = _sensitivity(calls, tmp_path, suggestion=None)
    assert main(s["argv"]) == 0
    args, _ = calls.one("open_session")
    assert args[2:] == (["cosine"], RuntimeOptions(), "reference", "reuse", False, None, None)
    assert calls.one("sensitivity_in")[0][1:] == ("single", "node", None)
    assert "sweep_in" not in calls.seen  # neither --sweep nor --target
    assert capsys.readouterr().out == f"RANKED top=10\nwrote {tmp_path / 'a.json'}\n"
    assert main([*s["argv"], "--target", "cosine>=0.9", "--metrics", "cosine,mse"]) == 1  # no suggestion reaches it
    assert calls.seen["open_session"][1][0][2] == ["cosine", "mse"]  # the target's metric is there already


def test_sensitivity_cumulative(calls: Calls, tmp_path: Path, capsys) -> None:
    from pytest_qaccuracy.analysis.cumulative import DEFAULT_CONFIGS, parse_configs

    s = _sensitivity(calls, tmp_path)
    assert main([*s["argv"], "--mode", "cumulative"]) == 0
    assert calls.one("cumulative_in") == ((s["session"], list(DEFAULT_CONFIGS), False), {})
    assert capsys.readouterr().out == f"CUMULATIVE\nwrote {tmp_path / 'a.json'}\n"
    argv = [*s["argv"], "--mode", "cumulative", "--quantize-nodes", "a,b", "--exclude-nodes", "c", "--average-mode"]
    assert main(argv) == 0
    assert calls.seen["cumulative_in"][1][0][1:] == (parse_configs([("a", "b")], [("c",)]), True)
    argv = [*s["argv"], "--mode", "cumulative", "--exclude-nodes", "c,d", "--exclude-nodes", "e"]
    assert main(argv) == 0
    assert calls.seen["cumulative_in"][2][0][1] == parse_configs([], [("c", "d"), ("e",)])
    assert calls.seen["write_sensitivity_artifacts"][1][1] == {"cumulative": "CURVES"}


NOT_CUMULATIVE = "--sweep and --target apply to --mode single or leave-one-out, not cumulative"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--records", "0"], "--records must be >= 1, got 0"),
        (["--sweep", "-1"], "--sweep must be >= 0, got -1"),
        (["--mode", "cumulative", "--sweep", "2"], NOT_CUMULATIVE),
        (["--mode", "cumulative", "--target", "cosine>=0.9"], NOT_CUMULATIVE),
        (["--quantize-nodes", "a"], "--quantize-nodes, --exclude-nodes and --average-mode apply to --mode cumulative"),
        (["--exclude-nodes", "a"], "--quantize-nodes, --exclude-nodes and --average-mode apply to --mode cumulative"),
        (["--average-mode"], "--quantize-nodes, --exclude-nodes and --average-mode apply to --mode cumulative"),
        (["--target", "mse<=1e"], "target 'mse<=1e': expected METRIC>=VALUE or METRIC<=VALUE, e.g. cosine>=0.999"),
    ],
)  # fmt: skip
def test_sensitivity_refusals(calls: Calls, tmp_path: Path, capsys, extra: list[str], message: str) -> None:
    s = _sensitivity(calls, tmp_path)
    assert main([*s["argv"], *extra]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert "open_session" not in calls.seen


def test_sensitivity_output_targets_are_checked_first(calls: Calls, tmp_path: Path, capsys) -> None:
    s = _sensitivity(calls, tmp_path)
    (tmp_path / "j").mkdir()
    assert main([*s["argv"], "--json", str(tmp_path / "j")]) == 2
    assert capsys.readouterr().err == f"error: --json {tmp_path / 'j'}: is a directory, expected a file\n"
    (tmp_path / "f").write_text("")
    assert main([*s["argv"], "--out-dir", str(tmp_path / "f")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out-dir {tmp_path / 'f'}: ")
    assert "open_session" not in calls.seen


# -- saturation ---------------------------------------------------------------------------------


def _saturation(
    calls: Calls, layers: tuple[Any, ...], outputs: dict[str, float | None], preset: str = "onnxruntime-avx2"
):
    import pytest_qaccuracy.analysis.saturation as saturation

    report = saturation.SaturationReport("net.q.onnx", 6, layers, outputs, preset=preset, exact="exact-preset")
    calls.replace(saturation, "measure_saturation", report)
    remedies = [
        saturation.RemedyResult("reduce_range", "7-bit weights", 0, {"y": 30.5}),
        saturation.RemedyResult("split", "two convs", None, {}, note="not applicable"),
        saturation.RemedyResult("int16", "16 bits", 3, {"y": None, "z": 12.25}),
    ]
    calls.replace(saturation, "check_remedies", remedies)
    return report


def _layer(node: str, pairs: int, saturated: int, tensor: str | None = "t", worst: int | None = 2):
    from pytest_qaccuracy.analysis.saturation import LayerSaturation

    return LayerSaturation(node, pairs, saturated, worst, 7, tensor, 5, 40, 3)


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().split("  ") if cell.strip()]


def test_saturation_reports_layers_outputs_and_remedies(calls: Calls, tmp_path: Path, capsys) -> None:
    layers = (_layer("conv1", 1000, 25), _layer("conv2", 1000, 0, tensor=None, worst=None))
    report = _saturation(calls, layers, {"y": 24.123456, "z": None})
    out = tmp_path / "s.json"
    argv = ["saturation", "m.onnx", "--data", "d.npz", "--batch-size", "3", "--threads", "2", "--json", str(out)]
    assert main(argv) == 0
    assert calls.one("measure_saturation") == (
        (Path("m.onnx"), Path("d.npz")),
        {"batch_size": 3, "threads": 2, "preset": "onnxruntime-avx2"},
    )
    assert calls.one("check_remedies") == ((Path("m.onnx"), Path("d.npz"), report), {"batch_size": 3, "threads": 2})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "net.q.onnx: 6 records, onnxruntime-avx2 (int16 pairs) against exact-preset"
    head = _cells(lines[1])
    assert head == ["node", "saturated pair sums", "share", "worst record", "output elements moved", "max steps"]
    assert _cells(lines[3]) == ["conv1", "25 / 1000", "2.5%", "2 (7)", "5 / 40", "3"]
    assert _cells(lines[4]) == ["conv2", "0 / 1000", "0%", "-", "-", "-"]
    assert lines[5] == "total: 25 / 2000 pair sums saturate (1.25%)"
    assert lines[6:8] == [
        "output 'y' on onnxruntime-avx2: SQNR 24.12 dB against the exact run",
        "output 'z' on onnxruntime-avx2: identical to the exact run",
    ]
    assert lines[8] == "remedies, each applied to the model and run on onnxruntime-avx2 (docs/cpus.md):"
    assert _cells(lines[9]) == ["remedy", "how", "saturated", "outputs against exact-preset"]
    assert _cells(lines[11]) == ["reduce_range", "7-bit weights", "0", "SQNR 30.5 dB"]
    assert _cells(lines[12]) == ["split", "two convs", "-", "not applicable"]
    assert _cells(lines[13]) == ["int16", "16 bits", "3", "identical, SQNR 12.25 dB"]
    document = json.loads(out.read_text())
    assert document["remedies"][0] == {
        "name": "reduce_range",
        "how": "7-bit weights",
        "saturated": 0,
        "outputs_sqnr_vs_exact": {"y": 30.5},
        "note": "",
    }
    assert document["saturated"] == 25 and len(document["remedies"]) == 3


def test_saturation_on_arm_wraps_and_a_clean_model_needs_no_remedy(calls: Calls, tmp_path: Path, capsys) -> None:
    _saturation(calls, (), {"y": None}, preset="onnxruntime-arm64")
    out = tmp_path / "s.json"
    argv = ["saturation", "m.onnx", "--data", "d.npz", "--preset", "onnxruntime-arm64", "--json", str(out)]
    assert main([*argv, "--max-saturated", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [
        "no layer sums 8-bit products in int16 pairs on onnxruntime-arm64",
        "output 'y' on onnxruntime-arm64: identical to the exact run",
    ]
    assert calls.one("measure_saturation")[1]["preset"] == "onnxruntime-arm64"
    assert "check_remedies" not in calls.seen and "remedies" not in json.loads(out.read_text())
    calls.seen.clear()
    _saturation(calls, (_layer("c", 10, 1),), {}, preset="onnxruntime-arm64")
    assert main(argv[:-2]) == 0
    assert _cells(capsys.readouterr().out.splitlines()[1])[1] == "wrapped pair sums"


def test_saturation_gate(calls: Calls, capsys) -> None:
    _saturation(calls, (_layer("c", 1000, 25),), {})
    argv = ["saturation", "m.onnx", "--data", "d.npz"]
    assert main([*argv, "--max-saturated", "0.025"]) == 0  # at the limit: not more than it
    capsys.readouterr()
    assert main([*argv, "--max-saturated", "0.02"]) == 1
    err = capsys.readouterr().err
    assert err == "error: 2.5% of pair sums saturate on onnxruntime-avx2, more than --max-saturated 0.02\n"
    for bad in ("-0.1", "1.5"):
        assert main([*argv, "--max-saturated", bad]) == 2
        assert (
            capsys.readouterr().err == f"error: --max-saturated must be a fraction between 0 and 1, got {float(bad)}\n"
        )
    assert main([*argv, "--max-saturated", "1"]) == 0 and main([*argv, "--max-saturated", "0.0"]) == 1
    capsys.readouterr()
    assert main([*argv, "--preset", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: ") and len(calls.seen["measure_saturation"]) == 4
    assert main([*argv, "--batch-size", "0"]) == 2
    assert capsys.readouterr().err == "error: --batch-size must be >= 1, got 0\n"


def test_saturation_json_target_and_write_errors(calls: Calls, tmp_path: Path, capsys, monkeypatch) -> None:
    import pytest_qaccuracy.atomic as atomic

    _saturation(calls, (), {})
    (tmp_path / "d").mkdir()
    argv = ["saturation", "m.onnx", "--data", "d.npz", "--json"]
    assert main([*argv, str(tmp_path / "d")]) == 2
    assert capsys.readouterr().err == f"error: --json {tmp_path / 'd'}: is a directory, expected a file\n"
    assert "measure_saturation" not in calls.seen

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic, "atomic_write_json", full)
    assert main([*argv, str(tmp_path / "s.json")]) == 2
    reason = "could not be written (No space left on device); left as it was"
    assert capsys.readouterr().err == f"error: --json {tmp_path / 's.json'}: {reason}\n"


# -- recipe -------------------------------------------------------------------------------------


def _recipe(calls: Calls, tmp_path: Path, *, best: Any = "BEST", stopped: str = "met", met: bool = True):
    import pytest_qaccuracy.analysis.recipe as recipe
    import pytest_qaccuracy.analysis.recipe.build as build
    import pytest_qaccuracy.report.recipe_tables as tables

    result = SimpleNamespace(best=best, stopped=stopped, met=met, to_dict=lambda: {"steps": 2})

    def search(*args: Any, **kwargs: Any) -> Any:
        kwargs["on_note"]("calibrating")
        kwargs["on_step"]("STEP", "BEST-SO-FAR")
        return result

    calls.replace(recipe, "search_recipe", search)
    calls.replace(build, "check_onnxruntime", None)
    calls.replace(tables, "write_recipe", lambda *a: [tmp_path / "out" / "net.recipe.onnx"])
    calls.replace(tables, "steps_table", "STEPS")
    calls.replace(tables, "verdict_lines", ["met: yes", "cost 1"])
    calls.replace(tables, "step_line", lambda step, best, checks: f"step {step} (best {best})")
    for name in ("net.onnx", "calib.npz", "eval.npz"):
        (tmp_path / name).write_bytes(b"")
    return result, [
        "recipe", str(tmp_path / "net.onnx"), "--data", str(tmp_path / "calib.npz"),
        "--eval", str(tmp_path / "eval.npz"), "--target", "cosine>=0.99", "--out-dir", str(tmp_path / "out"),
    ]  # fmt: skip


def test_recipe_passes_every_option(calls: Calls, tmp_path: Path, capsys) -> None:
    from pytest_qaccuracy.analysis.recipe import Budget, Recipe, parse_checks

    result, argv = _recipe(calls, tmp_path)
    (tmp_path / "t.jsonl").write_text("")
    extra = [
        "--target", "sqnr>=20", "--targets", "onnxruntime,tflite", "--budget", "10m,40", "--methods", "minmax, kl",
        "--method", "kl", "--per-channel", "--reduce-range", "--activation-type", "int8", "--weight-type", "uint8",
        "--cost", "int16=0.5", "--estimate-records", "0", "--exhaustive-nodes", "0", "--threads", "2",
        "--batch-size", "3", "--task-metric", "ctc", "--task-metric", '{"metric": "ctc", "blank": 1}',
        "--task-targets", str(tmp_path / "t.jsonl"), "--json", str(tmp_path / "r.json"),
    ]  # fmt: skip
    assert main([*argv, *extra]) == 0
    args, kwargs = calls.one("search_recipe")
    assert args == (
        tmp_path / "net.onnx",
        tmp_path / "calib.npz",
        tmp_path / "eval.npz",
        parse_checks(["cosine>=0.99", "sqnr>=20"]),
        ("onnxruntime", "tflite"),
    )
    assert {k: v for k, v in kwargs.items() if k not in ("on_step", "on_note")} == {
        "start": Recipe("kl", True, True, "int8", "uint8"),
        "budget": Budget.parse("10m,40"),
        "weights": {"int16": 0.5},
        "methods": ("minmax", "kl"),
        "options": RuntimeOptions(providers=("CPUExecutionProvider",), threads=2, batch_size=3),
        "estimate_records": 0,
        "exhaustive_nodes": 0,
        "model_out": tmp_path / "out" / "net.recipe.onnx",
        "tasks": ["ctc", {"metric": "ctc", "blank": 1}],
        "task_targets": tmp_path / "t.jsonl",
    }
    out, err = capsys.readouterr()
    assert out == (
        f"STEPS\n\nmet: yes\ncost 1\nwrote {tmp_path / 'out' / 'net.recipe.onnx'}\nwrote {tmp_path / 'r.json'}\n"
    )
    assert err == "recipe: calibrating\nstep STEP (best BEST-SO-FAR)\n"
    assert json.loads((tmp_path / "r.json").read_text()) == {"steps": 2}
    assert calls.one("write_recipe")[0] == (result, tmp_path / "out", tmp_path / "net.onnx", tmp_path / "calib.npz")


def test_recipe_defaults_quiet_and_verdicts(calls: Calls, tmp_path: Path, capsys) -> None:
    from pytest_qaccuracy.analysis.recipe import Budget, Recipe

    _, argv = _recipe(calls, tmp_path, met=False)
    assert main([*argv, "--quiet"]) == 1  # not met
    kwargs = calls.one("search_recipe")[1]
    assert calls.one("search_recipe")[0][4] == ("onnxruntime",)
    assert (kwargs["start"], kwargs["budget"], kwargs["methods"]) == (
        Recipe("minmax", False, False, "uint8", "int8"),
        Budget.parse(""),
        None,
    )
    assert (kwargs["estimate_records"], kwargs["exhaustive_nodes"], kwargs["tasks"], kwargs["task_targets"]) == (
        4,
        16,
        [],
        None,
    )
    assert kwargs["weights"] == {"int16": 1.0, "float": 1.0} and kwargs["options"] == RuntimeOptions()
    out, err = capsys.readouterr()
    assert err == "" and out.endswith(f"wrote {tmp_path / 'out' / 'net.recipe.onnx'}\n")


def test_recipe_interrupted(calls: Calls, tmp_path: Path, capsys) -> None:
    _, argv = _recipe(calls, tmp_path, stopped="interrupted")
    assert main(argv) == 130
    assert capsys.readouterr().err.endswith("error: interrupted; the best recipe so far is written\n")
    calls.seen.clear()
    _, argv = _recipe(calls, tmp_path, best=None, stopped="interrupted", met=False)
    assert main([*argv, "-q"]) == 130
    out, err = capsys.readouterr()
    assert err == "error: interrupted before a recipe was measured; no recipe written\n"
    assert "write_recipe" not in calls.seen and "wrote" not in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--estimate-records", "-1"], "--estimate-records must be >= 0, got -1"),
        (["--exhaustive-nodes", "-2"], "--exhaustive-nodes must be >= 0, got -2"),
        (["--task-targets", "missing.jsonl"], "--task-targets: missing.jsonl does not exist"),
    ],
)
def test_recipe_refusals(calls: Calls, tmp_path: Path, capsys, extra: list[str], message: str) -> None:
    _, argv = _recipe(calls, tmp_path)
    assert main([*argv, *extra]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert "search_recipe" not in calls.seen


def test_recipe_refuses_missing_inputs_and_bad_targets_first(calls: Calls, tmp_path: Path, capsys) -> None:
    _, argv = _recipe(calls, tmp_path)
    for index, flag in ((1, "FP32"), (3, "--data"), (5, "--eval")):  # argv: recipe FP32 --data D --eval E
        missing = [*argv]
        missing[index] = str(tmp_path / "nope")
        assert main(missing) == 2
        assert capsys.readouterr().err == f"error: {flag}: {tmp_path / 'nope'} does not exist\n"
    (tmp_path / "file").write_text("")
    out_dir = [*argv[:-1], str(tmp_path / "file")]
    assert main(out_dir) == 2
    assert capsys.readouterr().err.startswith(f"error: --out-dir {tmp_path / 'file'}: ")
    (tmp_path / "j").mkdir()
    assert main([*argv, "--json", str(tmp_path / "j")]) == 2
    assert capsys.readouterr().err == f"error: --json {tmp_path / 'j'}: is a directory, expected a file\n"
    assert "search_recipe" not in calls.seen and "check_onnxruntime" not in calls.seen


def test_recipe_warns_when_the_evaluation_records_are_the_calibration_records(calls: Calls, tmp_path: Path, capsys):
    _, argv = _recipe(calls, tmp_path)
    same = [*argv]
    same[5] = same[3]
    assert main([*same, "-q"]) == 0
    assert capsys.readouterr().err == (
        f"warning: --eval {tmp_path / 'calib.npz'} is the --data file: the evaluation records are the calibration "
        "records, not held out\n"
    )
    assert calls.one("check_onnxruntime") == ((), {})


# -- compare ------------------------------------------------------------------------------------


def _namespace(**given: Any) -> argparse.Namespace:
    """compare's arguments as its parser gives them when nothing is asked for, then ``given``."""
    from pytest_qaccuracy.commands.compare import CLI_TOLERANCES

    base: dict[str, Any] = {name: None for name in CLI_TOLERANCES}
    base.update(ini=None, tolerance=[], task_metric=[], task_tolerance=[], task_targets=None, name=None)
    return argparse.Namespace(**{**base, **given})


def test_session_config_and_mapping(tmp_path: Path) -> None:
    from pytest_qaccuracy.commands.compare import _mapping, _session_config
    from pytest_qaccuracy.errors import InputError

    assert _session_config([" a.b = 1 ", "c=", "d=x=y"]) == {"a.b": "1", "c": "", "d": "x=y"}
    assert _session_config([]) == {}
    for bad in ("noequals", "=1"):
        with pytest.raises(InputError) as info:
            _session_config(["ok=1", bad])
        assert str(info.value) == f"--session-config expects KEY=VALUE, got {bad!r}"
    assert _mapping(None) is None
    path = tmp_path / "map.json"
    path.write_text('{"a": "a_q", "b": "b_q"}')
    assert _mapping(path) == {"a": "a_q", "b": "b_q"}
    for text in ('["a"]', '{"a": 1}', '{"a": "x", "b": null}'):
        path.write_text(text)
        with pytest.raises(InputError) as info:
            _mapping(path)
        assert str(info.value) == f"{path}: the tensor mapping must be a JSON object of strings {{fp32: quantized}}"
    path.write_text("{nope")
    with pytest.raises(InputError, match=r"cannot read the tensor mapping \(Expecting property name"):
        _mapping(path)
    with pytest.raises(InputError) as info:
        _mapping(tmp_path / "missing.json")
    assert str(info.value).startswith(f"{tmp_path / 'missing.json'}: cannot read the tensor mapping ([Errno 2]")


def test_read_tolerances_flags_ini_rules_and_tasks(tmp_path: Path) -> None:
    from pytest_qaccuracy.commands.compare import read_tolerances
    from pytest_qaccuracy.errors import InputError
    from pytest_qaccuracy.tolerances import Tolerance

    assert read_tolerances(_namespace()) is None
    asked = read_tolerances(_namespace(min_sqnr="20", tolerance=["*::* sqnr>=5"]))
    assert asked.tolerances == {
        "min_cosine": Tolerance("min_cosine", 0.99, "default"),
        "topk": Tolerance("topk", 1, "default"),
        "min_sqnr": Tolerance("min_sqnr", 20.0, "command line --min-sqnr"),
    }
    assert [(r.text, r.position, r.source) for r in asked.rules] == [("*::* sqnr>=5", 0, "command line --tolerance")]
    assert asked.tasks == ()
    ini = tmp_path / "tox.ini"
    ini.write_text("[pytest]\nqaccuracy_min_cosine = 0.5\nqaccuracy_tolerances =\n    * mse<=1\n    * cosine>=0.1\n")
    asked = read_tolerances(_namespace(ini=ini, min_cosine="0.7", tolerance=["a sqnr>=1", "b sqnr>=2"]))
    assert asked.tolerances["min_cosine"] == Tolerance("min_cosine", 0.7, "command line --min-cosine")
    assert [(r.text, r.position) for r in asked.rules] == [
        ("* mse<=1", 0),
        ("* cosine>=0.1", 1),
        ("a sqnr>=1", 2),
        ("b sqnr>=2", 3),
    ]
    asked = read_tolerances(_namespace(ini=ini))
    assert asked.tolerances["min_cosine"].value == 0.5 and "topk" in asked.tolerances
    asked = read_tolerances(_namespace(task_tolerance=["max_drop:cer = 0.01"], task_metric=["ctc"]))
    assert asked.tolerances["max_drop:cer"] == Tolerance("max_drop:cer", 0.01, "command line --task-tolerance")
    assert [spec.path for spec in asked.tasks] == ["ctc"]
    assert read_tolerances(_namespace(task_metric=["ctc"])) is not None
    for bad, message in (
        ({"min_cosine": "high"}, "min_cosine: "),
        ({"task_tolerance": ["cer"]}, "bad task tolerance 'cer'"),
        ({"tolerance": ["nonsense"]}, "nonsense"),
    ):
        with pytest.raises(InputError, match=message):
            read_tolerances(_namespace(**bad))


def test_task_specs_name_where_each_came_from(tmp_path: Path, monkeypatch) -> None:
    from pytest_qaccuracy.commands.compare import _task_specs
    from pytest_qaccuracy.errors import InputError

    monkeypatch.chdir(tmp_path)
    ini = tmp_path / "cfg" / "tox.ini"
    ini.parent.mkdir()
    ini.write_text("[pytest]\nqaccuracy_task_metrics = ctc\n")
    specs = _task_specs(_namespace(ini=ini, task_metric=['{"metric": "binary_f1"}']))
    assert [(s.path, s.folder) for s in specs] == [("ctc", str(ini.parent)), ("binary_f1", str(tmp_path))]
    assert [s.path for s in _task_specs(_namespace(ini=ini, task_metric=["ctc"]))] == ["ctc"]  # once
    with pytest.raises(InputError) as info:
        _task_specs(_namespace(task_metric=["no_such_module:Metric"]))
    assert str(info.value).startswith("--task-metric: ")
    ini.write_text("[pytest]\nqaccuracy_task_metrics = no_such_module:Metric\n")
    with pytest.raises(InputError) as info:
        _task_specs(_namespace(ini=ini))
    assert str(info.value).startswith(f"{ini}: qaccuracy_task_metrics: ")
    assert _task_specs(_namespace()) == ()


def test_output_stats_only_when_a_tolerance_needs_the_outputs(calls: Calls) -> None:
    import pytest_qaccuracy.analysis.outputs as outputs
    from pytest_qaccuracy.commands.compare import Asked, _output_stats
    from pytest_qaccuracy.tolerances import Tolerance

    calls.replace(outputs, "measure_outputs", "STATS")
    args = _namespace(data=Path("d.npz"), backend="integer", scheme="tflite")
    plain = {"min_cosine": Tolerance("min_cosine", 0.99, "default"), "topk": Tolerance("topk", 1, "default")}
    assert _output_stats(args, "PAIR", Asked(plain, []), "OPTIONS") is None
    assert "measure_outputs" not in calls.seen
    tolerances = {
        **plain,
        "topk": Tolerance("topk", 5, "x"),
        "rtol": Tolerance("rtol", 0.1, "x"),
        "atol": Tolerance("atol", 0.2, "x"),
    }
    assert _output_stats(args, "PAIR", Asked(tolerances, []), "OPTIONS") == "STATS"
    expected_args = ("PAIR", Path("d.npz"), [1, 5], None, 0.1, 0.2, "OPTIONS", "integer", "tflite")
    assert calls.one("measure_outputs") == (expected_args, {"tasks": (), "targets": None, "keep_task_errors": True})
    for name in ("rtol", "atol", "min_top1_agreement", "max_top1_drop"):
        calls.seen.clear()
        assert _output_stats(args, "P", Asked({**plain, name: Tolerance(name, 0.5, "x")}, []), "O") == "STATS"
        args_seen = calls.one("measure_outputs")[0]
        assert args_seen[2] == [1] and args_seen[4:6] == (
            0.5 if name == "rtol" else None,
            0.5 if name == "atol" else None,
        )
    calls.seen.clear()
    assert _output_stats(args, "P", Asked({}, [], tasks=("T",)), "O") == "STATS"
    assert calls.one("measure_outputs")[0][2] == [1] and calls.one("measure_outputs")[1]["tasks"] == ("T",)


def _result(**fields: Any) -> Any:
    from pytest_qaccuracy.analysis.results import ComparisonResult, LayerResult, OutputResult

    base = {
        "fp32_model": "net.onnx",
        "quantized_model": "net.q.onnx",
        "data": "d.npz",
        "records": 3,
        "metric_definitions": {"mse": "", "sqnr": "", "cosine": ""},
        "higher_is_better": {"mse": False, "sqnr": True, "cosine": True},
        "outputs": [OutputResult("y", {"mse": 0.5, "sqnr": 30.0, "cosine": 0.999})],
        "layers": [LayerResult("a", "a_q", "n", "Conv", 0, {"mse": 0.1, "sqnr": 40.0})],
    }
    return ComparisonResult(**{**base, **fields})


def _compare(calls: Calls, result: Any) -> None:
    import pytest_qaccuracy.analysis.compare as compare
    import pytest_qaccuracy.model as model
    import pytest_qaccuracy.report.artifacts as artifacts

    calls.replace(compare, "compare", result)
    calls.replace(model, "ModelPair", lambda fp32, q, mapping=None: SimpleNamespace(fp32="FP32", mapping=mapping))
    calls.replace(artifacts, "write_comparison_artifacts", None)


def test_compare_passes_every_option(calls: Calls, tmp_path: Path, capsys) -> None:
    _compare(calls, _result(reduction="numpy (fallback: too many outputs)"))
    mapping = tmp_path / "map.json"
    mapping.write_text('{"a": "a_q"}')
    argv = [
        "compare", "net.onnx", "net.q.onnx", "--data", "d.npz", "--metrics", "mse,sqnr", "--backend", "integer",
        "--scheme", "tflite", "--capture", "reference", "--optimization", "basic", "--threads", "2", "--batch-size",
        "4", "--session-config", "a=1", "--session-config", "b=2", "--map", str(mapping), "--allow-nonfinite",
        "--outputs-only", "--rank-by", "mse", "--top", "1", "--out-dir", str(tmp_path / "o"),
    ]  # fmt: skip
    assert main(argv) == 0  # nothing asked for: nothing to fail
    assert calls.one("ModelPair")[0] == (Path("net.onnx"), Path("net.q.onnx"))
    args, kwargs = calls.one("compare")
    options = RuntimeOptions(
        providers=("CPUExecutionProvider",), optimization="basic", threads=2, batch_size=4,
        session_config={"a": "1", "b": "2"},
    )  # fmt: skip
    assert args[0].mapping == {"a": "a_q"} and args[1] == Path("d.npz")
    assert kwargs == {
        "metrics": "mse,sqnr", "options": options, "capture": "reference", "layers": False, "allow_nonfinite": True,
        "backend": "integer", "scheme": "tflite",
    }  # fmt: skip
    written_args, written_kwargs = calls.one("write_comparison_artifacts")
    assert written_args[1] == "FP32"
    assert written_kwargs == {"json_path": None, "out_dir": tmp_path / "o", "checks": None}
    out = capsys.readouterr().out
    assert "Worst 1 of 1 layers by mse (highest first)" in out
    assert "note: layer sums computed in numpy (fallback: too many outputs)\n" in out
    assert out.endswith(f"wrote 3 visq.json and DOT files, and report.html, to {tmp_path / 'o'}\n")


def test_compare_ranks_by_sqnr_by_default_and_refuses_an_unknown_rank(calls: Calls, capsys) -> None:
    _compare(calls, _result())
    assert main(["compare", "net.onnx", "net.q.onnx", "--data", "d.npz"]) == 0
    out = capsys.readouterr().out
    assert "Worst 1 of 1 layers by sqnr (lowest first)" in out and "note:" not in out and "wrote" not in out
    assert calls.one("compare")[1]["options"] == RuntimeOptions(optimization="all")
    assert calls.one("compare")[1]["layers"] is True and calls.one("compare")[1]["scheme"] is None
    assert main(["compare", "net.onnx", "net.q.onnx", "--data", "d.npz", "--rank-by", "lsb"]) == 2
    assert capsys.readouterr().err == "error: --rank-by lsb: not among the measured metrics mse, sqnr, cosine\n"
    calls.seen.clear()
    _compare(calls, _result(metric_definitions={"mse": ""}, reduction="onnxruntime"))
    assert main(["compare", "net.onnx", "net.q.onnx", "--data", "d.npz", "--json", "r.json"]) == 0
    out = capsys.readouterr().out
    assert "layers by mse (highest first)" in out and "note:" not in out and out.endswith("wrote r.json\n")
    assert main(["compare", "net.onnx", "net.q.onnx", "--data", "d.npz", "--scheme", "tflite"]) == 2
    assert capsys.readouterr().err == "error: --scheme applies to --backend integer only\n"


def test_compare_gates_on_what_is_asked(calls: Calls, capsys) -> None:
    _compare(calls, _result())
    base = ["compare", "net.onnx", "net.q.onnx", "--data", "d.npz", "--name", "mine"]
    assert main([*base, "--min-sqnr", "20"]) == 0  # 30 dB output
    checks = calls.seen["write_comparison_artifacts"][0][1]["checks"]
    assert [(c["check"], c["passed"]) for c in checks] == [("min_cosine", True), ("min_sqnr", True)]
    capsys.readouterr()
    assert main([*base, "--min-sqnr", "35"]) == 1
    out = capsys.readouterr().out
    assert "mine: FAILED" in out
    assert main([*base, "--tolerance", "mine::* sqnr>=45"]) == 1
    assert main([*base, "--tolerance", "other::* sqnr>=45"]) == 0  # another pair's rule


# -- cli.py and the shared options --------------------------------------------------------------


def test_help_formatter_says_a_default_only_when_there_is_one() -> None:
    from pytest_qaccuracy.commands._options import HelpFormatter

    formatter = HelpFormatter("prog")

    def shown(default: Any, help: str | None = "text", flags: tuple[str, ...] = ("--x",)) -> str | None:
        action = argparse.Action(list(flags), "x", default=default, help=help)
        return formatter._get_help_string(action)

    for unset in (None, False, argparse.SUPPRESS, [], ""):
        assert shown(unset) == "text", unset
    assert shown(0) == "text (default: %(default)s)"  # 0 is a default worth saying
    assert shown(5) == "text (default: %(default)s)" and shown(5, help=None) == " (default: %(default)s)"
    assert shown(("a", "b")) == "text (default: a,b)" and shown(["c"]) == "text (default: c)"
    assert shown(5, help="text (default: five)") == "text (default: five)"
    assert shown(5, flags=()) == "text"  # a positional argument
    assert shown(None, help=None) == ""


def test_shared_options() -> None:
    from pytest_qaccuracy.commands._options import check_counts, names, providers, task_spec
    from pytest_qaccuracy.errors import InputError

    assert names(" a, b,,c ,") == ("a", "b", "c") and names("") == ()
    assert task_spec("pkg.mod:Metric") == "pkg.mod:Metric"
    assert task_spec(' {"metric": "ctc", "blank": 0}') == {"metric": "ctc", "blank": 0}
    with pytest.raises(InputError) as info:
        task_spec("{metric")
    assert (
        str(info.value)
        == "--task-metric '{metric': not a JSON table (Expecting property name enclosed in double quotes)"
    )
    check_counts(argparse.Namespace(batch_size=1, threads=0, top=0))
    check_counts(argparse.Namespace())
    for flag, value, minimum in (("batch_size", 0, 1), ("threads", -1, 0), ("top", -1, 0)):
        with pytest.raises(InputError) as info:
            check_counts(argparse.Namespace(**{flag: value}))
        assert str(info.value) == f"--{flag.replace('_', '-')} must be >= {minimum}, got {value}"
    assert providers(argparse.Namespace(providers="CPUExecutionProvider")) == ("CPUExecutionProvider",)
    with pytest.raises(InputError, match=r"^--providers: give at least one execution provider$"):
        providers(argparse.Namespace(providers=" , "))
    with pytest.raises(
        InputError, match=r"^--providers: Nope, Other not available \(available: .*CPUExecutionProvider"
    ):
        providers(argparse.Namespace(providers="Nope,CPUExecutionProvider,Other"))


def test_main_turns_errors_into_one_line(monkeypatch, capsys) -> None:
    import pytest_qaccuracy.commands.report as report
    from pytest_qaccuracy.errors import ModelError

    def raising(exc: BaseException):
        def run(args: argparse.Namespace) -> int:
            raise exc

        return run

    cases = [
        (ModelError("bad\x1bmodel"), "error: bad\\x1bmodel\n"),
        (FileNotFoundError(2, "No such file or directory", "/x/y"), "error: /x/y: No such file or directory\n"),
        (OSError(28, "No space left on device"), "error: No space left on device\n"),
        (OSError("plain"), "error: plain\n"),
    ]
    for exc, line in cases:
        monkeypatch.setattr(report, "run", raising(exc))
        assert main(["report", "somewhere"]) == 2
        assert capsys.readouterr().err == line
    monkeypatch.setattr(report, "run", lambda args: 3)
    assert main(["report", "somewhere"]) == 3


def test_main_passes_quiet_to_the_progress(monkeypatch) -> None:
    import pytest_qaccuracy.data.progress as progress

    seen = []
    monkeypatch.setattr(progress, "progress_for", lambda stream, quiet=False: seen.append(quiet))
    monkeypatch.setattr("pytest_qaccuracy.commands.calibrate.run", lambda args: 0)
    assert main(["calibrate", "f.onnx", "--data", "d", "--out", "q.onnx", "-q"]) == 0
    assert main(["calibrate", "f.onnx", "--data", "d", "--out", "q.onnx"]) == 0
    assert main(["report", "somewhere", "--out", "x.html"]) == 2  # a command without --quiet
    assert seen == [True, False, False]


def test_version_falls_back_to_the_package(monkeypatch) -> None:
    from importlib import metadata

    import pytest_qaccuracy
    from pytest_qaccuracy.cli import _version

    monkeypatch.setattr(pytest_qaccuracy, "__version__", "0.0.0+package")
    assert _version() == metadata.version("pytest-qaccuracy") != "0.0.0+package"  # the distribution's first

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert _version() == "0.0.0+package"


def test_the_parser_lists_every_command_in_order_and_exits_2_on_bad_usage(capsys) -> None:
    from pytest_qaccuracy.cli import COMMANDS, EXIT_USAGE, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == list(COMMANDS)
    assert parser.prog == "qaccuracy" and not parser.allow_abbrev
    assert all(not p.allow_abbrev for p in sub.choices.values())
    for name, command in sub.choices.items():
        module = __import__(f"pytest_qaccuracy.commands.{name}", fromlist=["run"])
        assert command.get_default("_run") is module.run and command.description == module.HELP
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["nope"])
    assert info.value.code == EXIT_USAGE == 2
    assert capsys.readouterr().err.startswith("error: qaccuracy: argument command: invalid choice: 'nope'")
    with pytest.raises(SystemExit):
        parser.parse_args([])
    assert capsys.readouterr().err == "error: qaccuracy: the following arguments are required: command\n"


def test_calibrate_reads_the_fp32_model_for_its_opset_note(calls: Calls, tmp_path: Path) -> None:
    p = _calibrate(calls, tmp_path)
    assert main(["calibrate", str(p["fp32"]), "--data", str(p["data"]), "--out", str(p["out"])]) == 0
    assert calls.one("load_model") == ((p["fp32"],), {})


def test_saturation_keeps_names_that_look_like_numbers(calls: Calls, capsys) -> None:
    import pytest_qaccuracy.analysis.saturation as saturation

    _saturation(calls, (_layer("007", 10, 1),), {})
    calls.replace(saturation, "check_remedies", [saturation.RemedyResult("r", "h", None, {}, note="1e3")])
    assert main(["saturation", "m.onnx", "--data", "d.npz"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert _cells(lines[3])[0] == "007" and _cells(lines[-1]) == ["r", "h", "-", "1e3"]
    assert lines[3].startswith("007  ")  # text, left-aligned: not a number right-aligned


def test_task_specs_errors_of_the_ini_file_and_of_two_metrics(tmp_path: Path) -> None:
    from pytest_qaccuracy.commands.compare import _task_specs
    from pytest_qaccuracy.errors import InputError
    from pytest_qaccuracy.tolerances import ini_task_metrics

    missing = tmp_path / "missing.ini"
    with pytest.raises(ValueError) as direct:
        ini_task_metrics(missing)
    with pytest.raises(InputError) as info:
        _task_specs(_namespace(ini=missing))
    assert str(info.value) == str(direct.value) and str(missing) in str(info.value)
    with pytest.raises(InputError) as info:
        _task_specs(_namespace(task_metric=["ctc", '{"metric": "ctc", "blank": 1}']))
    assert str(info.value).startswith("task metrics: task metrics 'ctc' and ")


def test_output_stats_reads_task_targets_for_the_records(calls: Calls, monkeypatch) -> None:
    import contextlib

    import pytest_qaccuracy.analysis.outputs as outputs
    import pytest_qaccuracy.data as data
    import pytest_qaccuracy.data.targets as targets
    from pytest_qaccuracy.commands.compare import Asked, _output_stats
    from pytest_qaccuracy.tolerances import Tolerance

    calls.replace(outputs, "measure_outputs", "STATS")
    calls.replace(targets, "read_sidecar", ["t0", "t1", "t2"])
    monkeypatch.setattr(data, "load_dataset", lambda path: contextlib.nullcontext([path] * (3 if path else 0)))
    args = _namespace(data=Path("d.npz"), backend="onnxruntime", scheme=None, task_targets=Path("t.jsonl"))
    assert _output_stats(args, "P", Asked({}, [], tasks=("T",)), "O") == "STATS"
    assert calls.one("read_sidecar") == ((Path("t.jsonl"), 3), {})
    assert calls.one("measure_outputs")[1] == {"tasks": ("T",), "targets": ["t0", "t1", "t2"], "keep_task_errors": True}
    calls.seen.clear()
    assert _output_stats(args, "P", Asked({"topk": Tolerance("topk", 0, "x")}, [], tasks=("T",)), "O") == "STATS"
    assert calls.one("measure_outputs")[0][2] == [1]  # a top-k of 0 counts as 1


def test_sensitivity_writes_its_files_where_asked(calls: Calls, tmp_path: Path) -> None:
    s = _sensitivity(calls, tmp_path)
    out_dir, json_path = tmp_path / "o", tmp_path / "r.json"
    assert main([*s["argv"], "--out-dir", str(out_dir), "--json", str(json_path)]) == 0
    assert calls.one("write_sensitivity_artifacts")[0] == ("net.q", out_dir, json_path)


def test_recipe_keeps_the_log_alive_with_its_heartbeat_unless_quiet(calls: Calls, tmp_path: Path, monkeypatch) -> None:
    import pytest_qaccuracy.data.progress as progress
    import pytest_qaccuracy.report.recipe_tables as tables

    beats: list[Any] = []

    class Beat:
        def __init__(self, write: Any, label: str) -> None:
            self.write, self.label, self.entered = write, label, 0
            beats.append(self)

        def say(self, text: str) -> None:
            self.write(f"[{self.label}] {text}")

        def __enter__(self) -> Beat:
            self.entered += 1
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr(progress, "Heartbeat", Beat)
    result, argv = _recipe(calls, tmp_path)
    calls.replace(tables, "step_line", lambda step, best, checks: f"{step} {best} {len(checks)} checks")
    calls.replace(tables, "steps_table", lambda r: "STEPS" * (r is result))
    calls.replace(tables, "verdict_lines", lambda r: ["met"] * (r is result))
    assert main([*argv, "--target", "sqnr>=20"]) == 0
    assert [(b.label, b.entered) for b in beats] == [("recipe", 1)]
    assert main([*argv, "-q"]) == 0
    assert [(b.label, b.entered) for b in beats] == [("recipe", 1), ("recipe", 0)]


def test_recipe_prints_the_steps_and_the_verdict_of_its_result(calls: Calls, tmp_path: Path, capsys) -> None:
    import pytest_qaccuracy.report.recipe_tables as tables

    result, argv = _recipe(calls, tmp_path)
    calls.replace(tables, "step_line", lambda step, best, checks: f"{step} {best} {len(checks)} checks")
    calls.replace(tables, "steps_table", lambda r: "STEPS" * (r is result))
    calls.replace(tables, "verdict_lines", lambda r: ["met"] * (r is result))
    assert main([*argv, "--target", "sqnr>=20"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("STEPS\n\nmet\n") and "STEP BEST-SO-FAR 2 checks" in err


def _stats(**fields: Any) -> Any:
    class Value:
        def __init__(self, name: str) -> None:
            self.name = name

        def to_dict(self) -> dict[str, Any]:
            return {"value": self.name}

    return SimpleNamespace(topk=fields.get("topk", {}), task={k: Value(k) for k in fields.get("task", ())})


def test_record_is_the_plugins_pair_record(calls: Calls) -> None:
    import pytest_qaccuracy.analysis.checks as checks
    import pytest_qaccuracy.commands.compare as compare
    from pytest_qaccuracy.outcomes import Outcome

    outcome = Outcome(
        kind="tolerance", check="min_sqnr", scope="output", subject="output 'y'", metric="sqnr", op=">=",
        threshold=20.0, value=30.0, passed=True, source="default", detail="",
    )  # fmt: skip
    stats = _stats(topk={"y": {"k": {}}}, task=("cer",))
    calls.replace(compare, "_output_stats", stats)
    calls.replace(checks, "evaluate", [outcome])
    result = _result(scheme="tflite")
    args = _namespace(backend="integer", quantized=Path("dir/net.q.onnx"))
    asked = compare.Asked({}, [])
    record = compare._record(args, "PAIR", result, asked, "OPTIONS")
    assert record == {
        "id": "net.q",
        "comparison": result.to_dict(),
        "checks": [{**outcome.to_dict(), "xfail": None}],
        "topk": {"y": {"k": {}}},
        "task": {"cer": {"value": "cer"}},
        "backend": "integer",
        "scheme": "tflite",
    }
    assert calls.one("_output_stats") == ((args, "PAIR", asked, "OPTIONS"), {})
    assert calls.one("evaluate") == ((result, stats, {}, [], "net.q"), {"whole": True})
    args = _namespace(backend="onnxruntime", quantized=Path("q.onnx"), name="mine")
    calls.replace(compare, "_output_stats", None)
    record = compare._record(args, "PAIR", _result(), asked, "OPTIONS")
    assert (record["id"], record["topk"], record["task"], record["scheme"]) == ("mine", {}, {}, "onnxruntime")
    assert calls.seen["evaluate"][1][0][1] is None
    record = compare._record(args, "PAIR", _result(), None, "OPTIONS")  # nothing asked: nothing checked
    assert (record["checks"], record["topk"], record["task"]) == ([], {}, {})


def test_compare_summary_says_where_the_rest_is(calls: Calls, tmp_path: Path, capsys, monkeypatch) -> None:
    import pytest_qaccuracy.commands.compare as compare
    import pytest_qaccuracy.report.artifacts as artifacts
    from pytest_qaccuracy.analysis.results import LayerResult

    layers = [LayerResult(f"l{i}", f"l{i}_q", f"n{i}", "Conv", i, {"mse": 0.1, "sqnr": 40.0}) for i in range(6)]
    _compare(calls, _result(layers=layers))
    calls.replace(artifacts, "check_artifact_targets", None)
    topk = {f"o{i}": {"counted": "per position", "units": 9, "records": 3} for i in range(4)}
    calls.replace(compare, "_output_stats", _stats(topk=topk))
    rules = ["--tolerance=net.q::* sqnr>=50"]
    base = ["compare", "net.onnx", "net.q.onnx", "--data", "d.npz", "--metrics", "mse,sqnr,cosine"]
    assert main([*base, *rules]) == 1
    out = capsys.readouterr().out
    table, summary_text = out.split("\n\n", 1)[0], out
    assert table.startswith("net.q.onnx vs net.onnx on d.npz (3 records)")
    assert "\n\nnet.q: FAILED (net.q.onnx vs net.onnx on d.npz, 3 records)\n" in summary_text
    assert "    and 1 more (--json)\n" in out  # six failed layers, five shown
    assert out.count("top-k on output 'o") == 4  # every warning, not the first three
    assert out.endswith("0 / 1 pairs passed\n")
    assert calls.one("check_artifact_targets") == ((None, None, "net.q", ["mse", "sqnr", "cosine"]), {})
    args = calls.one("_output_stats")[0]
    assert args[1].fp32 == "FP32" and args[3] == RuntimeOptions()
    assert main([*base, *rules, "--json", str(tmp_path / "r.json"), "--out-dir", str(tmp_path / "o")]) == 1
    assert "    and 1 more (--json, --out-dir)\n" in capsys.readouterr().out
    assert calls.seen["check_artifact_targets"][1][0][:2] == (tmp_path / "r.json", tmp_path / "o")
    assert main([*base, "--batch-size", "0"]) == 2
    assert capsys.readouterr().err == "error: --batch-size must be >= 1, got 0\n"


def test_the_parser_describes_the_command_and_its_exit_codes() -> None:
    from pytest_qaccuracy.cli import EPILOG, build_parser

    parser = build_parser()
    assert parser.description == "Quantization accuracy checks for ONNX model pairs." and parser.epilog == EPILOG
    assert "130 interrupted" in parser.format_help().replace("\n", " ")


def test_main_draws_progress_on_stderr(monkeypatch) -> None:
    import sys

    import pytest_qaccuracy.data.progress as progress

    seen = []
    monkeypatch.setattr(progress, "progress_for", lambda stream, quiet=False: seen.append(stream))
    monkeypatch.setattr("pytest_qaccuracy.commands.report.run", lambda args: 0)
    assert main(["report", "somewhere"]) == 0
    assert seen == [sys.stderr]


# -- the help every command prints ------------------------------------------------------------------

#: Every command's ``--help`` at 100 columns, as users read it. A change to an option's name, default,
#: choices or text shows here; after a deliberate one, rewrite the file with
#: ``QACCURACY_UPDATE_CLI_HELP=1 pytest tests/test_command_plumbing.py -k help_text``.
CLI_HELP = Path(__file__).parent / "cli_help.txt"


def _help_text() -> str:
    from pytest_qaccuracy.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parts = [f"== qaccuracy --help\n{parser.format_help()}"]
    parts += [f"== qaccuracy {name} --help\n{command.format_help()}" for name, command in sub.choices.items()]
    return "\n".join(parts)


@pytest.mark.skipif(
    __import__("sys").version_info[:2] != (3, 11),
    reason="argparse words its help differently on other Pythons (3.10: 'optional arguments'); written on 3.11",
)
def test_help_text_of_every_command(monkeypatch) -> None:
    import os

    monkeypatch.setenv("COLUMNS", "100")
    text = _help_text()
    if os.environ.get("QACCURACY_UPDATE_CLI_HELP") == "1":
        CLI_HELP.write_text(text, encoding="utf-8")
    assert text == CLI_HELP.read_text(encoding="utf-8")


def test_compare_parses_every_option_to_its_type() -> None:
    from pytest_qaccuracy.cli import build_parser

    argv = [
        "compare", "a.onnx", "b.onnx", "--data", "d.npz", "--ini", "tox.ini", "--tolerance", "* mse<=1",
        "--tolerance", "* sqnr>=2", "--task-metric", "ctc", "--task-metric", "m:C", "--task-tolerance", "min:a = 1",
        "--task-tolerance", "min:b = 2", "--task-targets", "t.jsonl", "--session-config", "a=1",
        "--session-config", "b=2", "--map", "m.json", "--min-sqnr", "3",
    ]  # fmt: skip
    args = vars(build_parser().parse_args(argv))
    assert (args["fp32"], args["quantized"], args["data"]) == (Path("a.onnx"), Path("b.onnx"), Path("d.npz"))
    assert all(isinstance(args[k], Path) for k in ("fp32", "quantized", "data", "ini", "task_targets", "map"))
    assert (args["ini"], args["task_targets"], args["map"]) == (Path("tox.ini"), Path("t.jsonl"), Path("m.json"))
    assert args["tolerance"] == ["* mse<=1", "* sqnr>=2"] and args["task_metric"] == ["ctc", "m:C"]
    assert args["task_tolerance"] == ["min:a = 1", "min:b = 2"] and args["session_config"] == ["a=1", "b=2"]
    assert args["min_sqnr"] == "3" and args["min_cosine"] is None
    bare = vars(build_parser().parse_args(["compare", "a.onnx", "b.onnx", "--data", "d.npz"]))
    assert (bare["tolerance"], bare["task_metric"], bare["task_tolerance"], bare["session_config"]) == ([], [], [], [])
    assert (bare["metrics"], bare["rank_by"], bare["name"], bare["ini"], bare["map"]) == (None,) * 5
    assert (bare["backend"], bare["capture"], bare["optimization"], bare["top"]) == (
        "onnxruntime",
        "deployed",
        "all",
        10,
    )
    report = vars(build_parser().parse_args(["report", "dir", "--out", "o.html"]))
    assert report == {"command": "report", "dir": Path("dir"), "out": Path("o.html"), "title": None, "force": False,
                      "_run": report["_run"]}  # fmt: skip
    saturation = vars(build_parser().parse_args(["saturation", "m.onnx", "--data", "d.npz", "--json", "s.json"]))
    assert (saturation["model"], saturation["json"], saturation["preset"]) == (
        Path("m.onnx"),
        Path("s.json"),
        "onnxruntime-avx2",
    )
    assert saturation["max_saturated"] is None and isinstance(saturation["model"], Path)
