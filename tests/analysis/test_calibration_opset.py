"""Calibrated models onnxruntime loads whatever the opset, and the KL search."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from pytest_qaccuracy.analysis.calibration import CalibrationOptions, calibrate
from pytest_qaccuracy.analysis.calibration.observers import HistogramObserver
from pytest_qaccuracy.analysis.calibration.ranges import KL_EPS, WindowSums, kl_threshold
from pytest_qaccuracy.cli import main
from pytest_qaccuracy.errors import InputError
from tests.modelzoo import conv_net, random_inputs, write_h5


@pytest.fixture(scope="module")
def opset11(tmp_path_factory):
    root = tmp_path_factory.mktemp("opset11")
    return conv_net(root / "net11.onnx", opset=11), write_h5(root / "d.h5", random_inputs(6))


def test_per_channel_on_opset_11_is_converted_to_13_and_loads(opset11, tmp_path, capsys):
    fp32, data = opset11
    out = tmp_path / "net.qdq.onnx"
    assert main(["calibrate", str(fp32), "--data", str(data), "--per-channel", "--out", str(out)]) == 0
    assert "the model is converted from opset 11 to 13 before quantization" in capsys.readouterr().out
    model = onnx.load(str(out))
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [13]
    axes = [a.i for n in model.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute if a.name == "axis"]
    assert axes  # per-channel weights really are per channel
    x = random_inputs(2)[:, 0].reshape(2, 3, 16, 16)
    f = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    q = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert float((f * q).sum() / np.sqrt((f * f).sum() * (q * q).sum())) > 0.99


def test_per_tensor_keeps_the_opset(opset11, tmp_path):
    fp32, data = opset11
    calibrate(fp32, data, tmp_path / "q.onnx", CalibrationOptions())
    model = onnx.load(str(tmp_path / "q.onnx"))
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [11]
    ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"])


def test_a_model_onnx_cannot_convert_is_refused_in_one_line(opset11, tmp_path, monkeypatch):
    from onnx import version_converter

    def fail(model, version):
        raise RuntimeError("No Adapter From Version $11 for Foo\nmore text")

    monkeypatch.setattr(version_converter, "convert_version", fail)
    fp32, data = opset11
    with pytest.raises(InputError) as info:
        calibrate(fp32, data, tmp_path / "q.onnx", CalibrationOptions(per_channel=True))
    assert str(info.value) == (
        f"{fp32}: per-channel weights need opset 13 (DequantizeLinear axis), and onnx cannot convert this "
        "opset 11 model (No Adapter From Version $11 for Foo); convert it, or quantize per tensor"
    )
    assert not (tmp_path / "q.onnx").exists()


def _window_kl(hist: np.ndarray, i: int, qbins: int) -> float:
    """MXNet's loop body as written there: the window of ``2i+1`` central bins, P and Q built bin by bin."""
    zero = hist.size // 2
    start, stop = zero - i, zero + i + 1
    window = hist[start:stop].astype(float)
    p = window.copy()
    p[0] += hist[:start].sum()
    p[-1] += hist[stop:].sum()
    width = window.size // qbins
    q = np.zeros(window.size)
    for g in range(qbins):
        lo, hi = g * width, (g + 1) * width if g < qbins - 1 else window.size
        nz = p[lo:hi] != 0
        if nz.sum():
            q[lo:hi] = np.where(nz, window[lo:hi].sum() / nz.sum(), 0.0)

    def smooth(d):
        zeros = d == 0
        if zeros.all():
            return None
        out = np.where(zeros, KL_EPS, d - KL_EPS * zeros.sum() / (~zeros).sum())
        return out if (out > 0).all() else None

    ps, qs = smooth(p), smooth(q)
    if ps is None or qs is None:
        return math.inf
    ps, qs = ps / ps.sum(), qs / qs.sum()
    return float((ps * np.log(ps / qs)).sum())


def _exhaustive_kl(hist: np.ndarray, edges: np.ndarray, qbins: int) -> tuple[float, float]:
    """MXNet's loop as written there: every window, each P and Q built bin by bin."""
    zero, best = hist.size // 2, (float(edges[-1]), math.inf)
    for i in range(qbins // 2, zero + 1):
        kl = _window_kl(hist, i, qbins)
        if kl < best[1]:
            best = (float(edges[zero + i + 1]), kl)
    return best


@pytest.mark.parametrize("shape", ["normal", "relu", "small-counts", "outliers", "sparse"])
def test_window_sums_give_every_window_the_divergence_of_the_bin_by_bin_loop(shape):
    """The coarse-to-fine search's divergences come from prefix sums (a series in the smoothing shift,
    bin by bin where that shift is large): each window as the loop computes it, undefined ones included."""
    rng = np.random.default_rng(7)
    x = {
        "normal": rng.standard_normal(200000),
        "relu": np.maximum(rng.standard_normal(200000), 0),  # half the bins empty: smoothing shifts P
        "small-counts": rng.standard_normal(3000),  # most bins hold a few values
        "outliers": np.r_[rng.standard_normal(50000), rng.standard_cauchy(40) * 50],
        "sparse": rng.choice([-2.0, -0.5, 0.0, 1.0, 3.0], 500),  # many empty bins: a large shift
    }[shape]
    hist = HistogramObserver(float(np.abs(x).max()), 1025)
    hist.update(x.astype(np.float32))
    counts = hist.counts.astype(np.float64)
    halves = np.arange(63 // 2, counts.size // 2 + 1)
    got = WindowSums(counts).divergences(counts.size // 2, halves, 63)
    want = np.array([_window_kl(counts, int(i), 63) for i in halves])
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-8, atol=1e-12)  # float64 prefix sums


@pytest.mark.parametrize("shape", ["normal", "relu", "bimodal", "spike"])
def test_kl_search_against_the_exhaustive_loop(shape):
    rng = np.random.default_rng(3)
    x = {
        "normal": rng.standard_normal(20000),
        "relu": np.maximum(rng.standard_normal(20000), 0),
        "bimodal": np.r_[rng.normal(-3, 0.3, 3000), rng.normal(4, 1, 3000)],
        "spike": np.r_[rng.standard_normal(3000), 300.0],  # few values: searched exhaustively
    }[shape]
    hist = HistogramObserver(float(np.abs(x).max()), 1025)
    hist.update(x.astype(np.float32))
    golden = _exhaustive_kl(hist.counts, hist.edges, 63)
    exhaustive = kl_threshold(hist.counts, hist.edges, 63, stride=1)
    assert exhaustive[0] == golden[0] and exhaustive[1] == pytest.approx(golden[1], rel=1e-9)
    assert kl_threshold(hist.counts, hist.edges, 63) == exhaustive  # few pairs: the default is exhaustive
    fast = kl_threshold(hist.counts, hist.edges, 63, stride=8, exhaustive=0)  # 482 windows: coarse to fine
    assert fast[1] == pytest.approx(golden[1], rel=0.01)  # within 1 % of the smallest divergence
