"""The terminal summary, summary.json, the report's verdict views and the comparison tables, piece by
piece, on hand-made pair records: each expected line written out by hand."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_qaccuracy.report import summary, tables, verdicts
from pytest_qaccuracy.report.summary import SummaryLine


def check(**fields: Any) -> dict[str, Any]:
    """A failed min_cosine output check unless ``fields`` say otherwise."""
    base = {
        "kind": "tolerance",
        "check": "min_cosine",
        "scope": "output",
        "subject": "output 'y'",
        "target": "output 'y'",
        "metric": "cosine",
        "op": ">=",
        "threshold": 0.99,
        "value": 0.5,
        "passed": False,
        "source": "default",
        "detail": "cosine 0.5 < 0.99",
    }
    return {**base, **fields}


def record(checks: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    comparison = {
        "fp32_model": "dir/m.onnx",
        "quantized_model": "dir/m.q.onnx",
        "data": "data/d.npz",
        "records": 4,
        "metric_definitions": {"cosine": "", "sqnr": ""},
        "higher_is_better": {"sqnr": True, "cosine": True},
        "outputs": [{"name": "y", "metrics": {"cosine": 0.5, "sqnr": 12.5}}],
        "layers": [],
    }
    return {
        "id": "p",
        "key": "p|k",
        "comparison": {**comparison, **fields.pop("comparison", {})},
        "checks": checks,
        **fields,
    }


# -- summary.py ------------------------------------------------------------------------------------


def test_status_of_a_record() -> None:
    assert summary.record_status(record([])) == ("unchecked", None)
    assert summary.record_status(record([check(passed=True)])) == ("passed", None)
    assert summary.record_status(record([check()])) == ("failed", None)
    assert summary.record_status(record([check(xfail="known")])) == ("xfailed", "known")
    strict = record([check(passed=True)], tests={"t::a": "xpassed-strict"})
    assert summary.record_status(strict) == ("failed", "passed, but t::a is marked xfail(strict=True)")
    assert summary.record_passed(record([])) and summary.record_passed(record([check(passed=True)]))
    assert not summary.record_passed(record([check()])) and not summary.record_passed(strict)
    assert not summary.record_passed(record([check(xfail="known")]))


def test_a_check_made_twice_is_shown_once_and_a_failure_wins() -> None:
    ok, bad = check(passed=True, value=0.999), check()
    other = check(metric="sqnr", check="min_sqnr")
    elsewhere = check(deployment="tflite", target="output 'y' on tflite")
    shown = summary._shown_checks(record([ok, bad, other, ok, elsewhere]))
    assert [(o.metric, o.passed, o.deployment) for o in shown] == [
        ("cosine", False, None),
        ("sqnr", False, None),
        ("cosine", False, "tflite"),
    ]
    assert [o.passed for o in summary._shown_checks(record([ok, ok]))] == [True]


def test_bound_and_unit() -> None:
    from pytest_qaccuracy.outcomes import Outcome

    def outcome(**fields: Any) -> Outcome:
        return Outcome.from_dict(check(**fields))

    assert summary._bound(outcome()) == ">= 0.99"
    assert summary._bound(outcome(metric="sqnr", threshold=20.0)) == ">= 20 dB"
    assert summary._bound(outcome(threshold=None)) == "-"
    assert summary._bound(outcome(op="", threshold=0.5)) == "0.5"
    assert summary._bound(outcome(params={"rtol": 0.01, "atol": 0.001})) == "rtol 0.01, atol 0.001"
    assert summary._unit("sqnr") == " dB" and summary._unit("cosine") == ""


def test_failed_lines_count_by_kind_align_and_number_the_sources() -> None:
    checks = [
        check(kind="rule", check="* sqnr>=20", scope="layer", subject="layer 'b'", target="layer 'b'",
              metric="sqnr", threshold=20.0, value=3.0, source="rule 1"),
        check(source="ini file tox.ini (qaccuracy_min_cosine)"),
        check(kind="drift", check="sqnr:-1", metric="sqnr", subject="output 'z'", target="output 'z'",
              threshold=10.0, value=None, source="rule 1"),
        check(kind="rule", check="* mse<=1", scope="layer", subject="layer 'longer name'", target="layer 'longer name'",
              metric="mse", op="<=", threshold=1.0, value=1.5, source="rule 2"),
        check(passed=True, metric="sqnr", check="min_sqnr"),
    ]  # fmt: skip
    lines = summary._failed_lines(record(checks), show=3, more_in="summary.json")
    assert lines == [
        "  failed 4 of 5 checks (output tolerances 1, rules 2, baseline drift 1), worst first:",
        "    output 'z'           sqnr  -     >= 10 dB  [1]",  # no value: infinitely far
        "    layer 'b'            sqnr  3 dB  >= 20 dB  [1]",  # 85 % beyond its bound
        "    layer 'longer name'  mse   1.5   <= 1      [2]",  # 50 %
        "    and 1 more (summary.json)",  # output 'y', 49.5 %
        "    [1] rule 1",
        "    [2] rule 2",
    ]
    all_shown = summary._failed_lines(record(checks), show=4, more_in="x")
    assert all_shown[1] == "    output 'z'           sqnr    -     >= 10 dB  [1]"  # columns widen for 'cosine'
    assert all_shown[4] == "    output 'y'           cosine  0.5   >= 0.99   [3]"
    assert all_shown[5:] == ["    [1] rule 1", "    [2] rule 2", "    [3] ini file tox.ini (qaccuracy_min_cosine)"]
    assert summary._failed_lines(record([check(passed=True)]), 5, "x") == []


def test_most_sensitive_layers() -> None:
    layers = [
        {"tensor": "a", "op_type": "Conv", "metrics": {"sqnr": 40.0, "mse": 0.1}},
        {"tensor": "b", "op_type": "Relu", "metrics": {"sqnr": 3.0, "mse": 0.9}},
        {"tensor": "c", "op_type": "Gemm", "metrics": {"sqnr": None, "mse": 0.5}},
        {"tensor": "d", "op_type": "Add", "metrics": {"sqnr": 10.0, "mse": 0.2}},
        {"tensor": "e", "op_type": "Mul", "metrics": {"sqnr": 20.0, "mse": 0.3}},
    ]
    defs = {"mse": "", "sqnr": ""}
    r = record([], comparison={"layers": layers, "metric_definitions": defs})
    assert summary._layer_line(r) == ["  most sensitive layers (sqnr): b (Relu) 3 dB, d (Add) 10 dB, e (Mul) 20 dB"]
    r = record([], comparison={"layers": layers, "metric_definitions": {"mse": ""}, "higher_is_better": {}})
    assert summary._layer_line(r) == ["  most sensitive layers (mse): b (Relu) 0.9, c (Gemm) 0.5, e (Mul) 0.3"]
    r = record([], comparison={"layers": layers, "metric_definitions": {"mse": ""}, "higher_is_better": {"mse": True}})
    assert summary._layer_line(r)[0].endswith("a (Conv) 0.1, d (Add) 0.2, e (Mul) 0.3")
    assert summary._layer_line(record([], comparison={"layers": layers, "metric_definitions": {"lsb": ""}})) == []
    assert summary._layer_line(record([], comparison={"layers": []})) == []


def _target(backend: str, passed: bool, cosine: float, agreement: float | None = None, task: float | None = None):
    entry: dict[str, Any] = {
        "backend": backend,
        "passed": passed,
        "outputs": {"y": {"cosine": cosine, "sqnr": 20.0}},
        "topk": {} if agreement is None else {"y": {"k": {"1": {"agreement": agreement}}}},
    }
    if task is not None:
        entry["task"] = {"cer": {"quantized": task}}
    return entry


def test_target_view() -> None:
    assert summary.target_view(record([])) is None
    targets = {"tflite": _target("integer", False, 0.9, 0.75, 0.1), "here": _target("onnxruntime", True, 0.99)}
    view = summary.target_view(record([], targets=targets))
    assert view == {
        "headers": ["output", "metric", "here (onnxruntime)", "tflite (emulated)"],
        "rows": [
            ["y", "cosine", "0.99", "0.9"],
            ["y", "sqnr", "20", "20"],
            ["y", "top-1 agreement", "-", "0.75"],
            ["task 'cer'", "cer", "-", "0.1"],
            ["", "checks", "pass", "FAIL"],
        ],
        "passed": [True, False],
    }


def test_target_lines_wrap_targets_to_the_width() -> None:
    names = [f"target-number-{i}" for i in range(4)]  # 27 columns each with " (emulated)"
    targets = {n: _target("integer", True, 0.9) for n in names}
    lines = summary._target_lines(record([], targets=targets))
    assert lines[0] == "  deployment targets:"
    assert all(len(line) <= summary.WIDTH for line in lines)
    blocks = "\n".join(lines[1:]).split("\n\n")
    assert len(blocks) == 2  # two targets side by side fit in 100 columns, three do not
    assert [b.count("(emulated)") for b in blocks] == [2, 2]
    assert all(b.splitlines()[0].startswith("    output    metric") for b in blocks)
    one = summary._target_lines(record([], targets={"t": _target("onnxruntime", True, 0.9)}))
    assert one == [
        "  deployment targets:",
        "    output    metric    t (onnxruntime)",
        "    --------  --------  -----------------",
        "    y         cosine    0.9",
        "    y         sqnr      20",
        "              checks    pass",
    ]
    assert summary._target_lines(record([])) == []


def test_task_lines() -> None:
    task = {
        "cer": {"fp32": 0.012, "quantized": 0.031, "drop": 0.019, "metric": "ctc", "against": "targets", "records": 8},
        "acc": {"fp32": 1.0, "quantized": 0.5, "drop": 0.5, "metric": "m", "against": "fp32", "records": 2},
        "boom": {"error": "task metric 'm:Boom' on records 0..7: ValueError"},
    }
    assert summary._task_lines(record([], task=task)) == [
        "  task metric acc: fp32 1 -> quantized 0.5 (drop 0.5; m against the fp32 predictions, 2 records)",
        "  task metric boom: not computed (task metric 'm:Boom' on records 0..7: ValueError)",
        "  task metric cer: fp32 0.012 -> quantized 0.031 (drop 0.019; ctc against the targets, 8 records)",
    ]
    assert summary._task_lines(record([])) == [] and summary._task_lines(record([], task=None)) == []


def test_verdict_line_and_run_label() -> None:
    r = record([check(passed=True)])
    assert summary.verdict_line(r) == SummaryLine("p: PASSED (m.q.onnx vs m.onnx on d.npz, 4 records)", "passed")
    r = record([check()], backend="integer", scheme="tflite")
    assert summary.verdict_line(r) == SummaryLine(
        "p: FAILED (m.q.onnx vs m.onnx on d.npz, 4 records, backend integer, scheme tflite)", "failed"
    )
    assert summary._run_label(record([], backend="onnxruntime", scheme="onnxruntime")) == ""
    assert summary._run_label(record([], scheme="tflite")) == ", backend onnxruntime, scheme tflite"
    assert summary._run_label(record([], backend="integer")) == ", backend integer, scheme onnxruntime"
    long = record([], comparison={"data": "d" * 49 + ".npz"})  # 101 columns
    assert summary.verdict_line(long).text == "p: NO CHECKS (m.q.onnx vs m.onnx, 4 records)"
    fits = record([], comparison={"data": "d" * 48 + ".npz"})  # exactly 100 columns: kept whole
    assert len(summary.verdict_line(fits).text) == 100 and ".npz" in summary.verdict_line(fits).text
    assert summary.verdict_line(record([check(xfail="why")])).status == "xfailed"


def test_pair_warnings_and_counted_lines() -> None:
    channels = {"axis": 1, "scale": 0.5, "min_steps": 0.2, "max_steps": 40.0, "low": "4..21", "flagged": True}
    calm = {**channels, "flagged": False}
    comparison = {
        "layers": [
            {"tensor": "z", "op_type": "Conv", "order": 2, "metrics": {}, "channels": channels},
            {"tensor": "a", "op_type": "Conv", "order": 1, "metrics": {}, "channels": channels},
            {"tensor": "b", "op_type": "Conv", "order": 0, "metrics": {}, "channels": calm},
        ],
        "outputs": [{"name": "y", "metrics": {}, "channels": channels}, {"name": "w", "metrics": {}}],
        "unmatched": {"fp32": ["u1", "u2", "u3", "u4"]},
    }
    topk = {
        "y": {"counted": "per position", "units": 12, "records": 3},
        "x": {"counted": "per record", "units": 3, "records": 3},
        "v": {},
    }
    warnings = summary.pair_warnings(record([], comparison=comparison, topk=topk))
    lost = (
        "span < 1 step (scale 0.5) while others span up to 40: their values are lost; "
        "declare slices or quantize them apart"
    )
    assert warnings == [
        "only 3 of 7 layers matched: are these the same model?",
        f"y channels 4..21 (axis 1) {lost}",
        f"a channels 4..21 (axis 1) {lost}",
        f"z channels 4..21 (axis 1) {lost}",
        "top-k on output 'y' counted per position: 12 decisions in 3 records",
    ]
    assert summary.pair_warnings(record([])) == []


def test_counts() -> None:
    assert summary.counts_text([]) == "0 comparisons, no tolerances checked"
    assert summary.counts_text(["unchecked"]) == "1 comparison, no tolerances checked"
    assert summary.counts_text(["unchecked", "unchecked"]) == "2 comparisons, no tolerances checked"
    assert summary.counts_text(["passed", "failed", "xfailed"]) == "1 / 3 pairs passed, 1 failed as expected"
    assert summary.counts_text(["passed", "unchecked", "unchecked"]) == "1 / 1 pairs passed; 2 without checks"
    assert summary.counts_text(["failed"]) == "0 / 1 pairs passed"
    assert summary.counts_line([record([check()]), record([])]) == "0 / 1 pairs passed; 1 without checks"
    assert (
        verdicts.counts_line([{"status": "passed"}, {"status": "xfailed"}])
        == "1 / 2 pairs passed, 1 failed as expected"
    )


def test_fit_wraps_at_spaces_with_a_deeper_indent() -> None:
    assert summary.fit("  short") == ["  short"]
    assert summary.fit("x" * 100) == ["x" * 100]
    words = "  " + " ".join(["word"] * 30)  # 2 + 149 columns
    lines = summary.fit(words, 40)
    assert lines[0] == "  " + " ".join(["word"] * 7) and lines[1].startswith("      word")
    assert all(len(line) <= 40 for line in lines) and " ".join(x.strip() for x in lines) == words.strip()
    path = "a " + "p" * 50 + " b"
    assert summary.fit(path, 20) == ["a", "    " + "p" * 50, "    b"]  # a long word stays whole
    assert summary.fit("a-b " * 8, 10) == ["a-b a-b", "    a-b", "    a-b", "    a-b", "    a-b", "    a-b", "    a-b"]
    assert summary.fit("tab\there") == ["tab\\there"]


LAYER_L = {"tensor": "l", "op_type": "Relu", "metrics": {"sqnr": 1}}


def test_summary_rows_blocks_warnings_and_statuses() -> None:
    passed = record([check(passed=True)], id="ok")
    failed = record(
        [check(), check(metric="sqnr", check="min_sqnr", threshold=20.0, value=3.0)],
        id="bad",
        comparison={"unmatched": {"fp32": ["u"] * 3}, "layers": [LAYER_L]},
        task={"cer": {"error": "boom"}},
    )  # fmt: skip
    expected = record([check(xfail="known bug")], id="xf")
    rows = summary.summary_rows([passed, failed, expected], sensitivity_top=2, show=1, more_in="here, there")
    texts = [r.text for r in rows]
    assert texts == [
        "ok: PASSED (m.q.onnx vs m.onnx on d.npz, 4 records)",
        "bad: FAILED (m.q.onnx vs m.onnx on d.npz, 4 records)",
        "xf: XFAIL (m.q.onnx vs m.onnx on d.npz, 4 records)",
        "",
        "bad: FAILED on d.npz",
        "  failed 2 of 2 checks (output tolerances 2), worst first:",
        "    output 'y'  sqnr  3 dB  >= 20 dB  [1]",
        "    and 1 more (here, there)",
        "    [1] default",
        "  most sensitive layers (sqnr): l (Relu) 1 dB",
        "  task metric cer: not computed (boom)",
        "",
        "xf: XFAIL on d.npz, expected to fail: known bug",
        "  failed 1 of 1 checks (output tolerances 1), worst first:",
        "    output 'y'  cosine  0.5  >= 0.99  [1]",
        "    [1] default",
        "",
        "warnings (1):",
        "  bad: only 1 of 4 layers matched: are these the same model?",
        "",
        "1 / 3 pairs passed, 1 failed as expected",
    ]
    assert [r.status for r in rows] == [
        "passed", "failed", "xfailed", None, "failed", None, None, None, None, None, None, None, "xfailed",
        None, None, None, None, None, None, None, None,
    ]  # fmt: skip
    many = [
        record(
            [],
            id=f"w{i}",
            comparison={"unmatched": {"fp32": ["u"] * 3}, "layers": [{"tensor": "l", "op_type": "R", "metrics": {}}]},
        )
        for i in range(5)
    ]
    rows = summary.summary_rows(many, artifacts=".qaccuracy", show_warnings=3, more_in="summary.json, report.html")
    texts = [r.text for r in rows]
    assert texts[5:12] == [
        "",
        "warnings (5; all in summary.json):",
        "  w0: only 1 of 4 layers matched: are these the same model?",
        "  w1: only 1 of 4 layers matched: are these the same model?",
        "  w2: only 1 of 4 layers matched: are these the same model?",
        "  and 2 more",
        "",
    ]
    assert texts[-1] == "5 comparisons, no tolerances checked; artifacts in .qaccuracy"
    every = summary.summary_lines(many, show_warnings=None)
    assert every[6] == "warnings (5):" and every[-3] == "  w4: only 1 of 4 layers matched: are these the same model?"


def test_summary_rows_wrap_a_long_line_keeping_its_status_on_the_first() -> None:
    r = record([check(detail="x")], id="p" * 30, comparison={"data": "d.npz"}, task={"c" * 20: {"error": "e " * 60}})
    rows = summary.summary_rows([r])
    wrapped = [row for row in rows if row.text.startswith("      e")]
    assert wrapped and all(row.status is None for row in wrapped)
    assert all(len(row.text) <= 100 for row in rows)
    assert rows[0].status == "failed" and rows[0].text.startswith("p" * 30 + ": FAILED")


def test_file_sha256(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"abc")
    assert summary.file_sha256(tmp_path / "a.bin") == hashlib.sha256(b"abc").hexdigest()
    folder = tmp_path / "f"
    (folder / "sub").mkdir(parents=True)
    (folder / "x").write_bytes(b"1")
    (folder / "sub" / "y").write_bytes(b"22")
    want = hashlib.sha256(b"sub/y\x0022" + b"x\x001").hexdigest()
    assert summary.file_sha256(folder) == want
    assert summary.file_sha256(tmp_path / "missing") is None
    big = tmp_path / "big"
    big.write_bytes(b"z" * ((1 << 20) + 5))
    assert summary.file_sha256(big) == hashlib.sha256(b"z" * ((1 << 20) + 5)).hexdigest()


def test_versions() -> None:
    import platform
    from importlib import metadata

    found = summary.versions()
    assert list(found) == ["python", "pytest-qaccuracy", "onnx", "onnxruntime", "numpy", "pytest"]
    assert found["python"] == platform.python_version() and found["numpy"] == metadata.version("numpy")


def test_versions_of_a_package_that_is_not_installed_are_none(monkeypatch) -> None:
    """The package itself run from a source tree (no installed metadata), say."""
    from importlib import metadata

    installed = metadata.version

    def version(name: str) -> str:
        if name == "pytest-qaccuracy":
            raise metadata.PackageNotFoundError(name)
        return installed(name)

    monkeypatch.setattr(summary.metadata, "version", version)
    found = summary.versions()
    assert found["pytest-qaccuracy"] is None
    assert found["pytest"] == installed("pytest") and found["onnx"] == installed("onnx")


def test_summary_document(tmp_path: Path, monkeypatch) -> None:
    from pytest_qaccuracy.report.completeness import SessionStatus

    (tmp_path / "m.onnx").write_bytes(b"model")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.npz"
    outside.write_bytes(b"data")
    r = record(
        [check(passed=True)], fp32=str(tmp_path / "m.onnx"), quantized=None, data=str(outside),
        topk={"y": {"k": {}}}, backend="integer", scheme="tflite", agreement={"a": 1}, tests={"t": "passed"},
    )  # fmt: skip
    document = summary.summary_document([r], tmp_path, {"p|k": {"html": "r.html"}})
    assert document["schema_version"] == 1 and document["status"] == SessionStatus().status
    assert document["passed"] is True and document["missing"] == SessionStatus().to_dict()
    assert document["created"].endswith("+00:00") and document["versions"] == summary.versions()
    pair = document["pairs"][0]
    assert pair["fp32"] == {"path": "m.onnx", "sha256": hashlib.sha256(b"model").hexdigest()}
    assert pair["data"] == {"path": outside.as_posix(), "sha256": hashlib.sha256(b"data").hexdigest()}
    assert pair["quantized"] is None and pair["labels"] is None
    assert (pair["id"], pair["key"], pair["passed"], pair["status"], pair["reason"]) == (
        "p",
        "p|k",
        True,
        "passed",
        None,
    )
    assert (pair["backend"], pair["scheme"], pair["records"]) == ("integer", "tflite", 4)
    assert pair["outputs"] == {"y": {"cosine": 0.5, "sqnr": 12.5}} and pair["topk"] == {"y": {"k": {}}}
    assert pair["artifacts"] == {"html": "r.html"} and pair["tests"] == {"t": "passed"}
    assert (pair["task"], pair["targets"], pair["agreement"], pair["warnings"]) == ({}, {}, {"a": 1}, [])
    assert pair["checks"] == [check(passed=True)]
    failing = summary.summary_document([record([check()], fp32=None, quantized=None, data=None)], tmp_path, {})
    assert failing["passed"] is False and failing["pairs"][0]["status"] == "failed"
    assert failing["pairs"][0]["backend"] == "onnxruntime" and failing["pairs"][0]["artifacts"] == {}
    interrupted = SessionStatus(status="interrupted", reason="Ctrl-C", not_run=("t::b",))
    document = summary.summary_document([r], tmp_path, {}, interrupted)
    assert (document["passed"], document["status"], document["missing"]) == (
        False,
        "interrupted",
        interrupted.to_dict(),
    )
    assert document["missing"] is not None
    json.dumps(document)


# -- verdicts.py ----------------------------------------------------------------------------------


def test_verdict_view() -> None:
    none = {"status": "unchecked", "label": "NO CHECKS", "detail": "measured only: no tolerances checked", "reason": ""}
    assert verdicts.verdict_view(None) == none and verdicts.verdict_view(record([])) == none
    assert verdicts.verdict_view(record([check(passed=True), check()])) == {
        "status": "failed", "label": "FAILED", "detail": "1 / 2 checks passed", "reason": "",
    }  # fmt: skip
    assert verdicts.verdict_view(record([check(xfail="bug 7"), check(passed=True)])) == {
        "status": "xfailed", "label": "XFAIL", "detail": "1 / 2 checks passed", "reason": "expected to fail: bug 7",
    }  # fmt: skip
    strict = record([check(passed=True)], tests={"t::x": "xpassed-strict"})
    assert verdicts.verdict_view(strict)["reason"] == "passed, but t::x is marked xfail(strict=True)"


def test_check_row_and_rows() -> None:
    row = verdicts.check_row(check(test="t::a", metric="sqnr", threshold=20.0, value=3.0))
    assert row == {
        "test": "t::a", "kind": "tolerance", "scope": "output", "check": "min_cosine", "target": "output 'y'",
        "metric": "sqnr", "value": "3.00 dB", "sort": 3.0, "tolerance": ">= 20.00 dB", "source": "default",
        "status": "FAIL", "message": "cosine 0.5 < 0.99",
    }  # fmt: skip
    bare = {k: v for k, v in check(passed=True, value=None, threshold=None).items() if k not in ("detail", "source")}
    row = verdicts.check_row(bare)
    assert (row["test"], row["value"], row["tolerance"], row["source"], row["message"], row["status"]) == (
        "", "-", "-", "", "", "pass",
    )  # fmt: skip
    assert verdicts.check_row(check(xfail="why"))["status"] == "xfail"
    assert verdicts.check_row(check(op="", threshold=0.5))["tolerance"] == "0.5000"
    assert verdicts.check_row(check(params={"rtol": 0.01, "atol": 0.5}))["tolerance"] == "rtol 0.01, atol 0.5"
    checks = [
        check(passed=True, scope="layer", check="a"),
        check(passed=True, check="b"),
        check(scope="layer", check="c"),
        check(check="d"),
        check(kind="drift", check="e"),
    ]
    assert [r["check"] for r in verdicts.check_rows(record(checks))] == ["d", "c", "b", "a"]
    assert [r["check"] for r in verdicts.drift_rows(record(checks))] == ["e"]
    assert verdicts.check_rows(None) == [] and verdicts.drift_rows(None) == [] and verdicts.check_rows({}) == []


def test_topk_rows() -> None:
    top2 = {"agreement": 0.5, "fp32_accuracy": 0.25, "quantized_accuracy": 1 / 8, "accuracy_drop": 0.125}
    topk = {
        "z": {"k": {"10": {"agreement": 1.0}, "2": top2}, "records": 8, "labelled": 4},
        "a": {"k": {"1": {"agreement": 0.999, "accuracy_drop": -0.01}}},
    }  # fmt: skip
    assert verdicts.topk_rows(record([], topk=topk)) == [
        {"output": "a", "k": "top-1", "agreement": "99.90 %", "fp32_accuracy": "-", "quantized_accuracy": "-",
         "accuracy_drop": "-1.00 pp", "records": "0 (0 labelled)"},
        {"output": "z", "k": "top-2", "agreement": "50.00 %", "fp32_accuracy": "25.00 %",
         "quantized_accuracy": "12.50 %",
         "accuracy_drop": "+12.50 pp", "records": "8 (4 labelled)"},
        {"output": "z", "k": "top-10", "agreement": "100.00 %", "fp32_accuracy": "-", "quantized_accuracy": "-",
         "accuracy_drop": "-", "records": "8 (4 labelled)"},
    ]  # fmt: skip
    assert verdicts.topk_rows(None) == [] and verdicts.topk_rows(record([], topk=None)) == []
    assert verdicts.topk_rows(record([], topk={"y": {}})) == []


def test_task_rows() -> None:
    task = {
        "cer": {"metric": "ctc", "against": "targets", "records": 8, "fp32": 0.01, "quantized": 0.02, "drop": 0.01},
        "acc": {"metric": "m", "against": "fp32", "fp32": 1.0, "higher_is_better": True},
        "bad": {"error": "boom"},
    }
    assert verdicts.task_rows(record([], task=task)) == [
        {"value": "acc", "metric": "m", "against": "fp32 predictions, 0 records", "fp32": "1", "quantized": "-",
         "drop": "-", "better": "higher"},
        {"value": "bad", "metric": "", "against": "not computed: boom", "fp32": "-", "quantized": "-", "drop": "-",
         "better": "lower"},
        {"value": "cer", "metric": "ctc", "against": "targets, 8 records", "fp32": "0.01", "quantized": "0.02",
         "drop": "0.01", "better": "lower"},
    ]  # fmt: skip
    assert verdicts.task_rows(None) == [] and verdicts.task_rows(record([], task=None)) == []


def test_worst_layers(small_result) -> None:
    assert verdicts.worst_layers(small_result, None) == []
    assert verdicts.worst_layers(small_result, "sqnr") == [
        {"tensor": "conv2_out", "op_type": "Conv", "order": 2, "text": "20.00 dB"},
        {"tensor": "logits", "op_type": "Gemm", "order": 3, "text": "25.00 dB"},
        {"tensor": "conv1_out", "op_type": "Conv", "order": 0, "text": "33.00 dB"},
    ]
    assert [x["tensor"] for x in verdicts.worst_layers(small_result, "mpeir", count=5)] == [
        "conv2_out",
        "logits",
        "conv1_out",
    ]  # fmt: skip  (relu1_out has no MPEIR: left out)


# -- tables.py ------------------------------------------------------------------------------------


def test_shorten() -> None:
    assert tables.shorten("a" * 60) == "a" * 60
    name = "".join(chr(ord("a") + i % 26) for i in range(61))
    short = tables.shorten(name)
    assert short == name[:29] + "…" + name[-30:] and len(short) == 60
    assert tables.shorten("abcdefgh", 5) == "ab…gh" and tables.shorten("abcdefgh", 6) == "ab…fgh"
    assert tables.shorten("a\tb") == "a\\tb"


def test_rank_layers_without_values_last_in_order(make_result) -> None:
    result = make_result(
        [("a", "Conv", {"mse": None}), ("b", "Relu", {"mse": 0.5}), ("c", "Gemm", {"mse": float("nan")}),
         ("d", "Add", {"mse": 0.5}), ("e", "Mul", {"mse": 0.1})],
        definitions={"mse": "x"},
    )  # fmt: skip
    assert [x.tensor for x in tables.rank_layers(result, "mse")] == ["b", "d", "e", "a", "c"]
    with pytest.raises(Exception, match=r"cannot rank layers by 'sqnr': the result's metrics are mse"):
        tables.rank_layers(result, "sqnr")
    empty = make_result([], definitions={})
    with pytest.raises(Exception, match=r"the result's metrics are none"):
        tables.rank_layers(empty, "mse")


def test_layers_and_outputs_tables(small_result) -> None:
    text = tables.layers_table(small_result, top=2, rank_by="cosine")
    lines = text.splitlines()
    assert lines[0].split() == ["order", "tensor", "op_type", "mse", "mpeir", "cosine", "sqnr"]
    assert [line.split()[:3] for line in lines[2:]] == [["2", "conv2_out", "Conv"], ["3", "logits", "Gemm"]]
    assert lines[2].startswith("      2  conv2_out") and lines[2].endswith("20.00 dB")
    assert tables.layers_table(small_result, top=0) == tables.layers_table(small_result, top=-3)
    assert len(tables.layers_table(small_result, top=0).splitlines()) == 2
    assert tables.layers_table(small_result).splitlines()[2].split()[1] == "conv2_out"  # mse, highest first
    out = tables.outputs_table(small_result).splitlines()
    assert out[0].split() == ["output", "mse", "mpeir", "cosine", "sqnr"] and out[2].startswith("logits  ")
    assert out[2].endswith("25.00 dB")
    assert tables.outputs_table(small_result, tablefmt="github").startswith("| output")
    assert tables._align(3, ["a", "b"], 1) == ("right", "left", "left", "right", "right")
    assert tables._align(1, ["a"]) == ("left", "right")


def test_comparison_table_parts(small_result, make_result) -> None:
    text = tables.comparison_table(small_result, top=2, rank_by="sqnr")
    lines = text.splitlines()
    assert lines[0] == "models/net.int8.onnx vs models/net.onnx on calib.h5 (16 records)"
    assert lines[1] == "" and lines[2] == "Outputs"
    assert "Worst 2 of 4 layers by sqnr (lowest first)" in lines
    assert "1 fp32 tensor(s) had no quantized counterpart (see the JSON's 'unmatched')" in lines
    assert "Worst 4 of 4 layers by mse (highest first)" in tables.comparison_table(small_result, top=10).splitlines()
    assert "Worst" not in tables.comparison_table(small_result, top=0)
    none = make_result([], definitions={})
    assert tables.comparison_table(none) == f"{none.quantized_model}: no metrics were computed"
    bare = make_result([], definitions={"mse": "x"})
    text = tables.comparison_table(bare).splitlines()
    assert "Outputs: none compared" in text and text[-2:] == ["", "Layers: none compared"]
    lonely = make_result([("a", "Conv", {"mse": 1.0})], definitions={"mse": "x"}, unmatched_fp32=["u1", "u2", "u3"])
    lines = tables.comparison_table(lonely).splitlines()
    assert lines[-2:] == [
        "3 fp32 tensor(s) had no quantized counterpart (see the JSON's 'unmatched')",
        "warning: only 1 of 4 layers matched: are these the same model?",
    ]


def test_a_passed_pair_that_was_analysed_shows_its_block() -> None:
    analysed = record([check(passed=True)], id="ok", sensitivity={"error": "boom"})
    quiet = record([check(passed=True)], id="calm")
    texts = summary.summary_lines([analysed, quiet])
    assert texts == [
        "ok: PASSED (m.q.onnx vs m.onnx on d.npz, 4 records)",
        "calm: PASSED (m.q.onnx vs m.onnx on d.npz, 4 records)",
        "",
        "ok: PASSED on d.npz",
        "  sensitivity not analysed: boom",
        "",
        "2 / 2 pairs passed",
    ]
    unchecked = record([], id="u", sensitivity={"error": "boom"})
    assert summary.summary_lines([unchecked])[2:4] == ["u: NO CHECKS on d.npz", "  sensitivity not analysed: boom"]


def test_a_strict_xfail_that_passed_says_why_it_failed(tmp_path: Path) -> None:
    strict = record([check(passed=True)], id="s", tests={"t::x": "xpassed-strict"})
    lines = summary.summary_lines([strict])
    assert lines[1:3] == ["", "s: FAILED on d.npz, passed, but t::x is marked xfail(strict=True)"]
    (tmp_path / "labels.npy").write_bytes(b"L")
    with_labels = record([], labels=str(tmp_path / "labels.npy"), fp32=None, quantized=None, data=None)
    pair = summary.summary_document([with_labels], tmp_path, {})["pairs"][0]
    assert pair["labels"] == {"path": "labels.npy", "sha256": hashlib.sha256(b"L").hexdigest()}
    assert pair["status"] == "unchecked" and pair["passed"] is True


def test_tables_rank_name_and_align(make_result) -> None:
    result = make_result(
        [("007", None, {"mse": 0.5, "sqnr": 30.0}), ("b", "Relu", {"mse": 0.1, "sqnr": None}),
         ("c", "Conv", {"mse": 0.9, "sqnr": 10.0})],
        outputs=[("1e3", {"mse": 0.5, "sqnr": 30.0})],
        definitions={"mse": "x", "sqnr": "y"},
    )  # fmt: skip
    assert [x.tensor for x in tables.rank_layers(result, "sqnr")] == ["c", "007", "b"]  # no value: last
    lines = tables.layers_table(result).splitlines()  # ranked by the first metric, mse: highest first
    assert [line.split()[:3] for line in lines[2:]] == [["2", "c", "Conv"], ["0", "007", "?"], ["1", "b", "Relu"]]
    assert lines[0] == "  order  tensor    op_type      mse      sqnr"
    assert lines[3] == "      0  007       ?            0.5  30.00 dB"
    assert tables.outputs_table(result).splitlines()[2] == "1e3         0.5  30.00 dB"
    github = tables.layers_table(result, top=1, tablefmt="github").splitlines()
    assert github[0].startswith("|   order | tensor   | op_type") and len(github) == 3
    text = tables.comparison_table(result, top=1, rank_by="sqnr").splitlines()
    assert text[-5:] == [
        "",
        "Worst 1 of 3 layers by sqnr (lowest first)",
        "  order  tensor    op_type      mse      sqnr",
        "-------  --------  ---------  -----  --------",
        "      2  c         Conv         0.9  10.00 dB",
    ]
    assert text[:5] == [
        "models/net.int8.onnx vs models/net.onnx on calib.h5 (16 records)",
        "",
        "Outputs",
        "output      mse      sqnr",
        "--------  -----  --------",
    ]


def test_summary_document_names_every_part(tmp_path: Path) -> None:
    from pytest_qaccuracy.backend.host import host_preset

    (tmp_path / "q.onnx").write_bytes(b"Q")
    r = record([], quantized=str(tmp_path / "q.onnx"), fp32=None, data=None, task={"cer": {}}, targets={"t": {}})
    document = summary.summary_document([r], tmp_path, {})
    assert document["host_preset"] == host_preset()
    pair = document["pairs"][0]
    assert pair["quantized"] == {"path": "q.onnx", "sha256": hashlib.sha256(b"Q").hexdigest()}
    assert (pair["task"], pair["targets"], pair["sensitivity"]) == ({"cer": {}}, {"t": {}}, None)
    assert (pair["scheme"], pair["backend"], pair["topk"]) == ("onnxruntime", "onnxruntime", {})
