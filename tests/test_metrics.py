"""Metrics: ONE's goldens, hand-computed values, ORT's SQNR, streaming merges, undefined values, registry."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnxruntime.quantization.qdq_loss_debug import compute_signal_to_quantization_noice_ratio

from pytest_qaccuracy.errors import MetricError
from pytest_qaccuracy.metrics import (
    StatsMetric,
    TensorPair,
    available_metrics,
    get_metric,
    parse_metric_names,
    register_metric,
    unregister_metric,
)


def _value(name: str, ref, test, **pair_kwargs):
    metric = get_metric(name)()
    metric.update(TensorPair(np.asarray(ref, np.float32), np.asarray(test, np.float32), **pair_kwargs))
    return metric.result()


# Samsung ONE visq-unittest goldens: fp32 records {ones(16), zeros(16)} vs quantized {zeros, zeros}.
ONE_REF = np.stack([np.ones(16), np.zeros(16)])
ONE_TEST = np.zeros((2, 16))


def test_one_visq_goldens():
    assert _value("mse", ONE_REF, ONE_TEST) == (0.5, None)
    assert _value("tae", ONE_REF, ONE_TEST) == (8.0, None)
    value, reason = _value("srmse", ONE_REF, ONE_TEST, scale=2.0)
    assert reason is None and value == pytest.approx(math.sqrt(0.5) / 2, rel=1e-15)


def test_hand_computed_values():
    # two records of four elements; every number below is worked out by hand
    ref = [[1.0, -2.0, 3.0, 0.0], [0.5, 0.5, -1.0, 2.0]]
    test = [[1.5, -2.0, 2.0, 0.0], [0.5, 1.0, -1.0, 2.0]]
    # record 0 diffs: -0.5, 0, 1, 0 ; record 1 diffs: 0, -0.5, 0, 0
    assert _value("mse", ref, test)[0] == pytest.approx(((0.25 + 1) / 4 + 0.25 / 4) / 2)
    assert _value("tae", ref, test)[0] == pytest.approx((1.5 + 0.5) / 2)
    assert _value("max_abs", ref, test)[0] == pytest.approx(1.0)
    # MPEIR: record 0: 1 / (3 - -2 + 1e-6); record 1: 0.5 / (2 - -1 + 1e-6)
    assert _value("mpeir", ref, test)[0] == pytest.approx((1 / (5 + 1e-6) + 0.5 / (3 + 1e-6)) / 2)
    # MRE: sum|d| = 2.0, sum|f| = 6 + 4 = 10
    assert _value("mre", ref, test)[0] == pytest.approx(0.2)
    # cosine: f.q = (1.5 + 4 + 6) + (0.25 + 0.5 + 1 + 4) = 17.25; |f|^2 = 14 + 5.5; |q|^2 = 10.25 + 6.25
    assert _value("cosine", ref, test)[0] == pytest.approx(17.25 / math.sqrt(19.5 * 16.5))
    # SQNR: |f|^2 = 19.5, |d|^2 = 1.5
    assert _value("sqnr", ref, test)[0] == pytest.approx(20 * math.log10(math.sqrt(19.5) / math.sqrt(1.5)))
    # LSB with scale 0.25: max |d| = 1 -> 4 steps
    assert _value("lsb", ref, test, scale=0.25)[0] == pytest.approx(4.0)


def test_mpeir_of_a_constant_record_divides_by_the_epsilon():
    """docs/metrics.md: mean over records of max|f - q| / (max(f) - min(f) + 1e-6). A constant fp32
    record has range 0, so its term is max|f - q| / 1e-6: very large, but finite."""
    ref = [[2.0, 2.0, 2.0, 2.0], [0.0, 1.0, 2.0, 3.0]]
    test = [[2.0, 2.5, 2.0, 2.0], [0.0, 1.0, 2.0, 3.75]]
    constant_term = 0.5 / (0.0 + 1e-6)  # 500,000
    varying_term = 0.75 / (3.0 + 1e-6)
    value, reason = _value("mpeir", ref, test)
    assert reason is None and math.isfinite(value)
    assert value == pytest.approx((constant_term + varying_term) / 2, rel=1e-9)
    assert _value("mpeir", [[2.0, 2.0]], [[2.0, 2.0]])[0] == 0.0  # no error: 0 / 1e-6


def test_lsb_per_channel_divides_each_channel_by_its_own_step():
    ref = np.zeros((1, 2, 3), np.float32)
    test = np.array([[[0.1, 0.0, 0.0], [0.0, 0.3, 0.0]]], np.float32)
    # channel 0 (axis 1) has step 0.1 -> 1 step; channel 1 has step 0.05 -> 6 steps
    value, _ = _value("lsb", ref, test, scale=np.array([0.1, 0.05]), axis=1)
    assert value == pytest.approx(6.0, rel=1e-6)
    assert _value("srmse", ref, test, scale=np.array([0.1, 0.05]), axis=1) == (
        None,
        "per-channel scale: SRMSE is defined for a per-tensor scale",
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sqnr_matches_onnxruntime_qdq_loss_debug(seed):
    rng = np.random.default_rng(seed)
    batches_f = [rng.standard_normal((4, 8, 5, 5)).astype(np.float32) for _ in range(3)]
    batches_q = [f + rng.normal(0, 0.05, f.shape).astype(np.float32) for f in batches_f]
    metric = get_metric("sqnr")()
    for f, q in zip(batches_f, batches_q, strict=True):
        metric.update(TensorPair(f, q))
    expected = compute_signal_to_quantization_noice_ratio(batches_f, batches_q)
    assert metric.value() == pytest.approx(expected, rel=1e-6)


def test_identical_tensors_give_finite_sqnr_like_onnxruntime():
    x = np.linspace(-1, 1, 50, dtype=np.float32).reshape(2, 25)
    assert _value("sqnr", x, x)[0] == pytest.approx(compute_signal_to_quantization_noice_ratio(x, x), rel=1e-6)


@pytest.mark.parametrize("name", ["mse", "mpeir", "tae", "srmse", "mre", "max_abs", "lsb", "clipped", "cosine", "sqnr"])
def test_batches_and_merges_agree_with_one_pass(name):
    rng = np.random.default_rng(7)
    ref = rng.standard_normal((10, 3, 4)).astype(np.float32)
    test = (ref + rng.normal(0, 0.1, ref.shape)).astype(np.float32)
    quant = {"scale": 0.01, "zero_point": np.int8(0)}  # a range of +-1.28: clipped is not 0
    whole = get_metric(name)()
    whole.update(TensorPair(ref, test, **quant))
    left, right = get_metric(name)(), get_metric(name)()
    for start in (0, 3):
        left.update(TensorPair(ref[start : start + 3], test[start : start + 3], **quant))
    right.update(TensorPair(ref[6:], test[6:], **quant))
    left.merge(right)
    assert left.value() == pytest.approx(whole.value(), rel=1e-12)


def test_undefined_values_carry_a_reason():
    zeros, ones = np.zeros((2, 3)), np.ones((2, 3))
    assert _value("cosine", zeros, ones) == (None, "the fp32 tensor is all zeros")
    assert _value("cosine", ones, zeros) == (None, "the quantized tensor is all zeros")
    assert _value("cosine", zeros, zeros) == (1.0, None)
    assert _value("mre", zeros, ones) == (None, "the fp32 tensor is all zeros")
    assert _value("mre", zeros, zeros) == (0.0, None)
    assert _value("srmse", ones, ones) == (None, "the quantized tensor has no scale")
    assert _value("lsb", ones, ones) == (None, "the quantized tensor has no scale")
    assert _value("clipped", ones, ones, scale=0.1) == (None, "the quantized tensor has no scale and zero point")


@pytest.mark.parametrize("name", ["mse", "mpeir", "tae", "srmse", "mre", "max_abs", "lsb", "cosine", "sqnr"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_in_any_batch_makes_every_metric_undefined_with_a_reason(name, bad):
    """Not ``nan``, and not ``-inf`` (the builtin ``max(-inf, nan)`` is ``-inf``), whichever batch holds it.
    (``clipped`` reads only the fp32 values, which are finite here.)"""
    ref = np.linspace(0.5, 2.0, 8, dtype=np.float32).reshape(2, 4)
    poisoned = ref.copy()
    poisoned[1, 2] = bad
    quant = {"scale": 0.01, "zero_point": np.int8(0)}
    for first, second in ((poisoned, ref), (ref, poisoned)):
        metric, other = get_metric(name)(), get_metric(name)()
        metric.update(TensorPair(ref, first, **quant))
        metric.update(TensorPair(ref, second, **quant))
        assert metric.result() == (None, "NaN or Inf in the compared values")
        other.update(TensorPair(ref, ref * 0.9, **quant))
        other.merge(metric)
        assert other.result() == (None, "NaN or Inf in the compared values")


def _saturated_golden(f: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, axis: int | None) -> int:
    """ONNX QuantizeLinear's own definition, element by element in float64: rint(f / scale) + zero_point
    (half to even) outside the zero point type's range."""
    info = np.iinfo(zero_point.dtype)
    if axis is not None:
        shape = [1] * f.ndim
        shape[axis] = -1
        scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
    t = np.rint(f.astype(np.float64) / scale) + zero_point.astype(np.int64)
    return int(np.count_nonzero((t < info.min) | (t > info.max)))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16])
