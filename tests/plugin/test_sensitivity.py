"""Sensitivity tables in the session summary and as artifacts, on the digits models (real onnxruntime)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import onnx
import pytest

from pytest_qaccuracy.outcomes import Outcome
from pytest_qaccuracy.plugin.records import ExclusionTarget, RecordedCheck, SensitivityEntry
from pytest_qaccuracy.plugin.sensitivity import exclusion_target, merge_entry

from .conftest import PAIRS_MODULE

BROKEN_NODES = {"conv1", "pool1", "conv2", "pool2", "flatten", "fc"}
FILES = ("sensitivity", "sweep", "cumulative", "cumulative_chart")


def _unwrap(lines: list[str]) -> list[str]:
    """The summary's lines with the ones it wrapped at 100 columns joined again (a continuation is
    indented four more than the long line before it)."""
    joined: list[str] = []
    for line in lines:
        previous = joined[-1] if joined else ""
        indent = len(previous) - len(previous.lstrip(" "))
        if previous and line.startswith(" " * (indent + 4)) and not line.startswith(" " * (indent + 5)):
            joined[-1] = f"{previous} {line.strip()}"
        else:
            joined.append(line)
    return joined


def _verdict(result: pytest.RunResult, pair: str) -> str:
    """The verdict line of one pair (the summary leads with them)."""
    return next(line for line in _unwrap(result.outlines) if line.startswith(f"{pair}: "))


def _block(result: pytest.RunResult, pair: str) -> list[str]:
    """The block of one pair after the verdict lines (a pair that did not pass, or was analysed), up
    to the blank line that ends it."""
    lines = _unwrap(result.outlines)
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{pair}: ") and not lines[i - 1].strip())
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    return lines[start:end]


def _table(block: list[str]) -> list[tuple[int, str, str, float]]:
    """Rows of the sensitivity table: (rank, node, op_type, value), every number parsed."""
    header = next(i for i, line in enumerate(block) if line.split()[:3] == ["rank", "node", "op_type"])
    rows = []
    for line in block[header + 2 :]:
        parts = line.split()
        if not parts or not parts[0].isdigit():
            break
        rows.append((int(parts[0]), parts[1], parts[2], float(parts[3])))
    return rows


def _pair_entry(root: Path, pair: str) -> dict:
    summary = json.loads((root / "summary.json").read_text())
    return next(p for p in summary["pairs"] if p["id"] == pair)


def test_failing_pair_gets_table_suggestion_and_artifacts(digits: pytest.Pytester) -> None:
    digits.makepyfile(test_pairs=PAIRS_MODULE)
    result = digits.runpytest("--qaccuracy-artifacts-dir=out", "--qaccuracy-sensitivity-top=3")
    result.assert_outcomes(passed=1, failed=1)
    block = _block(result, "digits_cnn.broken")
    rows = _table(block)
    assert [r[0] for r in rows] == [1, 2, 3] and {r[1] for r in rows} <= BROKEN_NODES
    assert rows[0][1:3] == ("conv1", "Conv") and 0.0 < rows[0][3] < 0.99
    assert [r[3] for r in rows] == sorted(r[3] for r in rows)  # single mode: worst cosine first
    assert "  ... 3 more node(s)" in block
    prefix = "  target cosine >= 0.99 (failed min_cosine on output 'logits'): nodes_to_exclude="
    suggestion = next(line for line in block if line.startswith(prefix))
    excluded = ast.literal_eval(suggestion[len(prefix) :])
    assert excluded[0] == "conv1" and set(excluded) <= BROKEN_NODES
    assert _verdict(result, "digits_cnn.qdq").startswith("digits_cnn.qdq: PASSED (")
    assert not any(line.startswith("digits_cnn.qdq: ") for line in _block(result, "digits_cnn.broken"))

    out = digits.path / "out"
    entry = _pair_entry(out, "digits_cnn.broken")
    assert sorted(k for k in entry["artifacts"] if k in FILES) == sorted(FILES)
    docs = {k: json.loads((out / entry["artifacts"][k]).read_text()) for k in FILES}
    ranking = docs["sensitivity"]["nodes"]
    assert {n["node"] for n in ranking} == BROKEN_NODES
    assert min(ranking, key=lambda n: n["metrics"]["cosine"])["metrics"]["cosine"] == pytest.approx(rows[0][3], 1e-5)
    assert docs["sweep"]["target"] == {"metric": "cosine", "value": 0.99} and docs["sweep"]["suggestion"] == excluded
    chart, curves = docs["cumulative_chart"], docs["cumulative"]["curves"]
    assert [s["name"] for s in chart["series"]] == [c["label"] for c in curves] and len(curves) == 3
    assert chart["x"] == docs["cumulative"]["nodes"] and set(chart["x"]) <= BROKEN_NODES
    assert all(len(s["y"]) == len(chart["x"]) and all(isinstance(v, float) for v in s["y"]) for s in chart["series"])
    brief = entry["sensitivity"]
    assert brief["nodes_to_exclude"] == excluded and brief["most_sensitive"][0] == "conv1"
    assert brief["target_from"]["check"] == "min_cosine" and brief["target_from"]["source"] == "default"
    assert _pair_entry(out, "digits_cnn.qdq")["sensitivity"] is None
    assert not list(out.glob("pairs/digits_cnn.qdq-*.sensitivity.json"))
    # the HTML report carries the same analysis: every node (not only the terminal's top 3) and the curves
    pages = {p["title"]: p for p in _report_pairs(out / "report.html")}
    view = pages["digits_cnn.broken: digits_cnn.broken.onnx vs digits_cnn.onnx"]["sensitivity"]
    assert [(r["rank"], r["node"], r["op_type"]) for r in view["rows"][:3]] == [r[:3] for r in rows]
    assert len(view["rows"]) == 6 and view["more"] == 0 and view["metric"] == "cosine"
    assert view["suggestion"] == suggestion.strip() and view["chart"] == chart
    assert pages["digits_cnn.qdq: digits_cnn.qdq.onnx vs digits_cnn.onnx"]["sensitivity"] is None


def _report_pairs(path: Path) -> list[dict]:
    """The pairs embedded in report.html."""
    import re

    text = path.read_text(encoding="utf-8")
    found = re.search(r'<script type="application/json" id="qaccuracy-data">(.*?)</script>', text, re.S)
    return json.loads(found[1])["pairs"]


@pytest.mark.parametrize(
    ("args", "records"),
    [((), 32), (("--qaccuracy-sensitivity-records=5",), 5), (("--qaccuracy-sensitivity-records=0",), 300)],
)
def test_the_analysis_reads_the_first_records(digits: pytest.Pytester, args: tuple[str, ...], records: int) -> None:
    """32 records by default (its cost grows with records x nodes), N with the option, all 300 with 0."""
    digits.makepyfile(test_pairs=PAIRS_MODULE)
    result = digits.runpytest("--qaccuracy-no-artifacts", *args)
    title = next(line for line in _block(result, "digits_cnn.broken") if "sensitivity (node) of" in line)
    assert f"on digits_test.npz ({records} records)" in title
    assert _verdict(result, "digits_cnn.broken").endswith(", 300 records)")  # the comparison reads every record


def test_all_pairs_with_the_option_and_none_when_off(digits: pytest.Pytester) -> None:
    digits.makepyfile(test_pairs=PAIRS_MODULE)
    digits.makeini("[pytest]\nqaccuracy_sensitivity = all\nqaccuracy_sensitivity_mode = leave-one-out\n")
    result = digits.runpytest("--qaccuracy-artifacts-dir=all")
    block = _block(result, "digits_cnn.qdq")
    assert any("leave-one-out sensitivity (node) of digits_cnn.qdq.onnx" in line for line in block)
    rows = _table(block)
    assert len(rows) == 6 and {r[1] for r in rows} == BROKEN_NODES and all(0.99 < r[3] <= 1.0 for r in rows)
    assert not any("nodes_to_exclude" in line or "no exclusion" in line for line in block)  # it passed
    assert (
        digits.path / "all" / _pair_entry(digits.path / "all", "digits_cnn.qdq")["artifacts"]["sensitivity"]
    ).exists()

    off = digits.runpytest("--qaccuracy-sensitivity=off", "--qaccuracy-artifacts-dir=off")
    off.assert_outcomes(passed=1, failed=1)
    assert not any("sensitivity" in line for line in off.outlines)
    assert not list((digits.path / "off").glob("pairs/*.sensitivity.json"))
    assert _pair_entry(digits.path / "off", "digits_cnn.broken")["sensitivity"] is None


def test_expected_failure_without_cosine_target_and_no_artifacts(digits: pytest.Pytester) -> None:
    digits.makepyfile(
        """
        import pytest

        @pytest.mark.xfail(reason="known", strict=True)
        @pytest.mark.qaccuracy(fp32="models/digits_cnn.onnx", quantized="models/digits_cnn.broken.onnx",
                               data="data/digits_test.npz", min_cosine=0.0, max_top1_drop=0.005)
        def test_broken(qaccuracy):
            qaccuracy.check()
        """
    )
    result = digits.runpytest("--qaccuracy-no-artifacts", "--qaccuracy-sensitivity-metric=mse")
    result.assert_outcomes(xfailed=1)
    block = _block(result, "digits_cnn.broken")
    assert block[0] == "digits_cnn.broken: XFAIL on digits_test.npz, expected to fail: known"
    rows = _table(block)
    assert rows[0][1] == "conv1" and [r[3] for r in rows] == sorted((r[3] for r in rows), reverse=True)
    assert block[-1] == "  no exclusion list suggested: no failed cosine or SQNR check on an output to aim at"
    assert not (digits.path / ".qaccuracy").exists()


def test_qoperator_pair_is_not_supported(digits: pytest.Pytester) -> None:
    digits.makepyfile(
        """
        def test_qop(qaccuracy, qaccuracy_pair):
            pair = qaccuracy_pair("models/digits_cnn.onnx", "models/digits_cnn.qoperator.onnx", "data/digits_test.npz")
            qaccuracy.check(pair, min_cosine=0.9999999)
        """
    )
    result = digits.runpytest("--qaccuracy-artifacts-dir=out")
    result.assert_outcomes(failed=1)
    line = _block(result, "digits_cnn.qoperator")[-1]
    assert line.startswith("  sensitivity of digits_cnn.qoperator: ") and "needs a QDQ model" in line
    brief = _pair_entry(digits.path / "out", "digits_cnn.qoperator")["sensitivity"]
    assert "needs a QDQ model" in brief["unsupported"] and brief["nodes_to_exclude"] is None
    assert not list((digits.path / "out").glob("pairs/*.sensitivity.json"))


def test_an_analysis_that_raises_is_one_line(digits: pytest.Pytester) -> None:
    digits.makepyfile(
        """
        def test_then_lose_the_data(qaccuracy, qaccuracy_pair):
            pair = qaccuracy_pair("models/digits_cnn.onnx", "models/digits_cnn.broken.onnx", "data/digits_test.npz")
            try:
                qaccuracy.check(pair)
            finally:
                (pair.spec.data).unlink()
        """
    )
    result = digits.runpytest("--qaccuracy-artifacts-dir=out")
    result.assert_outcomes(failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    line = _block(result, "digits_cnn.broken")[-1]
    assert line.startswith("  sensitivity not analysed: ") and "digits_test.npz" in line
    assert "INTERNALERROR" not in result.stdout.str()
    assert _pair_entry(digits.path / "out", "digits_cnn.broken")["sensitivity"]["error"] == line.split(": ", 1)[1]


@pytest.mark.parametrize(
    ("args", "ini", "expected"),
    [
        ((), "qaccuracy_sensitivity = sometimes", "qaccuracy_sensitivity: expected one of failed, all, off, got"),
        (("--qaccuracy-sensitivity-mode=cumulative",), "", "--qaccuracy-sensitivity-mode: expected one of single, "),
        ((), "qaccuracy_sensitivity_top = 0", "qaccuracy_sensitivity_top: expected an integer >= 1, got '0'"),
        (("--qaccuracy-sensitivity-top=ten",), "", "--qaccuracy-sensitivity-top: expected an integer >= 1, got 'ten'"),
        (("--qaccuracy-sensitivity-metric=cosine,mse",), "", "--qaccuracy-sensitivity-metric: expected one metric"),
        (("--qaccuracy-sensitivity-metric=cosin",), "", "--qaccuracy-sensitivity-metric: unknown metric 'cosin'"),
        ((), "qaccuracy_sensitivity_metric = cosin", "qaccuracy_sensitivity_metric: unknown metric 'cosin'"),
        ((), "qaccuracy_sensitivity_records = -1", "qaccuracy_sensitivity_records: expected an integer >= 0, got '-1'"),
    ],
    ids=["scope", "mode", "top-ini", "top-cli", "metric-list", "metric-unknown", "metric-unknown-ini", "records-ini"],
)
def test_bad_value_is_a_usage_error(pytester: pytest.Pytester, args: tuple[str, ...], ini: str, expected: str) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1 and expected in errors[0], result.errlines
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def _sensitivity_view(result: pytest.RunResult, root: Path) -> tuple[list[str], dict[str, object]]:
    lines = [line for line in result.outlines if "sensitivity" in line or "nodes_to_exclude" in line]
    kinds = tuple(f".{k.replace('_', '.')}.json" for k in FILES)
    return lines, {p.name: json.loads(p.read_text()) for p in root.glob("pairs/*") if p.name.endswith(kinds)}


#: One broken pair checked by two tests that fail on different tolerances, run on two xdist workers.
SPLIT_MODULE = """
import time

