"""How top-k counts an output (``metrics/topk.py``: ``score_layout``, ``ScoreLayout``), from the
rules in its docstrings: float outputs are class scores, integer outputs are labels, a named class
axis makes every other position a unit."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_qaccuracy.metrics.topk import ScoreLayout, score_layout


@pytest.mark.parametrize(
    ("shape", "dtype", "axis", "expected"),
    [
        ((4, 10), np.float32, None, ("scores", 1, 1)),
        ((4, 1, 10, 1), np.float64, None, ("scores", 2, 1)),  # axes of 1 allowed
        ((4, 7, 5), np.float32, 2, ("scores", 2, 7)),  # a sequence: 7 positions per record
        ((4, 7, 5), np.float32, -1, ("scores", 2, 7)),
        ((4, 5, 6, 3), np.float32, 1, ("scores", 1, 18)),
        ((4, 2), np.float16, 1, ("scores", 1, 1)),
        ((4,), np.int64, None, ("labels", 0, 1)),
        ((4, 6), np.uint8, None, ("labels", 0, 6)),
        ((4, 2, 3), np.bool_, None, ("labels", 0, 6)),
    ],
)
def test_layouts(shape, dtype, axis, expected) -> None:
    layout = score_layout(np.zeros(shape, dtype), axis)
    assert (layout.kind, layout.class_axis, layout.positions) == expected


@pytest.mark.parametrize(
    ("shape", "dtype", "axis", "message"),
    [
        ((), np.float32, None, r"^no record axis$"),
        ((0, 10), np.float32, None, r"^no record axis$"),
        ((4, 10), np.complex64, None, r"^dtype complex64 holds neither class scores nor labels$"),
        ((4, 3, 5), np.float32, None, r"^not class scores \(records, classes\)"),
        ((4,), np.float32, None, r"^not class scores \(records, classes\)"),
        ((4,), np.float32, 0, r"^class axis 0 is not an axis after the records$"),
        ((4, 3), np.float32, 0, r"^class axis 0 is not an axis after the records$"),
        ((4, 3), np.float32, -2, r"^class axis -2 is not an axis after the records$"),
        ((4, 3), np.float32, 2, r"^class axis 2 is not an axis after the records$"),
        ((4, 3), np.float32, -3, r"^class axis -3 is not an axis after the records$"),
        ((4, 1), np.float32, 1, r"^1 class on axis 1$"),
        ((4, 5, 1), np.float32, -1, r"^1 class on axis 2$"),
    ],
)
def test_outputs_that_cannot_be_counted(shape, dtype, axis, message) -> None:
    with pytest.raises(ValueError, match=message):
        score_layout(np.zeros(shape, dtype), axis)


def test_units_are_record_major() -> None:
    scores = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)  # classes on axis 1: 4 positions
    units = ScoreLayout("scores", 1, 4).units(scores)
    assert units.shape == (8, 3)
    np.testing.assert_array_equal(units[0], scores[0, :, 0])
    np.testing.assert_array_equal(units[5], scores[1, :, 1])
    labels = np.array([[1, 2], [3, 4]])
    np.testing.assert_array_equal(ScoreLayout("labels", 0, 2).units(labels), [1, 2, 3, 4])


def test_describe() -> None:
    assert ScoreLayout("scores", 1, 1).describe() == "per record"
    assert ScoreLayout("labels", 0, 1).describe() == "labels per record"
    assert ScoreLayout("scores", 2, 40).describe() == "per position (40 per record, classes on axis 2)"
    assert ScoreLayout("labels", 0, 6).describe() == "labels per position (6 per record)"


def test_a_label_output_counts_each_position_top_1_only() -> None:
    from pytest_qaccuracy.metrics.topk import TopKCounter

    layout = ScoreLayout("labels", 0, 2)
    counter = TopKCounter((1, 3), layout=layout)
    assert counter.ks == (1,)  # a label has no ranking beyond its one class
    fp32, quantized = np.array([[0, 1], [2, 2]]), np.array([[0, 2], [2, 2]])
    counter.update(fp32, quantized, labels=np.array([[0, 1], [2, 0]]))
    # units 0 1 2 3: fp32 0 1 2 2, quantized 0 2 2 2, labels 0 1 2 0
    assert counter.to_dict() == {
        "records": 2,
        "units": 4,
        "counted": "labels per position (2 per record)",
        "labelled": 4,
        "k": {"1": {"agreement": 0.75, "fp32_accuracy": 0.75, "quantized_accuracy": 0.5, "accuracy_drop": 0.25}},
    }
    with pytest.raises(ValueError, match=r"^3 labels for 2 records \(4 positions\)$"):
        counter.update(fp32, quantized, labels=np.array([0, 1, 2]))
    with pytest.raises(ValueError, match=r"^shapes differ: actual \(2, 3\), reference \(2, 2\)$"):
        counter.update(fp32, np.zeros((2, 3), int))


def test_a_sequence_output_counts_each_position() -> None:
    from pytest_qaccuracy.metrics.topk import TopKCounter

    fp32 = np.zeros((1, 3, 2), np.float32)  # one record, 3 classes on axis 1, 2 positions
    fp32[0, :, 0], fp32[0, :, 1] = [3, 2, 1], [1, 2, 3]  # winners: class 0, class 2
    quantized = fp32.copy()
    quantized[0, :, 1] = [1, 3, 2]  # position 1 now says class 1; class 2 is second
    counter = TopKCounter((1, 2), layout=ScoreLayout("scores", 1, 2))
    counter.update(fp32, quantized, labels=np.array([[0, 1]]))
    assert (counter.records, counter.units) == (1, 2)
    assert counter.agreement(1) == 0.5 and counter.agreement(2) == 1.0
    assert counter.accuracy(1) == (0.5, 1.0) and counter.drop(1) == -0.5
    assert counter.to_dict()["counted"] == "per position (2 per record, classes on axis 1)"
    plain = TopKCounter()
    plain.update(np.eye(2), np.eye(2))
    assert plain.to_dict() == {
        "records": 2,
        "units": 2,
        "counted": "per record",
        "labelled": 0,
        "k": {"1": {"agreement": 1.0, "fp32_accuracy": None, "quantized_accuracy": None, "accuracy_drop": None}},
    }
    with pytest.raises(ValueError, match=r"^2 labels for 3 records$"):
        plain.update(np.eye(3), np.eye(3), labels=[0, 1])
    with pytest.raises(ValueError, match=r"^k must be >= 1, got \(0, 1\)$"):
        TopKCounter((1, 0))
    with pytest.raises(ValueError, match=r"^cannot merge counters for k=\(1, 2\) into k=\(1,\)$"):
        plain.merge(TopKCounter((1, 2)))
