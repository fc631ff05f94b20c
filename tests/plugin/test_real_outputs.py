"""Real model outputs through the plugin: slices and the channel warning in a TOML suite,
top-k on label and sequence outputs through the marker, and exceptions as one failed-check line."""

from __future__ import annotations

import numpy as np
import pytest

from tests.modelzoo import quantize
from tests.output_models import FEATURES, STEPS, classifier, detector

pytest_plugins = ["pytester"]


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """det.onnx / det.qdq.onnx with det.npz; clf.onnx / clf.qdq.onnx with clf.npz (labels per record)."""
    root = pytester.path
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 1, 3, 8, 8)).astype(np.float32)
    quantize(detector(root / "det.onnx"), root / "det.qdq.onnx", x)
    np.savez(root / "det.npz", x=x[:, 0])
    x = rng.standard_normal((8, 1, FEATURES)).astype(np.float32)
    quantize(classifier(root / "clf.onnx"), root / "clf.qdq.onnx", x)
    np.savez(root / "clf.npz", x=x[:, 0], labels=rng.integers(0, 10, 8))
    return pytester


def _pairs(project) -> dict:
    import json

    summary = json.loads((project.path / ".qaccuracy" / "summary.json").read_text())
    return {pair["id"]: pair for pair in summary["pairs"]}


SUITE = """
[defaults]
fp32 = "det.onnx"
data = "det.npz"
tolerances = { min_cosine = 0.99 }

[pairs.whole]
quantized = "det.qdq.onnx"

[pairs.sliced]
quantized = "det.qdq.onnx"
slices = { boxes = "output0[:, 0:4]", scores = { view = "output0[:, 4:]", min_sqnr = 10.0, rules = ["sqnr>=12"] } }
"""


def test_a_suite_warns_about_lost_channels_and_checks_each_slice(project):
    project.makefile(".toml", qaccuracy_det=SUITE)
    result = project.runpytest("-p", "no:cacheprovider", "-rA")
    # the whole output passes min_cosine: only the warning tells that the scores are lost
    result.stdout.fnmatch_lines(["PASSED qaccuracy_det.toml::whole::min_cosine"])
    result.stdout.fnmatch_lines(
        ["whole: PASSED *", "warnings (*", "  whole: output0 channels 4..9 (axis 1) span < 1 step (scale *)*"]
    )
    # views: the scores fail the pair's min_cosine (all zeros), their own min_sqnr and their own rule
    result.stdout.fnmatch_lines(
        ["cosine undefined for output 'scores' (the quantized tensor is all zeros) (pair 'sliced')"]
    )
    result.stdout.fnmatch_lines(
        ["sqnr 0 dB < 10 dB for output 'scores' (pair 'sliced')", "Tolerance from: slice 'scores' min_sqnr="]
    )
    result.stdout.fnmatch_lines(["Tolerance from: slice 'scores' rules, rule 'sqnr>=12'"])
    boxes = [c for c in _pairs(project)["sliced"]["checks"] if c["subject"] == "output 'boxes'"]
    assert boxes and all(c["passed"] for c in boxes) and {c["check"] for c in boxes} >= {"min_cosine"}
    result.assert_outcomes(passed=1, failed=3)


def test_top_k_on_label_and_sequence_outputs(project):
    project.makepyfile(
        test_clf="""
import pytest

PAIR = dict(fp32="clf.onnx", quantized="clf.qdq.onnx", data="clf.npz")


@pytest.mark.qaccuracy(**PAIR, max_top1_drop=1.0, min_cosine=0.0)
def test_probabilities(qaccuracy):
    qaccuracy.check()


@pytest.mark.qaccuracy(**PAIR, scores="label", max_top1_drop=1.0, min_cosine=0.0)
def test_label(qaccuracy):
    qaccuracy.check()


@pytest.mark.qaccuracy(**PAIR, scores="steps", max_top1_drop=1.0, min_cosine=0.0)
def test_steps(qaccuracy):
    qaccuracy.check()
"""
    )
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            f"E * max_top1_drop: cannot count top-1 on output 'steps' float32 (8, {STEPS}, 10): "
            f"8 labels for 8 records ({8 * STEPS} positions)*"
        ]
    )
    assert "ValueError" not in result.stdout.str()


CONFTEST = """
from pytest_qaccuracy.metrics import register_metric, unregister_metric
from pytest_qaccuracy.metrics.base import Metric


def pytest_unconfigure(config):
    unregister_metric("boom")  # the registry is global: in-process runs must not leak it


@register_metric
class Boom(Metric):
    name = "boom"
    formula = "raises on layer 'relu'"

    def update(self, pair):
        if pair.ref.shape[1:] == (8, 8, 8):
            raise RuntimeError("boom on purpose")

    def merge(self, other):
        pass

    def result(self):
        return 0.0, None
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_an_exception_is_one_failed_check_line(project, verbose):
    project.makeconftest(CONFTEST)
    project.makepyfile(
        test_boom="""
import pytest


@pytest.mark.qaccuracy(fp32="det.onnx", quantized="det.qdq.onnx", data="det.npz", metrics=["boom"])
def test_det(qaccuracy):
    qaccuracy.check()
"""
    )
    result = project.runpytest("-p", "no:cacheprovider", *(["-v"] if verbose else []))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["pair 'det.qdq': layer 'fr': RuntimeError: boom on purpose"])
    has_traceback = "Traceback (most recent call last)" in result.stdout.str()
    assert has_traceback == verbose and "During handling" not in result.stdout.str()
    result.stdout.fnmatch_lines(["det.qdq: FAILED*"])  # recorded: the summary lists the pair