import pytest

BROKEN = dict(fp32="models/digits_cnn.onnx", quantized="models/digits_cnn.broken.onnx", data="data/digits_test.npz")


@pytest.mark.xdist_group("sqnr")
@pytest.mark.qaccuracy(**BROKEN, min_cosine=0.0, min_sqnr=15.0)
def test_sqnr(qaccuracy):
    qaccuracy.check()


@pytest.mark.xdist_group("cosine")
@pytest.mark.qaccuracy(**BROKEN, min_cosine=0.99)
def test_cosine(qaccuracy):
    time.sleep(1.0)  # this worker finishes last, so the controller merges the sqnr worker's analysis first
    qaccuracy.check()
"""


def test_xdist_gives_the_same_tables_and_artifacts(digits: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    digits.makepyfile(test_split=SPLIT_MODULE)
    serial = digits.runpytest_subprocess("--qaccuracy-artifacts-dir=serial", "-p", "no:randomly")
    parallel = digits.runpytest_subprocess("-n", "2", "--dist=loadgroup", "--qaccuracy-artifacts-dir=parallel")
    serial.assert_outcomes(failed=2)
    parallel.assert_outcomes(failed=2)
    lines, files = _sensitivity_view(serial, digits.path / "serial")
    assert (lines, files) == _sensitivity_view(parallel, digits.path / "parallel")
    assert len(files) == 4 and any(line.startswith("  target cosine >= 0.99 (failed min_cosine") for line in lines)


def test_merge_keeps_what_a_serial_run_picks() -> None:
    def check(metric: str, threshold: float, passed: bool = False) -> RecordedCheck:
        outcome = Outcome(
            check=f"min_{metric}", kind="tolerance",
        scope="output",
        subject="output 'y'", metric=metric, op=">=", threshold=threshold, value=0.5,
            passed=passed, source="default", detail="",
        )  # fmt: skip
        return RecordedCheck(test="t", index=0, outcome=outcome)

    checks = [check("sqnr", 30.0), check("cosine", 0.99), check("cosine", 0.999), check("cosine", 0.9999, True)]
    assert exclusion_target(checks, "cosine") == ExclusionTarget(
        check="min_cosine", target="output 'y'", metric="cosine", threshold=0.999, source="default"
    )
    assert exclusion_target(checks, "sqnr").metric == "sqnr"
    assert exclusion_target([check("cosine", 0.5, True)], "cosine") is None
    entries = [
        SensitivityEntry(mode="single", metric="cosine", target_from=exclusion_target(c, "cosine"), report={"n": i})
        for i, c in enumerate([[check("sqnr", 30.0)], [check("cosine", 0.99)], []])
    ]
    for order in ([0, 1, 2], [2, 1, 0], [1, 0, 2]):
        mine = None
        for i in order:
            mine = merge_entry(mine, entries[i])
        assert mine is not None and mine.report == {"n": 1}


def test_model_node_names_are_what_the_table_shows() -> None:
    model = onnx.load(str(Path(__file__).resolve().parents[2] / "example_suites/models/digits_cnn.broken.onnx"))
    names = {n.name for n in model.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")}
    assert names == BROKEN_NODES


def test_renderer_on_hand_made_records() -> None:
    from pytest_qaccuracy.report.sensitivity_summary import sensitivity_brief, sensitivity_lines

    record = {"checks": [{"passed": False}], "sensitivity": {"mode": "single", "metric": "cosine", "error": "E: x"}}
    assert sensitivity_lines(record) == ["  sensitivity not analysed: E: x"]
    assert sensitivity_brief(record)["error"] == "E: x" and sensitivity_brief(record)["most_sensitive"] == []
    assert sensitivity_lines({"checks": []}) == [] and sensitivity_brief({"checks": []}) is None
    from pytest_qaccuracy.report.sensitivity_summary import sensitivity_view

    assert sensitivity_view(record) == {"note": "sensitivity not analysed: E: x"}
    assert sensitivity_view({"checks": []}) is None
