"""``qaccuracy_calibrate``: a pair's quantized model made inside the session, kept by content hash."""

from __future__ import annotations

import shutil

import pytest

from tests.plugin.conftest import EXAMPLES

MODULE = """
def test_minmax(qaccuracy, qaccuracy_pair, qaccuracy_calibrate):
    quantized = qaccuracy_calibrate("models/digits_cnn.onnx", "data/digits_calib.npz", method="{method}")
    qaccuracy.check(qaccuracy_pair("models/digits_cnn.onnx", quantized, "data/digits_test.npz"), min_sqnr=15.0)
"""


def test_the_model_is_made_once_and_reused_by_the_next_session(digits: pytest.Pytester) -> None:
    shutil.copy(EXAMPLES / "data" / "digits_calib.npz", digits.path / "data")
    digits.makepyfile(MODULE.format(method="minmax"))
    digits.runpytest().assert_outcomes(passed=1)
    cache = digits.path / ".pytest_cache" / "d" / "qaccuracy-calibrated"
    made = sorted(cache.glob("*.onnx"))
    assert len(made) == 1 and made[0].with_suffix(".json").is_file()
    stamp = made[0].stat().st_mtime_ns
    digits.runpytest().assert_outcomes(passed=1)
    assert sorted(cache.glob("*.onnx")) == made and made[0].stat().st_mtime_ns == stamp  # reused, not remade
    (digits.path / "data" / "digits_calib.npz").write_bytes((EXAMPLES / "data" / "digits_test.npz").read_bytes())
    digits.runpytest().assert_outcomes(passed=1)
    assert len(list(cache.glob("*.onnx"))) == 2  # other calibration data: another model


def test_a_bad_method_fails_the_test_in_one_line(digits: pytest.Pytester) -> None:
    shutil.copy(EXAMPLES / "data" / "digits_calib.npz", digits.path / "data")
    digits.makepyfile(MODULE.format(method="entropy"))
    result = digits.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*qaccuracy_calibrate: unknown calibration method 'entropy'; expected one of*"])
    assert "Traceback" not in result.stdout.str()
