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
    result.stdout.fnmatch_lines(["no baseline for pair 'qdq' in *empty (save one with --qaccuracy-save-baseline)*"])
    digits.runpytest("--qaccuracy-save-baseline=base")
    result = digits.runpytest("--qaccuracy-baseline=base", "--qaccuracy-max-drift=sqnr:+1")
    result.stdout.fnmatch_lines(["drift rule 'sqnr:+1': sqnr gets worse as it falls; write sqnr:-1 *"])
    digits.runpytest("--qaccuracy-baseline=base", "--qaccuracy-max-drift=mse:+20%").assert_outcomes(passed=2)


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
