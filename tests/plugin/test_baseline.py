"""Per-layer baselines: save, compare, drift rules, missing baselines."""

from __future__ import annotations

import json
import shutil

import pytest

from pytest_qaccuracy.analysis.results import ComparisonResult, LayerResult, OutputResult
from pytest_qaccuracy.report.baseline import find_drift, parse_drift_rule, profile

SUITE = """
[pairs.qdq]
fp32 = "models/digits_cnn.onnx"
quantized = "models/digits_cnn.qdq.onnx"
data = "data/digits_test.npz"
"""


def test_save_compare_and_drift(digits: pytest.Pytester) -> None:
    digits.makefile(".toml", qaccuracy_models=SUITE)
    digits.runpytest("--qaccuracy-save-baseline=base").assert_outcomes(passed=1)
    saved = list((digits.path / "base").glob("*.json"))
    assert len(saved) == 1 and saved[0].name.startswith("qdq-")
    document = json.loads(saved[0].read_text())
    assert document["pair"] == "qdq" and "relu1" in document["layers"] and "logits" in document["outputs"]

    result = digits.runpytest("--qaccuracy-baseline=base", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*qaccuracy_models.toml::qdq::drift PASSED*"])

    # the quantized model regresses in place: same pair, new numbers
    shutil.copy(digits.path / "models/digits_cnn.broken.onnx", digits.path / "models/digits_cnn.qdq.onnx")
    result = digits.runpytest("--qaccuracy-baseline=base", "--qaccuracy-min-cosine=0")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "drift: output 'logits': sqnr 30.4* -> 0.72* (limit 29.4*, sqnr:-1.0) (pair 'qdq')",
            "Tolerance from: --qaccuracy-baseline",
            "Also failed (*):",
            " drift: layer 'relu1': sqnr 41.* -> 0.98* (limit 40.*, sqnr:-1.0)",
        ]
    )


def test_missing_baseline_and_relative_rule(digits: pytest.Pytester) -> None:
    digits.makefile(".toml", qaccuracy_models=SUITE)
    (digits.path / "empty").mkdir()
    result = digits.runpytest("--qaccuracy-baseline=empty")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["no baseline for pair 'qdq' in *empty (write one with --qaccuracy-update-baselines)*"])
    digits.runpytest("--qaccuracy-save-baseline=base")
    result = digits.runpytest("--qaccuracy-baseline=base", "--qaccuracy-max-drift=sqnr:+1")
    result.stdout.fnmatch_lines(["drift rule 'sqnr:+1': sqnr gets worse as it falls; write sqnr:-1 *"])
    digits.runpytest("--qaccuracy-baseline=base", "--qaccuracy-max-drift=mse:+20%").assert_outcomes(passed=2)


BASELINES = ".qaccuracy-baselines"


def _line(result: pytest.RunResult) -> str:
    """The one baseline line of the terminal summary."""
    lines = [line for line in result.outlines if line.startswith("baselines ")]
    assert len(lines) == 1, result.outlines
    return lines[0]


def _files(folder) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.glob("*.json"))}


def test_default_folder_update_compare_and_accept(digits: pytest.Pytester) -> None:
    """The whole workflow in the default folder: passing pairs saved, compared once it exists (a pair
    without a baseline skips its drift item), unchanged files not rewritten, failing pairs written only
    with --qaccuracy-update-all-baselines."""
    from .conftest import SUITE as TWO_PAIRS  # qdq passes, broken fails max_top1_drop

    digits.makefile(".toml", qaccuracy_models=TWO_PAIRS)
    folder = digits.path / BASELINES
    result = digits.runpytest("--qaccuracy-update-baselines")
    result.assert_outcomes(passed=3, failed=2)  # no folder yet: no drift items
    assert _line(result) == (
        f"baselines {BASELINES}: saved 1, updated 0, unchanged 0, stale 0; not saved, failing: broken "
        "(--qaccuracy-update-all-baselines saves failing pairs too)"
    )
    saved = _files(folder)
    assert [name.split("-")[0] for name in saved] == ["qdq"]

    result = digits.runpytest("-v")  # the folder exists: compared automatically
    result.assert_outcomes(passed=4, failed=2, skipped=1)
    result.stdout.fnmatch_lines(["*::qdq::drift PASSED*", "*::broken::drift SKIPPED (no baseline for pair *"])
    assert _line(result) == f"baselines {BASELINES}: compared 1, missing 1 (broken), stale 0"

    stamp = (folder / next(iter(saved))).stat().st_mtime_ns
    result = digits.runpytest("--qaccuracy-update-baselines", "-k", "qdq")
    assert _line(result) == f"baselines {BASELINES}: saved 0, updated 0, unchanged 1, stale 0"
    assert (folder / next(iter(saved))).stat().st_mtime_ns == stamp  # not rewritten

    # the quantized model regresses in place: drift fails, and updating does not hide it
    shutil.copy(digits.path / "models/digits_cnn.broken.onnx", digits.path / "models/digits_cnn.qdq.onnx")
    result = digits.runpytest("-k", "qdq and drift")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "drift: output 'logits': sqnr 30.4* -> 0.72* (limit 29.4*, sqnr:-1.0) (pair 'qdq')",
            f"Tolerance from: baseline {BASELINES}/qdq-*.json",
            "To accept these numbers as the new baseline: --qaccuracy-update-all-baselines",
        ]
    )
    assert _line(result) == f"baselines {BASELINES}: compared 1 (1 drifted: qdq), missing 0, stale 0"
    result = digits.runpytest("--qaccuracy-update-baselines")
    assert _line(result).startswith(f"baselines {BASELINES}: saved 0, updated 0, unchanged 0, stale 0; not saved")
    assert _files(folder) == saved

    result = digits.runpytest("--qaccuracy-update-all-baselines")
    assert _line(result) == f"baselines {BASELINES}: saved 1, updated 1 (qdq), unchanged 0, stale 0"
    digits.runpytest("-k", "drift").assert_outcomes(passed=2)  # the accepted numbers are the reference now


