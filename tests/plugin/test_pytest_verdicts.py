"""Pair verdicts follow pytest's outcome: ``--runxfail``, ``-p no:skipping``, strict and non-strict
xfail; suite items carry their file and the ``[pairs.<name>]`` line (issue 34, items 1 and 7).

Each case runs a real pytest session on the bundled digits models (broken: cosine 0.39) and reads
what pytest itself printed and what the plugin wrote (terminal summary, ``summary.json``, JUnit XML).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from pytest_qaccuracy.plugin.suite import pair_lines

OFF = "--qaccuracy-analysis=off"

#: The broken pair marked xfail, and the good pair marked xfail (strict per the argument).
MODULE = """
import pytest

FP32, DATA = "models/digits_cnn.onnx", "data/digits_test.npz"


@pytest.mark.xfail(reason="known bad calibration")
@pytest.mark.qaccuracy(fp32=FP32, quantized="models/digits_cnn.broken.onnx", data=DATA)
def test_broken(qaccuracy):
    qaccuracy.check()


@pytest.mark.xfail(reason="thought to be bad"{strict})
@pytest.mark.qaccuracy(fp32=FP32, quantized="models/digits_cnn.qdq.onnx", data=DATA)
def test_good(qaccuracy):
    qaccuracy.check()
"""


def _summary(result: pytest.RunResult) -> list[str]:
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if "quantization accuracy summary" in line)
    return lines[start + 1 :]


def _pairs(pytester: pytest.Pytester) -> dict[str, dict]:
    document = json.loads((pytester.path / ".qaccuracy" / "summary.json").read_text())
    return {pair["id"]: pair for pair in document["pairs"]}


@pytest.mark.parametrize("strict", ["marker", "ini", False])
def test_xfail_as_pytest_reports_it(digits: pytest.Pytester, strict: str | bool) -> None:
    """strict=True on the mark, or xfail_strict = true in the ini file (as the example suite sets it)."""
    digits.makepyfile(
        test_pairs=MODULE.format(strict={"marker": ", strict=True", "ini": "", False: ", strict=False"}[strict])
    )
    if strict == "ini":
        digits.makeini("[pytest]\nxfail_strict = true\n")
    result = digits.runpytest(OFF, "-rxX")
    pairs = _pairs(digits)
    broken, good = pairs["digits_cnn.broken"], pairs["digits_cnn.qdq"]
    assert not broken["passed"] and all(
        c["xfail"] == "known bad calibration" for c in broken["checks"] if not c["passed"]
    )
    assert broken["tests"] == {"test_pairs.py::test_broken": "xfailed"}
    summary = "\n".join(_summary(result))
    if strict:  # pytest fails a strict XPASS: so does the pair
        result.assert_outcomes(xfailed=1, failed=1)
        assert good["passed"] is False and good["tests"] == {"test_pairs.py::test_good": "xpassed-strict"}
        assert "digits_cnn.qdq: FAILED" in summary and "xfail(strict=True)" in summary
    else:
        result.assert_outcomes(xfailed=1, xpassed=1)
        assert good["passed"] is True and good["tests"] == {"test_pairs.py::test_good": "xpassed"}
        assert "digits_cnn.qdq: PASSED" in summary
    assert "digits_cnn.broken: XFAIL" in summary


@pytest.mark.parametrize("flag", [["--runxfail"], ["-p", "no:skipping"]])
def test_runxfail_and_no_skipping_make_expected_failures_real(digits: pytest.Pytester, flag: list[str]) -> None:
    """pytest ignores the xfail marks: both tests' checks are judged as plain checks, as pytest does."""
    digits.makepyfile(test_pairs=MODULE.format(strict=", strict=True"))
    result = digits.runpytest(OFF, *flag, "-W", "ignore::pytest.PytestUnknownMarkWarning")
    result.assert_outcomes(failed=1, passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    pairs = _pairs(digits)
    broken = pairs["digits_cnn.broken"]
    assert broken["passed"] is False and all(c["xfail"] is None for c in broken["checks"])
    assert broken["tests"] == {"test_pairs.py::test_broken": "failed"}
    assert pairs["digits_cnn.qdq"]["passed"] is True
    summary = _summary(result)
    assert any(line.startswith("digits_cnn.broken: FAILED") for line in summary)
    assert not any("as expected" in line or "XFAIL" in line for line in summary)
    report = (digits.path / ".qaccuracy" / "report.html").read_text()
    assert '"status": "xfailed"' not in report and '"status":"xfailed"' not in report


SUITE = """# a suite: each pair's items point at its header line
[defaults]
fp32 = "models/digits_cnn.onnx"
data = "data/digits_test.npz"

[pairs.qdq]
quantized = "models/digits_cnn.qdq.onnx"

[pairs.qdq.tolerances]
min_cosine = 0.99

  [ pairs . "broken one" ]  # quoted, indented
quantized = "models/digits_cnn.broken.onnx"
xfail = "bad calibration"
"""


def test_pair_lines_find_each_header() -> None:
    lines = SUITE.splitlines()
    found = pair_lines(SUITE)
    assert found == {"qdq": lines.index("[pairs.qdq]"), "broken one": 11}
    assert lines[11].strip().startswith('[ pairs . "broken one" ]')
    assert pair_lines("[pairs]\nx = { quantized = 'm.onnx' }\n") == {}  # an inline table has no header


def test_suite_items_carry_file_and_line(digits: pytest.Pytester) -> None:
    digits.path.joinpath("qaccuracy_digits.toml").write_text(SUITE)
    junit = digits.path / "junit.xml"
    result = digits.runpytest(OFF, f"--junitxml={junit}", "-o", "junit_family=xunit1", "-rf")
    result.assert_outcomes(passed=1, xfailed=1)
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    qdq = [c for c in cases if c.get("classname", "").endswith(".qdq")]
    broken = [c for c in cases if "broken" in c.get("classname", "")]
    assert len(qdq) == 1 and len(broken) == 1 and len(cases) == 2  # min_cosine of each pair
    assert qdq[0].get("file") == broken[0].get("file") == "qaccuracy_digits.toml"
    assert int(qdq[0].get("line")) == SUITE.splitlines().index("[pairs.qdq]")  # 0-based, as pytest keeps it
    assert int(broken[0].get("line")) == 11
    # each check's typed outcome rides along as a JUnit property, the same record summary.json holds
    (prop,) = [json.loads(p.get("value")) for p in qdq[0].iter("property") if p.get("name") == "qaccuracy.check"]
    (recorded,) = _pairs(digits)["qdq"]["checks"]
    assert prop == {k: recorded[k] for k in prop} and set(prop) == {
        "kind", "check", "scope", "subject", "deployment", "metric", "op", "threshold", "value", "params", "output",
        "k", "passed", "source",
    }  # fmt: skip
    assert (prop["kind"], prop["check"], prop["subject"], prop["output"], prop["passed"]) == (
        "tolerance",
        "min_cosine",
        "output 'logits'",
        "logits",
        True,
    )
    # pytest's own location (0-based, as reportinfo gives it)
    listed = digits.runpytest(OFF, "--collect-only", "-q", "qaccuracy_digits.toml")
    assert any("qaccuracy_digits.toml::qdq::min_cosine" in line for line in listed.outlines)
    items = digits.inline_genitems(OFF, "qaccuracy_digits.toml")[0]
    assert {item.location[:2] for item in items} == {("qaccuracy_digits.toml", 5), ("qaccuracy_digits.toml", 11)}
