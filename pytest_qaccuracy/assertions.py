"""Assertion helpers for quantized model outputs, usable with or without the pytest plugin.

Each helper raises :class:`AssertionError` whose first line says what failed and by how much
(``cosine 0.981234 < 0.99 for output 'logits'``), followed by where the tolerance came from, the
worst records and the worst elements (numpy's layout: rule first, then counts, then offenders).
Nothing here imports pytest; ``__tracebackhide__`` keeps the helpers out of pytest tracebacks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pytest_qaccuracy.metrics.error import outside_tolerance
from pytest_qaccuracy.metrics.pair import TensorPair
from pytest_qaccuracy.metrics.similarity import Cosine
from pytest_qaccuracy.metrics.topk import TopKCounter, as_scores, in_topk, topk_indices
from pytest_qaccuracy.numbers import format_number

#: Offenders listed in a failure message (records, elements).
SHOW = 5


def fmt(value: float | None) -> str:
    """A number in a failure message: 6 significant digits, ``None`` as ``undefined``."""
    return format_number(value, missing="undefined")


def failure_message(first_line: str, source: str | None, sections: Sequence[Sequence[str]] = ()) -> str:
    """First line, ``Tolerance from: ...``, then each non-empty section separated by a blank line."""
    lines = [first_line]
    if source:
        lines.append(f"Tolerance from: {source}")
    for section in sections:
        if section:
            lines.extend(["", *section])
    return "\n".join(lines)


def _target(name: str | None) -> str:
    return f"output '{name}'" if name else "output"


def _records(array: np.ndarray) -> np.ndarray:
    """Records on axis 0 (a 0-d or 1-d array is one record), flattened to (records, elements).

    Floats keep their type, so that these are the very values (and sums) the plugin's metrics see;
    integers become float64.
    """
    array = np.asarray(array)
    if array.dtype.kind != "f":
        array = array.astype(np.float64)
    if array.ndim <= 1:
        return array.reshape(1, -1)
    return array.reshape(array.shape[0], -1)


def _check_shapes(actual: np.ndarray, expected: np.ndarray, what: str = "expected") -> None:
    if np.shape(actual) != np.shape(expected):
        raise ValueError(f"shape mismatch: actual {np.shape(actual)}, {what} {np.shape(expected)}")


def _worst_elements(
    actual: np.ndarray, expected: np.ndarray, badness: np.ndarray, mask: np.ndarray | None
) -> list[str]:
    """At most SHOW elements with the largest ``badness`` (among ``mask``), as numpy prints them."""
    flat = badness.reshape(-1).copy()
    if mask is not None:
        flat[~mask.reshape(-1)] = -np.inf
    count = int(np.count_nonzero(mask)) if mask is not None else flat.size  # NaNs (badness inf) count too
    order = np.argsort(-flat, kind="stable")[: min(SHOW, count)]
    shape = np.shape(actual) or (1,)
    a, e = np.asarray(actual).reshape(-1), np.asarray(expected).reshape(-1)
    rows = []
    for flat_index in order:
        index = ", ".join(str(int(i)) for i in np.unravel_index(int(flat_index), shape))
        rows.append(f" [{index}]: {fmt(a[flat_index])} (ACTUAL), {fmt(e[flat_index])} (EXPECTED)")
    return ["Worst elements:", *rows] if rows else []


def _cosine(actual: np.ndarray, expected: np.ndarray) -> tuple[float | None, str | None, np.ndarray]:
    """The ``cosine`` metric over all records (its value, or None and why) and its value per record.

    The metric's own definition, as the plugin's ``min_cosine`` check reads it: 1 when both tensors
    are all zeros, undefined when only one is (or a value is NaN or Inf); per record, 1 and 0.
    """
    pair = TensorPair(_records(expected), _records(actual))
    metric = Cosine()
    metric.update(pair)
    value, why = metric.result()
    return value, why, metric.record_values(pair)


def assert_cosine(
    actual: np.ndarray,
    expected: np.ndarray,
    min_similarity: float,
    *,
    name: str | None = None,
    source: str | None = None,
) -> float:
    """Assert that the cosine similarity of ``actual`` and ``expected`` is at least ``min_similarity``.

    The similarity is taken over all elements of all records (axis 0 holds records), as the
    ``cosine`` metric defines it (docs/metrics.md): two all-zero tensors are identical (1); when only
    one of them is all zeros, the cosine is undefined and the assertion fails, whatever
    ``min_similarity`` is, as the plugin's ``min_cosine`` check does.

    Args:
        actual: the quantized model's values.
        expected: the fp32 model's values, same shape.
        min_similarity: the smallest cosine similarity accepted.
        name: the output's name, for the message (``for output 'logits'``).
        source: where ``min_similarity`` came from (the plugin says marker, ini file or default).

    Returns:
        The cosine similarity.

    Raises:
        AssertionError: the similarity is below ``min_similarity``, or undefined: exactly one of the
            tensors is all zeros, or a value is NaN or Inf (the first line says why).
    """
    __tracebackhide__ = True
    _check_shapes(actual, expected)
    overall, why, per_record = _cosine(actual, expected)
    if overall is not None and overall >= min_similarity:
        return overall
    order = np.argsort(per_record, kind="stable")[:SHOW]
    worst = ["Worst records (cosine):", *(f" record {int(r)}: {fmt(per_record[r])}" for r in order)]
    diff = np.abs(np.asarray(actual, dtype=np.float64) - np.asarray(expected, dtype=np.float64))
    if overall is None:
        first = f"cosine undefined for {_target(name)} ({why})"
    else:
        first = f"cosine {fmt(overall)} < {fmt(min_similarity)} for {_target(name)}"
    raise AssertionError(failure_message(first, source, [worst, _worst_elements(actual, expected, diff, None)]))


def assert_relative(
    actual: np.ndarray,
    expected: np.ndarray,
    rtol: float,
    atol: float = 0.0,
    max_fraction: float = 0.0,
    *,
    name: str | None = None,
    source: str | None = None,
) -> float:
    """Assert ``|actual - expected| <= atol + rtol * |expected|`` for all but ``max_fraction`` of elements.

    Args:
        actual: the quantized model's values.
        expected: the fp32 model's values, same shape.
        rtol: relative tolerance.
        atol: absolute tolerance.
        max_fraction: the fraction of elements (0..1) allowed to exceed the tolerance.
        name: the output's name, for the message (``for output 'logits'``).
        source: where the tolerance came from.

    Returns:
        The fraction of elements outside the tolerance.

    Raises:
        AssertionError: more than ``max_fraction`` of the elements are outside the tolerance.
    """
    __tracebackhide__ = True
    _check_shapes(actual, expected)
    bad, diff, rel, excess = outside_tolerance(actual, expected, rtol, atol)
    count, total = diff.size, max(bad.size, 1)
    fraction = count / total
    if fraction <= max_fraction:
        return fraction
    allowed = "" if max_fraction == 0 else f" (at most {fmt(100 * max_fraction)}% allowed)"
    first = (
        f"{count} / {total} elements ({fmt(100 * fraction)}%) outside atol + rtol*|expected| "
        f"(rtol={fmt(rtol)}, atol={fmt(atol)}){allowed} for {_target(name)}"
    )
    stats = [
        f"Max absolute difference among violations: {fmt(diff.max())}",
        f"Max relative difference among violations: {fmt(rel.max())}",
    ]
    badness = np.full(bad.shape, -np.inf)
    badness[bad] = excess
    raise AssertionError(failure_message(first, source, [stats, _worst_elements(actual, expected, badness, bad)]))


def assert_topk(
    actual: np.ndarray,
    reference: np.ndarray,
    k: int = 1,
    min_agreement: float | None = None,
    max_accuracy_drop: float | None = None,
    labels: np.ndarray | None = None,
    *,
    name: str | None = None,
    source: str | None = None,
) -> TopKCounter:
    """Assert top-k agreement with the fp32 model, and/or at most a given top-k accuracy drop.

    Agreement@k is the fraction of records whose fp32 top-1 class is among the quantized top-k
    classes. The accuracy drop is fp32 accuracy@k minus quantized accuracy@k against ``labels``, as a
    fraction: Glow's rule "top-1 and top-5 drop at most 0.5 %" is ``max_accuracy_drop=0.005`` with
    ``k=1`` and ``k=5``.

    Args:
        actual: the quantized model's class scores, (records, classes).
        reference: the fp32 model's class scores, same shape.
        k: how many top classes count.
        min_agreement: the smallest agreement@k accepted (0..1).
        max_accuracy_drop: the largest accuracy@k drop accepted (0..1); needs ``labels``.
        labels: one class index per record.
        name: the output's name, for the message (``for output 'logits'``).
        source: where the tolerances came from.

    Returns:
        The counts (agreement and accuracies).

    Raises:
        ValueError: neither tolerance is given, or ``max_accuracy_drop`` without ``labels``.
        AssertionError: agreement below ``min_agreement`` or drop above ``max_accuracy_drop``.
    """
    __tracebackhide__ = True
    if min_agreement is None and max_accuracy_drop is None:
        raise ValueError("assert_topk needs min_agreement or max_accuracy_drop")
    if max_accuracy_drop is not None and labels is None:
        raise ValueError("max_accuracy_drop needs labels")
    _check_shapes(actual, reference, "reference")
    counter = TopKCounter((k,))
    counter.update(reference, actual, labels)
    failures = []
    agreement = counter.agreement(k)
    if min_agreement is not None and agreement is not None and agreement < min_agreement:
        failures.append(f"top-{k} agreement {fmt(agreement)} < {fmt(min_agreement)} for {_target(name)}")
    drop = counter.drop(k)
    if max_accuracy_drop is not None and drop is not None and drop > max_accuracy_drop:
        ref_acc, test_acc = counter.accuracy(k) or (0.0, 0.0)
        failures.append(
            f"top-{k} accuracy drop {fmt(drop)} > {fmt(max_accuracy_drop)} for {_target(name)} "
            f"(fp32 {fmt(ref_acc)}, quantized {fmt(test_acc)})"
        )
    if not failures:
        return counter
    ref, test = as_scores(reference, "reference"), as_scores(actual, "actual")
    detail = [f"{counter.records - counter.agree[k]} / {counter.records} records disagree"]
    raise AssertionError(failure_message(failures[0], source, [failures[1:], detail, _disagreeing(ref, test, k)]))


def _disagreeing(ref: np.ndarray, test: np.ndarray, k: int) -> list[str]:
    ref_top = topk_indices(ref, 1)[:, 0]
    bad = np.flatnonzero(~in_topk(test, ref_top, k))
    if bad.size == 0:
        return []
    # worst first: how far the fp32 winner fell in the quantized scores
    margin = test.max(axis=1)[bad] - test[bad, ref_top[bad]]
    rows = []
    for r in bad[np.argsort(-margin, kind="stable")][:SHOW]:
        top = ", ".join(str(int(c)) for c in topk_indices(test[r : r + 1], k)[0])
        rows.append(f" record {int(r)}: fp32 top-1 class {int(ref_top[r])}, quantized top-{k} [{top}]")
    return ["Worst records:", *rows]


def assert_within_lsb(
    quantized: np.ndarray,
    reference: np.ndarray,
    scale: float | np.ndarray,
    max_lsb: float = 1,
    *,
    zero_point: int | np.ndarray = 0,
    axis: int = 1,
    name: str | None = None,
    source: str | None = None,
) -> float:
    """Assert ``|quantized - reference| / scale <= max_lsb`` for every element.

    Args:
        quantized: dequantized values, or integer values that are dequantized with ``scale`` and
            ``zero_point`` first.
        reference: the fp32 values, same shape.
        scale: the quantization step: a scalar, or one per channel along ``axis``.
        max_lsb: the largest error accepted, in quantization steps.
        zero_point: zero point(s) of integer ``quantized`` values.
        axis: the channel axis of a per-channel ``scale``.
        name: the output's name, for the message (``for output 'logits'``).
        source: where ``max_lsb`` came from.

    Returns:
        The largest error in quantization steps.

    Raises:
        AssertionError: some element is more than ``max_lsb`` steps away.
    """
    __tracebackhide__ = True
    _check_shapes(quantized, reference, "reference")
    q, r = np.asarray(quantized), np.asarray(reference, dtype=np.float64)
    step = np.asarray(scale, dtype=np.float64)
    if np.any(step <= 0):
        raise ValueError(f"scale must be positive, got {scale}")
    shape = [1] * max(r.ndim, 1)
    if step.size > 1:
        shape[axis] = step.size
    step = step.reshape(shape) if step.size > 1 else step.reshape(())
    if q.dtype.kind in "iu":
        zp = np.asarray(zero_point, dtype=np.float64)
        q = (q.astype(np.float64) - (zp.reshape(shape) if zp.size > 1 else zp)) * step
    steps = np.abs(q.astype(np.float64) - r) / step
    steps = np.where(np.isnan(steps), np.inf, steps)
    worst = float(steps.max(initial=0.0))
    if worst <= max_lsb:
        return worst
    bad = steps > max_lsb
    first = f"lsb {fmt(worst)} > {fmt(max_lsb)} for {_target(name)}"
    count = [f"{int(bad.sum())} / {bad.size} elements ({fmt(100 * bad.mean())}%) more than {fmt(max_lsb)} steps away"]
    raise AssertionError(failure_message(first, source, [count, _worst_elements(q, r, steps, bad)]))