def test_ini_folder_stale_files_and_xdist(digits: pytest.Pytester) -> None:
    """``qaccuracy_baseline_dir`` is relative to the ini file; a file no pair of the session produced
    is listed as stale and kept; under xdist only the controller writes, with the same summary line."""
    digits.makefile(".toml", qaccuracy_models=SUITE)
    digits.makeini("[pytest]\nqaccuracy_baseline_dir = ci/baselines\n")
    result = digits.runpytest("-n", "2", "--qaccuracy-update-baselines")
    assert _line(result) == "baselines ci/baselines: saved 1, updated 0, unchanged 0, stale 0"
    assert not (digits.path / BASELINES).exists()
    digits.makefile(".toml", qaccuracy_models=SUITE.replace("[pairs.qdq]", "[pairs.renamed]"))
    result = digits.runpytest()
    result.assert_outcomes(passed=1, skipped=1)
    old = next((digits.path / "ci/baselines").glob("qdq-*.json")).name
    assert _line(result) == f"baselines ci/baselines: compared 0, missing 1 (renamed), stale 1 ({old})"
    result = digits.runpytest("--qaccuracy-update-baselines")
    assert _line(result) == f"baselines ci/baselines: saved 1, updated 0, unchanged 0, stale 1 ({old})"
    assert (digits.path / "ci/baselines" / old).is_file()  # never deleted


def test_status_line_units(tmp_path) -> None:
    from pytest_qaccuracy.report.baseline import BaselineStatus, write_baseline

    document = profile(_result(30.0, 1.0), "p")
    assert [write_baseline(tmp_path / "p.json", d) for d in (document, document)] == ["saved", "unchanged"]
    assert write_baseline(tmp_path / "p.json", profile(_result(29.0, 1.0), "p")) == "updated"
    many = tuple(f"p{i}" for i in range(12))
    status = BaselineStatus("b", False, compared=("a",), missing=many)
    assert status.line() == f"baselines b: compared 1, missing 12 ({', '.join(many[:10])}, ... (2 more)), stale 0"


def _result(sqnr: float, mse: float) -> ComparisonResult:
    return ComparisonResult(
        fp32_model="m.onnx",
        quantized_model="m.q.onnx",
        data="d.npz",
        records=4,
        metric_definitions={"sqnr": "", "mse": ""},
        outputs=[OutputResult("y", {"sqnr": sqnr, "mse": mse})],
        layers=[LayerResult("a", "a_q", "n", "Conv", 0, {"sqnr": sqnr + 10, "mse": mse / 2})],
        higher_is_better={"sqnr": True, "mse": False},
    )


def test_drift_rules_units() -> None:
    higher = {"sqnr": True, "mse": False}
    base = profile(_result(30.0, 1.0), "p")
    rules = [parse_drift_rule("sqnr:-1.0", higher), parse_drift_rule("mse:+20%", higher)]
    assert find_drift(base, _result(29.5, 1.19), rules) == ([], [])
    drifts, _ = find_drift(base, _result(28.0, 1.3), rules)
    assert [(d.target, d.metric) for d in drifts] == [
        ("output 'y'", "sqnr"),
        ("output 'y'", "mse"),
        ("layer 'a'", "sqnr"),
        ("layer 'a'", "mse"),
    ]
    assert drifts[1].allowed == pytest.approx(1.2)
    with pytest.raises(ValueError, match="unknown metric 'snr'"):
        parse_drift_rule("snr:-1", higher)
    with pytest.raises(ValueError, match="bad drift rule"):
        parse_drift_rule("sqnr -1")


def test_a_drift_rule_naming_no_metric_fails_naming_it_and_the_known_metrics(digits: pytest.Pytester) -> None:
    """``sqrn:-1`` (misspelt) is no registered metric and no pair's task value: the drift check fails
    with one line naming the rule and what it could have named, instead of skipping the rule."""
    digits.makefile(".toml", qaccuracy_models=SUITE)
    digits.runpytest("--qaccuracy-save-baseline=base")
    result = digits.runpytest("--qaccuracy-baseline=base", "--qaccuracy-max-drift=sqrn:-1")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*drift rule 'sqrn:-1': unknown metric 'sqrn' (known: *cosine*sqnr*)*"])
