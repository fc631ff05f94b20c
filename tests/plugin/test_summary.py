"""The summary renderer and summary.json helpers, on hand-made records (no session)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from pytest_qaccuracy.analysis.results import ComparisonResult, LayerResult, OutputResult
from pytest_qaccuracy.cli import main
from pytest_qaccuracy.plugin.artifacts import write_artifacts
from pytest_qaccuracy.report.summary import summary_document, summary_lines


def _record(passed: bool) -> dict:
    check = {
        "test": "t::a",
        "index": 0,
        "kind": "tolerance",
        "check": "min_cosine",
        "scope": "output",
        "subject": "output 'y'",
        "target": "output 'y'",
        "metric": "cosine",
        "op": ">=",
        "threshold": 0.99,
        "value": 0.999 if passed else 0.5,
        "passed": passed,
        "source": "default",
        "detail": "...",
    }
    layer_check = {
        **check,
        "kind": "rule",
        "check": "*::b sqnr>=20",
        "scope": "layer",
        "subject": "layer 'b' (Relu)",
        "target": "layer 'b' (Relu)",
        "metric": "sqnr",
        "threshold": 20.0,
        "value": 3.0,
        "passed": False,
        "detail": "sqnr 3 dB < 20 dB for layer 'b' (Relu)",
    }
    layers = [
        {"tensor": "a", "op_type": "Conv", "metrics": {"sqnr": 40.0, "cosine": 0.99}},
        {"tensor": "b", "op_type": "Relu", "metrics": {"sqnr": 3.0, "cosine": 0.5}},
        {"tensor": "c", "op_type": "Gemm", "metrics": {"sqnr": None, "cosine": None}},
    ]
    comparison = {
        "fp32_model": "m.onnx",
        "quantized_model": "m.q.onnx",
        "data": "d.npz",
        "records": 4,
        "metric_definitions": {"sqnr": "", "cosine": ""},
        "higher_is_better": {"sqnr": True, "cosine": True},
        "outputs": [{"name": "y", "metrics": {"cosine": check["value"], "sqnr": 12.5}}],
        "layers": layers,
    }
    checks = [check] if passed else [check, layer_check]
    return {
        "id": "p",
        "key": "p|m",
        "comparison": comparison,
        "topk": {},
        "checks": checks,
        "fp32": None,
        "quantized": None,
        "data": None,
    }


def test_summary_lines_block() -> None:
    lines = summary_lines([_record(False)], "out")
    assert lines[0] == "p: FAILED (m.q.onnx vs m.onnx on d.npz, 4 records)"  # quantized vs fp32
    assert lines[1:4] == [
        "",
        "p: FAILED on d.npz",
        "  failed 2 of 2 checks (output tolerances 1, rules 1), worst first:",
    ]
    # sqnr 3 < 20 is 85 % of its bound away, cosine 0.5 < 0.99 49 %: the layer comes first
    assert lines[4:8] == [
        "    layer 'b' (Relu)  sqnr    3 dB  >= 20 dB  [1]",
        "    output 'y'        cosine  0.5   >= 0.99   [1]",
        "    [1] default",
        "  most sensitive layers (sqnr): b (Relu) 3 dB, a (Conv) 40 dB",
    ]
    assert lines[-1] == "0 / 1 pairs passed; artifacts in out"
    assert summary_lines([_record(True)]) == [
        "p: PASSED (m.q.onnx vs m.onnx on d.npz, 4 records)",
        "",
        "1 / 1 pairs passed",
    ]


def _many(index: int, layers: int) -> dict:
    """A failing pair with ``layers`` failed layer rules (sqnr index+1 .. against 30 dB, shuffled), long
    names, and a layer match warning (one layer matched of ten)."""
    record = _record(False)
    rule = record["checks"][1]
    order = [(7 * i) % layers for i in range(layers)]  # a permutation: graph order is not worst first
    record["checks"] = [
        {**rule, "subject": f"layer 'l{i}'", "target": f"layer 'l{i}'", "threshold": 30.0, "value": float(i + 1)}
        for i in order
    ]
    name = "a_rather_long_model_name_" + "x" * 40
    record["comparison"] = {
        **record["comparison"],
        "quantized_model": f"{name}.int8.onnx",
        "fp32_model": f"{name}.onnx",
        "unmatched": {"fp32": [f"t{i}" for i in range(9)]},
        "layers": record["comparison"]["layers"][:1],
    }
    return {**record, "id": f"pair_{index}"}


def test_summary_shape_verdict_first_worst_first_and_how_many_more() -> None:
    from pytest_qaccuracy.report.summary import SHOW_FAILED, SHOW_WARNINGS, WIDTH

    records = [_many(i, 12) for i in range(5)]
    lines = summary_lines(records, "/tmp/" + "a" * 30)
    assert max(len(line) for line in lines) <= WIDTH == 100
    # verdict first: the lines before the first blank one name every pair once, in order (long ones wrap)
    head = lines[: lines.index("")]
    starts = [line for line in head if not line.startswith(" ")]
    assert [line.split(":")[0] for line in starts] == [f"pair_{i}" for i in range(5)]
    assert all(": FAILED (" in line for line in starts)
    assert all(line.startswith("    ") for line in head if line not in starts)  # continuation lines
    block = lines[lines.index("pair_0: FAILED on d.npz") :]
    rows = block[2 : 2 + SHOW_FAILED]
    values = [float(row.split()[3]) for row in rows]  # layer, name, metric, value
    assert values == [1.0, 2.0, 3.0, 4.0, 5.0]  # worst first: the farthest below 30 dB
    assert block[2 + SHOW_FAILED] == f"    and {12 - SHOW_FAILED} more (summary.json, report.html)"
    assert "warnings (5; all in summary.json):" in lines
    start = lines.index("warnings (5; all in summary.json):")
    assert lines[start + 1 : start + 1 + SHOW_WARNINGS] == [
        f"  pair_{i}: only 1 of 10 layers matched: are these the same model?" for i in range(SHOW_WARNINGS)
    ]
    assert lines[start + 1 + SHOW_WARNINGS] == f"  and {5 - SHOW_WARNINGS} more"
    assert lines[-1] == "0 / 5 pairs passed; artifacts in /tmp/" + "a" * 30


def test_summary_document_hashes(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"abc")
    folder = tmp_path / "npy" / "x"
    folder.mkdir(parents=True)
    (folder / "0.npy").write_bytes(b"1")
    (folder / "1.npy").write_bytes(b"22")
    (tmp_path / "npy" / "labels.npy").write_bytes(b"333")
    record = {**_record(True), "fp32": str(model), "quantized": str(model), "data": str(tmp_path / "npy")}
    document = summary_document([record], tmp_path, {"p|m": {"comparison": "pairs/p.json"}})
    pair = document["pairs"][0]
    assert pair["fp32"] == {
        "path": "m.onnx",
        "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    }
    # a folder: each file's path relative to it (posix) and a NUL, then its bytes, files in sorted order
    layout = b"labels.npy\x00" + b"333" + b"x/0.npy\x00" + b"1" + b"x/1.npy\x00" + b"22"
    assert pair["data"] == {"path": "npy", "sha256": hashlib.sha256(layout).hexdigest()}
    assert pair["artifacts"] == {"comparison": "pairs/p.json"} and document["passed"] is True


def _model(path: Path) -> str:
    """An fp32 model with the layers of the comparison below, saved: x -> a (Conv) -> b -> c -> y."""
    chain = [("Conv", "x", "a"), ("Relu", "a", "b"), ("Gemm", "b", "c"), ("Identity", "c", "y")]
    nodes = [helper.make_node(op, [i], [o]) for op, i, o in chain]
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("x", "y")]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", info[:1], info[1:])), path)
    return str(path)


def test_session_files_are_named_as_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``<stem>.comparison.json``, ``<stem>.<metric>.visq.json`` and one ``<stem>.<metric>.dot``
    (sqnr, the metric the report's graph shows); summary.json points at them; a pair whose fp32 model
    no longer loads gets no DOT; ``qaccuracy report`` finds the comparisons and nothing else."""
    layers = [
        LayerResult(tensor, f"{tensor}_q", None, op, i, {"sqnr": sqnr, "cosine": 0.99})
        for i, (tensor, op, sqnr) in enumerate([("a", "Conv", 40.0), ("b", "Relu", 3.0), ("c", "Gemm", 20.0)])
    ]
    outputs = [OutputResult("y", {"sqnr": 12.5, "cosine": 0.999})]
    definitions, higher = {"sqnr": "", "cosine": ""}, {"sqnr": True, "cosine": True}
    result = ComparisonResult("m.onnx", "m.q.onnx", "d.npz", 4, definitions, outputs, layers, higher_is_better=higher)
    comparison = result.to_dict()
    first = {**_record(True), "comparison": comparison, "stem": "p-00000001", "fp32": _model(tmp_path / "m.onnx")}
    second = {**first, "id": "q", "key": "q|m", "stem": "q-00000002", "fp32": str(tmp_path / "gone.onnx")}
    second["comparison"] = {**comparison, "quantized_model": "m.q2.onnx"}
    out = tmp_path / "out"
    write_artifacts(out, [first, second], tmp_path)
    names = {"comparison.json", "cosine.visq.json", "sqnr.visq.json"}
    expected = {f"p-00000001.{n}" for n in {*names, "sqnr.dot"}} | {f"q-00000002.{n}" for n in names}
    assert {p.name for p in (out / "pairs").iterdir()} == expected
    summary = json.loads((out / "summary.json").read_text())
    assert [p["artifacts"] for p in summary["pairs"]] == [
        {
            "comparison": "pairs/p-00000001.comparison.json",
            "visq": {"sqnr": "pairs/p-00000001.sqnr.visq.json", "cosine": "pairs/p-00000001.cosine.visq.json"},
            "dot": "pairs/p-00000001.sqnr.dot",
        },
        {
            "comparison": "pairs/q-00000002.comparison.json",
            "visq": {"sqnr": "pairs/q-00000002.sqnr.visq.json", "cosine": "pairs/q-00000002.cosine.visq.json"},
        },
    ]
    assert json.loads((out / "pairs" / "p-00000001.comparison.json").read_text()) == comparison
    capsys.readouterr()
    assert main(["report", str(out), "--out", str(tmp_path / "rebuilt.html")]) == 0
    read = [line for line in capsys.readouterr().out.splitlines() if line.startswith("read ")]
    stems = ("p-00000001", "q-00000002")
    assert read == [f"read {out / 'pairs' / stem}.comparison.json" for stem in stems]


