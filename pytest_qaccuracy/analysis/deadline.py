"""A point in time an analysis must stop at, checked between its indivisible steps.

The end-of-session analysis of a pytest run has a budget (:func:`~pytest_qaccuracy.plugin.sensitivity.analysis_budget`).
Its passes over the data (:mod:`.experiments`, :mod:`.cumulative`) call :meth:`Deadline.check` before
every step that cannot be cut short: building an onnxruntime session, running one batch (or one record,
for a model that does not batch) through the models of a pass. A step started before the deadline
finishes; none starts after it. So an analysis with a deadline ends within it plus the one step that
was running when it came, plus what the caller does with what was measured (no model runs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


class DeadlineReached(Exception):
    """The deadline passed before a step: the pass stops, and what it measured so far is the caller's."""


@dataclass(frozen=True, slots=True)
class Deadline:
    """``at`` on the ``clock`` (:func:`time.monotonic`); ``seconds``: the whole budget it ends."""

    at: float
    seconds: float
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)

    @classmethod
    def after(cls, seconds: float, clock: Callable[[], float] = time.monotonic) -> Deadline:
        """The deadline ``seconds`` from now."""
        return cls(clock() + seconds, seconds, clock)

    def left(self) -> float:
        """Seconds until the deadline (negative once it passed)."""
        return self.at - self.clock()

    def check(self) -> None:
        """Raise :class:`DeadlineReached` when the deadline has passed."""
        if self.clock() >= self.at:
            raise DeadlineReached(f"the budget of {self.seconds:.3g}s ran out")


def check(deadline: Deadline | None) -> None:
    """:meth:`Deadline.check`, nothing when there is no deadline."""
    if deadline is not None:
        deadline.check()
