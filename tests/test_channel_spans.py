"""Per-channel spans in quantization steps (``metrics/channels.py``), from its module docstring:
a channel spans ``(max - min) / scale`` steps, constant channels are left out, a tensor is flagged
when varying channels span fewer than 2 steps while another spans at least 100."""

from __future__ import annotations

import numpy as np

from pytest_qaccuracy.metrics.channels import ChannelReport, ChannelSpans, _ranges


def test_ranges() -> None:
    assert _ranges(np.array([4, 5, 6, 9])) == "4..6, 9"
    assert _ranges(np.array([3])) == "3"
    assert _ranges(np.array([0, 2, 4, 6, 7, 9])) == "0, 2, 4 and 2 more ranges"
    assert _ranges(np.array([0, 2, 4])) == "0, 2, 4"


def test_a_tensor_whose_small_channels_are_lost_is_flagged() -> None:
    spans = ChannelSpans()
    spans.update(np.array([[0.0, 0.0, 7.0, 5.0], [1.0, 0.5, 7.0, 300.0]], np.float32))  # channel 2 is constant
    report = spans.report(1.0)
    assert report == ChannelReport(axis=1, scale=1.0, min_steps=0.5, max_steps=295.0, low="0..1", flagged=True)
    assert report.warning("out") == (
        "out channels 0..1 (axis 1) span < 1 step (scale 1) while others span up to 295: "
        "their values are lost; declare slices or quantize them apart"
    )
    assert ChannelReport.from_dict(report.to_dict()) == report
    # batches fold: channel 0 now spans 3 steps, channel 1 still 0.5
    spans.update(np.array([[-2.0, 0.25, 7.0, 5.0]], np.float32))
    assert spans.report(1.0).low == "1"
    # a coarser scale: nothing spans 100 steps any more
    coarse = spans.report(4.0)
    assert coarse.flagged is False and coarse.max_steps == 73.75 and coarse.low == "0..1"


def test_warning_rounds_the_narrowest_span_up() -> None:
    report = ChannelReport(axis=2, scale=0.5, min_steps=2.5, max_steps=120.4, low="3, 7..9", flagged=True)
    assert report.warning("y").startswith(
        "y channels 3, 7..9 (axis 2) span < 3 steps (scale 0.5) while others span up to 120:"
    )


def test_no_report_without_scale_float_values_or_varying_channels() -> None:
    spans = ChannelSpans()
    spans.update(np.array([[1, 2], [3, 4]], np.int8))  # integer tensors are not tracked
    assert spans.report(1.0) is None
    spans.update(np.ones((2, 3), np.float32))  # constant channels only
    assert spans.report(1.0) is None
    spans.update(np.array([[0.0, 1.0, 2.0]], np.float32))
    assert spans.report(None) is None and spans.report(0.0) is None and spans.report(-1.0) is None
    assert spans.report(1.0) is not None


def test_the_axis_with_the_narrowest_flagged_channels_wins() -> None:
    values = np.zeros((1, 2, 3), np.float32)
    values[0, 0, :] = [0.0, 200.0, 0.5]  # axis 1: channel 0 spans 200, channel 1 is constant
    spans = ChannelSpans()
    spans.update(values)
    spans.update(np.zeros((1, 2, 3), np.float32))
    report = spans.report(1.0)
    # axis 2: channel 0 is constant, channel 1 spans 200, channel 2 spans 0.5: flagged
    assert (report.axis, report.low, report.min_steps, report.flagged) == (2, "2", 0.5, True)


def test_a_batch_of_another_shape_stops_that_axis() -> None:
    spans = ChannelSpans()
    spans.update(np.array([[0.0, 1.0]], np.float32))
    spans.update(np.array([[0.0, 1.0, 2.0]], np.float32))
    assert spans.report(1.0) is None


def test_warning_bounds_a_span_of_zero_or_nan_at_one_step() -> None:
    """A report read back from a file may hold a span of 0 or NaN: ``< 1 step`` either way."""
    for span in (0.0, float("nan"), 1.0):
        report = ChannelReport(axis=1, scale=2.0, min_steps=span, max_steps=150.0, low="0", flagged=True)
        assert " span < 1 step (scale 2) " in report.warning("y")


def test_ranges_name_three_runs_then_count_the_fourth() -> None:
    assert _ranges(np.array([0, 2, 4, 6])) == "0, 2, 4 and 1 more ranges"


def test_an_axis_of_two_channels_is_tracked_and_a_short_axis_skips_to_the_next() -> None:
    """Axis 1 of length 1 is skipped, not the end of the tracking: axis 2 (two channels) is kept."""
    spans = ChannelSpans()
    spans.update(np.array([[[0.0, 300.0]]], np.float32))  # (records, 1, 2)
    spans.update(np.array([[[0.0, 0.0]]], np.float32))
    assert sorted(spans.mins) == [2]
    assert spans.mins[2].tolist() == [0.0, 0.0] and spans.maxs[2].tolist() == [0.0, 300.0]  # folded, not replaced


def test_a_constant_first_axis_does_not_hide_a_varying_second_one() -> None:
    spans = ChannelSpans()
    spans.fold(1, np.array([5.0, 7.0]), np.array([5.0, 7.0]))  # axis 1: both channels constant
    spans.fold(2, np.array([0.0, 0.0, 0.0]), np.array([0.0, 200.0, 1.0]))
    report = spans.report(1.0)
    assert (report.axis, report.low, report.min_steps, report.max_steps) == (2, "2", 1.0, 200.0)


def test_two_steps_exactly_are_not_low_and_a_hundred_exactly_flags() -> None:
    spans = ChannelSpans()
    spans.update(np.array([[0.0, 0.0], [2.0, 100.0]], np.float32))  # spans 2 and 100 steps at scale 1
    report = spans.report(1.0)
    assert (report.low, report.flagged) == ("", False)
    spans = ChannelSpans()
    spans.update(np.array([[0.0, 0.0], [1.5, 100.0]], np.float32))
    assert spans.report(1.0).flagged is True  # 1.5 < 2 while another spans exactly 100


def test_the_narrower_of_two_flagged_axes_wins_and_a_tie_keeps_the_first() -> None:
    spans = ChannelSpans()
    spans.fold(1, np.array([0.0, 0.0]), np.array([0.5, 150.0]))
    spans.fold(2, np.array([0.0, 0.0]), np.array([0.25, 150.0]))
    spans.fold(3, np.array([0.0, 0.0]), np.array([0.25, 150.0]))
    report = spans.report(1.0)
    assert (report.axis, report.min_steps) == (2, 0.25)  # narrower than axis 1's 0.5; axis 3 ties: the first
    spans = ChannelSpans()
    spans.fold(1, np.array([0.0, 0.0]), np.array([0.25, 150.0]))
    spans.fold(2, np.array([0.0, 0.0]), np.array([0.5, 150.0]))
    assert spans.report(1.0).axis == 1