def test_expected_failures_are_labelled() -> None:
    record = _record(False)
    record["checks"] = [{**c, "xfail": "known bad"} for c in record["checks"]]
    lines = summary_lines([record, _record(True)])
    assert lines[0] == "p: XFAIL (m.q.onnx vs m.onnx on d.npz, 4 records)"
    assert "p: XFAIL on d.npz, expected to fail: known bad" in lines
    assert lines[-1] == "1 / 2 pairs passed, 1 failed as expected"
    # pytest failed a test that passed against a strict xfail: so does the pair
    strict = {**_record(True), "tests": {"t::a": "xpassed-strict"}}
    assert summary_lines([strict])[0].startswith("p: FAILED (")
    assert "p: FAILED on d.npz, passed, but t::a is marked xfail(strict=True)" in summary_lines([strict])


def test_an_element_wise_check_shows_the_tolerances_set_not_a_zero() -> None:
    """rtol/atol count the share of elements outside atol + rtol*|fp32| (which must be 0): the terminal
    and the report show the numbers the user set."""
    from pytest_qaccuracy.analysis.checks import evaluate
    from pytest_qaccuracy.analysis.outputs import OutputStats, RelativeStats
    from pytest_qaccuracy.report.verdicts import check_row
    from pytest_qaccuracy.tolerances import Tolerance

    result = ComparisonResult("m.onnx", "m.q.onnx", "d.npz", 4, {"sqnr": ""}, [OutputResult("y", {"sqnr": 9.0})], [])
    rel = RelativeStats(rtol=0.01, atol=0.001, violations=3, elements=12, max_abs=0.5, max_rel=0.25)
    tolerances = {"rtol": Tolerance("rtol", 0.01, "marker"), "atol": Tolerance("atol", 0.001, "ini")}
    (outcome,) = evaluate(result, OutputStats(topk={}, relative={"y": rel}), tolerances, [], "p")
    record = {**_record(True), "checks": [{**outcome.to_dict(), "test": "t::a", "index": 0, "xfail": None}]}
    lines = summary_lines([record])
    assert "    output 'y'  relative  0.25  rtol 0.01, atol 0.001  [1]" in lines
    assert check_row(record["checks"][0])["tolerance"] == "rtol 0.01, atol 0.001"
