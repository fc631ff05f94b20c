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