@pytest.mark.parametrize("per_channel", [False, True])
def test_clipped_is_the_share_that_quantizelinear_saturates(dtype, per_channel):
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    f = rng.standard_normal((5, 3, 7, 4)) * (info.max - info.min) / 6
    if per_channel:
        scale, zp = np.array([0.5, 1.0, 2.0]), np.array([info.min // 2 + info.max // 2, 0, 3], dtype=dtype)
        if info.min == 0:
            zp = np.array([info.max // 2, 0, 3], dtype=dtype)
    else:
        scale, zp = np.array([1.0]), np.array([info.max // 4 if info.min == 0 else -3], dtype=dtype)
    # values exactly on the rounding boundaries: qmax + 0.5 saturates (to even), qmin - 0.5 does not
    c_scale, c_zp = scale[0], float(zp[0])
    f[0, 0, 0, :4] = [(info.max + 0.5 - c_zp) * c_scale, (info.min - 0.5 - c_zp) * c_scale,
                      (info.max + 0.49 - c_zp) * c_scale, (info.min - 0.51 - c_zp) * c_scale]  # fmt: skip
    f = f.astype(np.float32)
    axis = 1 if per_channel else None
    value, reason = _value("clipped", f, f, scale=scale if per_channel else scale[0], axis=axis, zero_point=zp)
    golden = _saturated_golden(f, scale, zp, axis)
    assert reason is None and 0 < golden < f.size
    assert value == golden / f.size
    per_record = get_metric("clipped")().record_values(
        TensorPair(f, f, scale=scale if per_channel else scale[0], axis=axis, zero_point=zp)
    )
    np.testing.assert_array_equal(per_record * f[0].size, [_saturated_golden(r[None], scale, zp, axis) for r in f])


def test_clipped_counts_each_record_and_int8_range_is_asymmetric():
    """int8 with zero point 0 and scale 0.01 holds [-1.285, 1.275): the first record lies inside it."""
    f = np.stack([np.linspace(-1, 1, 21), np.linspace(-2, 2, 21)]).astype(np.float32)
    pair = TensorPair(f, f, scale=0.01, zero_point=np.int8(0))
    outside = int(np.count_nonzero((f[1] < -1.285) | (f[1] >= 1.275)))
    assert pair.saturated.tolist() == [0, outside] and outside == 8


@pytest.mark.parametrize("name", ["mse", "mpeir", "tae", "srmse", "mre", "max_abs", "lsb", "clipped", "cosine", "sqnr"])
def test_no_records_is_undefined_for_every_metric(name):
    assert get_metric(name)().result() == (None, "no records")
    merged = get_metric(name)()
    merged.merge(get_metric(name)())
    assert merged.result() == (None, "no records")


def test_record_values_are_per_record():
    ref = np.array([[1.0, 1.0], [1.0, 1.0]], np.float32)
    test = np.array([[1.0, 1.0], [0.0, 1.0]], np.float32)
    pair = TensorPair(ref, test)
    np.testing.assert_allclose(get_metric("mse")().record_values(pair), [0.0, 0.5])
    np.testing.assert_allclose(get_metric("cosine")().record_values(pair), [1.0, 1 / math.sqrt(2)])


def test_state_is_fixed_size():
    metric = get_metric("mse")()
    before = dict(metric.state)
    for _ in range(5):
        metric.update(TensorPair(np.ones((3, 10), np.float32), np.zeros((3, 10), np.float32)))
    assert metric.state.keys() == before.keys()
    assert metric.state["records"] == 15


def test_registry_accepts_user_metrics_and_rejects_bad_ones():
    class Bias(StatsMetric):
        """Mean of q - f over all elements."""

        name = "bias"
        formula = "sum(q - f) / count over all elements of all records"
        sums = ("diff", "count")

        def fold(self, stats, pair):
            return {"diff": float((pair.test.astype(np.float64) - pair.ref).sum()), "count": pair.ref.size}

        def compute(self):
            return self.state["diff"] / self.state["count"], None

    register_metric(Bias)
    try:
        assert "bias" in available_metrics()
        assert _value("bias", [[0.0, 0.0]], [[1.0, 3.0]]) == (2.0, None)
        with pytest.raises(MetricError, match="metric 'bias' is already registered"):
            register_metric(Bias)
    finally:
        unregister_metric("bias")
    with pytest.raises(MetricError, match="unknown metric 'nope'; available: mse, mpeir"):
        get_metric("nope")
    with pytest.raises(MetricError, match="unknown metric 'nope'"):
        parse_metric_names("mse, nope")
    assert parse_metric_names(" SQNR,cosine,sqnr ") == ["sqnr", "cosine"]


# -- RecordStats: fields computed on demand -------------------------------------------------------------


def _golden_stats(ref: np.ndarray, test: np.ndarray) -> dict[str, np.ndarray]:
    """Every RecordStats field in float64, computed directly (no blocks, no chunks)."""
    f = ref.reshape(len(ref), -1).astype(np.float64)
    q = test.reshape(len(test), -1).astype(np.float64)
    d = f - q
    return {
        "sq_err": (d * d).sum(axis=1),
        "abs_err": np.abs(d).sum(axis=1),
        "max_abs_err": np.abs(d).max(axis=1),
        "ref_sq": (f * f).sum(axis=1),
        "test_sq": (q * q).sum(axis=1),
        "ref_abs": np.abs(f).sum(axis=1),
        "ref_min": f.min(axis=1),
        "ref_max": f.max(axis=1),
    }


@pytest.mark.parametrize(
    "shape",
    [(1, 3, 100, 1000), (3, 70001), (40, 4096 * 3 + 5), (8, 5)],
    ids=["one record, many blocks", "odd length", "many records", "tiny"],
)
def test_record_stats_equal_a_direct_float64_computation(shape):
    """Block boundaries (tails shorter than a block) and the order fields are asked in change nothing."""
    from pytest_qaccuracy.metrics.pair import FIELDS

    rng = np.random.default_rng(sum(shape))
    ref = rng.standard_normal(shape).astype(np.float32) * 3
    test = (ref + rng.uniform(-0.05, 0.05, shape)).astype(np.float32)
    golden = _golden_stats(ref, test)
    stats = TensorPair(ref, test).stats
    stats.prepare(["sq_err", "ref_sq"])  # the rest is computed on first read
    for name in FIELDS:
        np.testing.assert_allclose(getattr(stats, name), golden[name], rtol=1e-6, err_msg=name)
    assert stats.count == ref[0].size


def test_a_user_metric_may_read_fields_it_did_not_declare():
    class RefPeak(StatsMetric):
        name = "test_ref_peak"
        formula = "max over records of max(f)"
        maxima = ("peak",)

        def fold(self, stats, pair):
            return {"peak": stats.ref_max.max()}  # ref_max is not in stats_fields

        def compute(self):
            return self.state["peak"], None

    register_metric(RefPeak)
    try:
        ref = np.arange(24, dtype=np.float32).reshape(2, 12)
        assert _value("test_ref_peak", ref, ref * 0) == (23.0, None)
    finally:
        unregister_metric("test_ref_peak")


@pytest.mark.parametrize("name", ["mse", "mpeir", "tae", "srmse", "cosine", "sqnr", "mre", "max_abs", "lsb", "clipped"])
def test_a_builtin_metric_reads_exactly_the_fields_it_declares(name):
    """An undeclared field would cost a pass of its own; a declared one nobody reads, a wasted pass."""
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((3, 2, 50)).astype(np.float32)
    pair = TensorPair(ref, ref + np.float32(0.01), scale=0.02, zero_point=np.int8(0))
    metric = get_metric(name)()
    metric.update(pair)
    metric.record_values(pair)
    assert set(pair.stats._values) == set(metric.stats_fields)
