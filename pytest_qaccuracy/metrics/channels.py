"""How many quantization steps each channel of a tensor spans.

One scale for a whole tensor whose channels live on different ranges loses the small ones: a YOLOv8
output concatenates box coordinates (0..320 px) and class scores (0..1); at scale 1.25 every score
rounds to the same few levels, while the output as a whole still shows cosine 0.999.

:class:`ChannelSpans` keeps, for each axis 1..3 of the fp32 tensor, the min and max of every channel
(fixed-size state: the sum of those axes' lengths). A channel *spans* ``(max - min) / scale`` steps;
constant channels (a dead ReLU) carry nothing to lose and are left out. A tensor is flagged when, on
some axis, channels that vary span fewer than :data:`LOW_STEPS` steps while another spans at least
:data:`HIGH_STEPS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pytest_qaccuracy.numbers import format_number
from pytest_qaccuracy.plain import Plain

LOW_STEPS = 2.0
HIGH_STEPS = 100.0
AXES = (1, 2, 3)
#: Channel ranges named in a report (the rest are counted).
SHOWN_RANGES = 3


@dataclass(frozen=True, slots=True)
class ChannelReport(Plain):
    """The narrowest varying channels of one tensor: on ``axis``, ``min_steps`` (the fewest steps any
    varying channel spans, over all axes 1..3), ``max_steps`` on that axis, and the ``low`` ranges."""

    axis: int
    scale: float
    min_steps: float
    max_steps: float
    low: str  # "4..21" or "3, 7..9"
    flagged: bool

    def warning(self, name: str) -> str:
        """``output0 channels 4..21 span < 1 step (scale 1.25): ...`` for the summary."""
        bound = max(1, math.ceil(self.min_steps)) if self.min_steps > 0 else 1
        unit = "step" if bound == 1 else "steps"
        return (
            f"{name} channels {self.low} (axis {self.axis}) span < {bound} {unit} "
            f"(scale {format_number(self.scale)}) while "
            f"others span up to {self.max_steps:.0f}: their values are lost; declare slices or quantize them apart"
        )


def _ranges(indices: np.ndarray) -> str:
    """``[4, 5, 6, 9]`` -> ``"4..6, 9"`` (at most :data:`SHOWN_RANGES`, then a count)."""
    breaks = np.flatnonzero(np.diff(indices) != 1) + 1
    runs = np.split(indices, breaks)
    text = [f"{r[0]}..{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs[:SHOWN_RANGES]]
    more = len(runs) - SHOWN_RANGES
    return ", ".join(text) + (f" and {more} more ranges" if more > 0 else "")


class ChannelSpans:
    """Per-channel min and max of a tensor along axes 1..3, folded batch by batch."""

    def __init__(self) -> None:
        self.mins: dict[int, np.ndarray] = {}
        self.maxs: dict[int, np.ndarray] = {}

    def update(self, values: np.ndarray) -> None:
        """Fold one batch (records first); shapes that change stop the tracking of that axis."""
        if values.dtype.kind != "f":
            return
        for axis in AXES:
            if axis >= values.ndim or values.shape[axis] < 2:
                continue
            others = tuple(i for i in range(values.ndim) if i != axis)
            self.fold(axis, values.min(axis=others), values.max(axis=others))

    def fold(self, axis: int, lo: np.ndarray, hi: np.ndarray) -> None:
        """Fold one batch's per-channel ``lo``/``hi`` on ``axis`` (NaN is dropped by fmin/fmax); a
        channel count that changes stops the tracking of that axis."""
        if axis in self.mins and self.mins[axis].shape != lo.shape:
            self.mins.pop(axis)
            self.maxs.pop(axis)
            return
        self.mins[axis] = lo if axis not in self.mins else np.fmin(self.mins[axis], lo)
        self.maxs[axis] = hi if axis not in self.maxs else np.fmax(self.maxs[axis], hi)

    def report(self, scale: float | None) -> ChannelReport | None:
        """The narrowest varying channels in steps of ``scale``; None without a scale or channels."""
        if not scale or scale <= 0 or not self.mins:
            return None
        best: ChannelReport | None = None
        for axis in sorted(self.mins):
            steps = (self.maxs[axis] - self.mins[axis]) / scale
            varying = np.isfinite(steps) & (steps > 0)
            if not varying.any():
                continue
            low = np.flatnonzero(varying & (steps < LOW_STEPS))
            top = float(steps[varying].max())
            report = ChannelReport(
                axis,
                float(scale),
                float(steps[varying].min()),
                top,
                _ranges(low) if low.size else "",
                bool(low.size) and top >= HIGH_STEPS,
            )
            if best is None or (report.flagged, -report.min_steps) > (best.flagged, -best.min_steps):
                best = report
        return best
