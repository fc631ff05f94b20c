"""Metric edge cases the main metric tests do not reach: one-element and empty records, zero
references, scales that are missing or zero, merges into an empty metric, rounding at +-1.

Each expected value follows from the formula in docs/metrics.md, worked out by hand.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from pytest_qaccuracy.errors import MetricError
from pytest_qaccuracy.metrics import StatsMetric, TensorPair, get_metric, parse_metric_names, register_metric


def _pair(ref, test, **kwargs) -> TensorPair:
    return TensorPair(np.asarray(ref, np.float32), np.asarray(test, np.float32), **kwargs)


def _value(name: str, *pairs: TensorPair):
    metric = get_metric(name)()
    for pair in pairs:
        metric.update(pair)
    return metric.result()


def test_one_element_records() -> None:
    pair = _pair([[2.0], [0.0]], [[1.0], [0.0]], scale=0.5)  # squared errors 1 and 0
    np.testing.assert_array_equal(get_metric("mse")().record_values(pair), [1.0, 0.0])
    assert _value("mse", pair) == (0.5, None)
    assert _value("srmse", pair) == (pytest.approx(math.sqrt(0.5) / 0.5, rel=1e-15), None)


def test_records_without_elements() -> None:
    empty = _pair(np.zeros((2, 0)), np.zeros((2, 0)), scale=1.0)
    assert _value("max_abs", empty) == (0.0, None)
    assert _value("lsb", empty) == (0.0, None)


def test_relative_error_of_a_zero_reference() -> None:
    pair = _pair([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]], [[1.0, 0.0], [1.0, 1.5], [0.0, 0.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 1/0 and 0/0 must not warn
        values = get_metric("mre")().record_values(pair)
    np.testing.assert_array_equal(values, [np.inf, 0.25, 0.0])


def test_cosine_records_with_zeros() -> None:
    pair = _pair([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [1.0, 0.0]], [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values = get_metric("cosine")().record_values(pair)
    np.testing.assert_array_equal(values, [1.0, 0.0, 0.0, 0.0])  # both silent: identical; one: nothing shared


@pytest.mark.parametrize(
    ("ref", "factor", "expected"),
    [
        ([0.3455841839313507, 0.8216181397438049, 0.3304370641708374, -1.3031572103500366, 0.9053558707237244],
         1.5583161115646362, 1.0),
        ([-0.7364540696144104, -0.16290995478630066, -0.4821193218231201, 0.5988461971282959, 0.03972210735082626],
         -1.5077824592590332, -1.0),
    ],
)  # fmt: skip
def test_cosine_of_a_multiple_stays_within_one(ref, factor, expected) -> None:
    """q = c*f has cosine exactly +-1; float32 rounding takes the formula just past it (found by search)."""
    f = np.asarray([ref], np.float32)
    pair = TensorPair(f, (f * np.float32(factor)).astype(np.float32))
    assert get_metric("cosine")().record_values(pair)[0] == expected


def test_sqnr_per_record() -> None:
    pair = _pair([[2.0, 0.0], [3.0, 4.0]], [[1.0, 0.0], [3.0, 4.5]])  # |f| = 2, 5; |f - q| = 1, 0.5
    np.testing.assert_allclose(get_metric("sqnr")().record_values(pair), [20 * math.log10(2), 20.0], rtol=1e-12)


def test_srmse_needs_one_positive_scale() -> None:
    assert _value("srmse", _pair([[1.0]], [[0.0]])) == (None, "the quantized tensor has no scale")
    assert _value("srmse", _pair([[1.0]], [[0.0]], scale=0.0)) == (None, "non-positive scale 0.0")
    per_channel = _pair([[1.0, 1.0]], [[0.0, 0.0]], scale=np.array([0.5, 0.25]))
    assert _value("srmse", per_channel)[0] is None


@pytest.mark.parametrize("name", ["srmse", "lsb"])
def test_a_scale_survives_a_merge_into_an_empty_metric(name) -> None:
    updated = get_metric(name)()
    updated.update(_pair([[1.0, 0.0]], [[0.5, 0.0]], scale=0.25))
    merged = get_metric(name)()
    merged.merge(updated)
    assert merged.result() == updated.result() and merged.result()[0] is not None


def test_lsb_reports_fractions_of_a_step() -> None:
    assert _value("lsb", _pair([[1.0, 2.0]], [[1.0625, 2.0]], scale=0.25)) == (0.25, None)


def test_metric_names_and_registry_errors() -> None:
    with pytest.raises(MetricError, match=r"^no metric named; available: mse, "):
        parse_metric_names(" , ")
    assert parse_metric_names(["SQNR", " mse ", "sqnr"]) == ["sqnr", "mse"]  # a list works like "a,b"

    def metric(name, formula="x"):
        return type("M", (StatsMetric,), {"name": name, "formula": formula, "sums": ("s",)})

    for bad in ("", "Bad", "a-b", None):
        with pytest.raises(MetricError, match=rf"^metric M: name must be a lower-case identifier, got {bad!r}$"):
            register_metric(metric(bad))
    with pytest.raises(MetricError, match=r"^metric 'ok_name': a formula string is required"):
        register_metric(metric("ok_name", formula=""))
    with pytest.raises(ValueError, match=r"^reference shape \(2,\) differs from test shape \(3,\)$"):
        TensorPair(np.zeros(2, np.float32), np.zeros(3, np.float32))


def test_unregister_removes_and_tolerates_unknown_names() -> None:
    from pytest_qaccuracy.metrics import available_metrics, unregister_metric

    register_metric(type("Tmp", (StatsMetric,), {"name": "tmp_metric", "formula": "x", "sums": ("s",)}))
    unregister_metric("tmp_metric")
    assert "tmp_metric" not in available_metrics()
    unregister_metric("never_registered")  # nothing to remove: no error


def test_half_precision_inputs_are_summed_in_float32() -> None:
    """300^2 = 90000 overflows float16 (max 65504): the sums must not be taken in the input type."""
    pair = TensorPair(np.array([[300.0, 0.0]], np.float16), np.array([[0.0, 0.0]], np.float16))
    assert _value("mse", pair) == (45000.0, None)
    assert _value("sqnr", pair)[0] == pytest.approx(0.0, abs=1e-9)  # all of the signal is error


def test_overflowing_sums_are_undefined_without_warnings() -> None:
    big = np.full((1, 4), 3e38, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an Inf sum is reported as undefined, not warned about
        value, reason = _value("mse", TensorPair(big, big * np.float32(0.5)))  # (1.5e38)^2 overflows
    assert value is None and reason


def test_records_without_elements_have_one_value_each() -> None:
    stats = TensorPair(np.zeros((3, 0), np.float32), np.zeros((3, 0), np.float32)).stats
    np.testing.assert_array_equal(stats.max_abs_err, [0.0, 0.0, 0.0])
    assert TensorPair(np.zeros((1, 2), np.float32), np.zeros((1, 2), np.float32)).first_record == 0


@pytest.mark.parametrize("shape", [(2, 0), ()])
def test_scores_without_a_class_axis_are_refused(shape) -> None:
    from pytest_qaccuracy.metrics.topk import as_scores

    with pytest.raises(ValueError) as info:
        as_scores(np.zeros(shape, np.float32), "logits")
    assert str(info.value) == f"logits: expected class scores (records, classes), got shape {shape}"


def test_top_k_scores_of_different_class_counts_are_refused() -> None:
    from pytest_qaccuracy.metrics.topk import TopKCounter

    counter = TopKCounter([1])
    with pytest.raises(ValueError) as info:
        counter.update(np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32))
    assert str(info.value) == "score shapes differ: actual (2, 4), reference (2, 3)"
    assert counter.records == 0


def test_a_float_zero_point_has_no_integer_range_to_clip_to() -> None:
    """A float zero point (an FP8 QuantizeLinear's, say) has no qmin/qmax: clipped is undefined, while
    the same values with an int8 zero point clip (2 at scale 0.01 is past 1.275)."""
    f = np.array([[-2.0, 0.0, 2.0]], np.float32)
    assert _pair(f, f, scale=0.01, zero_point=np.float32(0)).range_bounds is None
    assert _value("clipped", _pair(f, f, scale=0.01, zero_point=np.float32(0))) == (
        None,
        "the quantized tensor has no scale and zero point",
    )
    assert _value("clipped", _pair(f, f, scale=0.01, zero_point=np.int8(0))) == (2 / 3, None)


# -- outside_tolerance: the elements a tolerance check reports ---------------------------------------


def test_outside_tolerance_compares_in_float64_and_the_bound_itself_is_inside() -> None:
    """float32 1e8 - 1 rounds to 1e8 in float32; in float64 it is 99999999, inside an atol of
    99999999.5. A difference exactly at ``atol + rtol * |expected|`` is inside."""
    from pytest_qaccuracy.metrics.error import outside_tolerance

    big, one = np.array([1e8], np.float32), np.array([1.0], np.float32)
    assert not outside_tolerance(big, one, 0.0, 99999999.5)[0].any()
    assert not outside_tolerance(one, big, 0.0, 99999999.5)[0].any()
    bad, diff, rel, excess = outside_tolerance(np.array([1.5, 3.0]), np.array([1.0, 1.0]), 0.25, 0.25)
    assert bad.tolist() == [False, True]  # 0.5 <= 0.25 + 0.25 * 1: on the bound, inside
    assert diff.tolist() == [2.0] and rel.tolist() == [2.0] and excess.tolist() == [1.5]


def test_outside_tolerance_relative_difference_and_excess_by_hand() -> None:
    """rel = |a - e| / |e|, inf where e is 0; excess = diff - bound, NaN (a NaN value) as inf; no
    numpy warning for inf - inf, 0 * inf or a division by zero."""
    from pytest_qaccuracy.metrics.error import outside_tolerance

    actual = np.array([1.0, 3.0, 7.0, np.nan, np.inf, 0.5], np.float64)
    expected = np.array([0.0, 1.0, 2.0, 1.0, np.inf, 0.5], np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bad, diff, rel, excess = outside_tolerance(actual, expected, 0.0, 0.1)
    assert bad.tolist() == [True, True, True, True, True, False]  # inf - inf is NaN: outside
    assert diff[:3].tolist() == [1.0, 2.0, 5.0] and np.isnan(diff[3:]).all()
    assert rel[:3].tolist() == [math.inf, 2.0, 2.5] and np.isnan(rel[3:]).all()
    assert excess.tolist() == [0.9, 1.9, 4.9, math.inf, math.inf]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert outside_tolerance(np.array([np.inf]), np.array([np.inf]), 1.0, 0.0)[0].tolist() == [True]


def test_a_scratch_slot_is_reused_grown_and_kept_per_slot_and_per_thread() -> None:
    """``scratch`` hands out the same memory for a slot until a larger array is asked for; another
    slot or another thread never shares it; the view has the shape and dtype asked for. Run in fresh
    threads: a thread's buffers outlive a test (a second run in one process would find them grown)."""
    import threading

    from pytest_qaccuracy.metrics.pair import scratch

    def in_a_fresh_thread(work):
        got, failed = [], []

        def run():
            try:
                got.append(work())
            except BaseException as exc:  # handed back to the test's thread
                failed.append(exc)

        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
        if failed:
            raise failed[0]
        return got[0]

    def slots():
        first = scratch(7, (2, 3), np.float32)
        assert first.shape == (2, 3) and first.dtype == np.float32
        again = scratch(7, (3, 2), np.float32)
        assert np.shares_memory(first, again)  # same slot, no larger: reused
        assert np.shares_memory(scratch(7, (6,), np.int32), again)  # another dtype of the same size
        other = scratch(8, (2, 3), np.float32)
        assert not np.shares_memory(other, again)
        grown = scratch(7, (4, 4), np.float64)
        assert grown.shape == (4, 4) and grown.dtype == np.float64
        assert not np.shares_memory(grown, again)  # 128 bytes > 24: a new buffer
        assert np.shares_memory(scratch(7, (2,), np.float32), grown)  # and the new one is kept
        return grown

    grown = in_a_fresh_thread(slots)
    assert not np.shares_memory(in_a_fresh_thread(lambda: scratch(7, (2,), np.float32)), grown)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_record_sums_leave_the_dequantized_values_slot_alone_and_keep_the_dtype(dtype) -> None:
    """The comparison dequantizes the test values into scratch slot 2 (``analysis/compare.py``); the
    per-record sums work in slots 0 and 1, so q is intact while they run, and float64 values are
    summed as float64 (a float32 work array would round |f| and f - q)."""
    from pytest_qaccuracy.metrics.pair import _compute, scratch

    rng = np.random.default_rng(5)
    f = (rng.standard_normal((3, 50)) * (1 + 1e-9)).astype(dtype)
    q = scratch(2, f.shape, dtype)
    q[...] = f + rng.standard_normal(f.shape).astype(dtype) * dtype(1e-3)
    kept = q.copy()
    got = _compute(f, q, frozenset({"ref_abs", "sq_err", "abs_err", "max_abs_err"}))
    assert np.array_equal(q, kept)
    d = f.astype(np.float64) - kept.astype(np.float64)
    # float64 rows differ from numpy's sums by the order of addition only; float32 rows by rounding
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(got["ref_abs"], np.abs(f.astype(np.float64)).sum(axis=1), rtol=tol)
    np.testing.assert_allclose(got["sq_err"], (d * d).sum(axis=1), rtol=tol)
    np.testing.assert_allclose(got["abs_err"], np.abs(d).sum(axis=1), rtol=tol)
    assert got["max_abs_err"].tolist() == np.abs(f - kept).max(axis=1).astype(np.float64).tolist()


def test_topk_ties_go_to_the_lower_class_index_among_many() -> None:
    from pytest_qaccuracy.metrics.topk import topk_indices

    scores = np.tile(np.array([0.0, 1.0, 2.0, 3.0], np.float32), (2, 25))  # 100 classes, 4 values
    assert topk_indices(scores, 5).tolist() == [[3, 7, 11, 15, 19]] * 2
    assert topk_indices(-scores.astype(np.float64), 3).tolist() == [[0, 4, 8]] * 2
