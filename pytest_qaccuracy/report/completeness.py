"""Whether a session's artifacts cover everything it collected: ``complete``, ``interrupted`` or
``incomplete``. Pure: the pytest plugin measures, this module words it for
``summary.json``, ``report.html`` and the terminal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

COMPLETE, INTERRUPTED, INCOMPLETE = "complete", "interrupted", "incomplete"
#: How many test ids the terminal and the HTML notice name (summary.json lists them all).
SHOWN = 5


@dataclass(frozen=True, slots=True)
class SessionStatus:
    """What the artifacts of a session lack.

    Attributes:
        status: ``complete``, ``interrupted`` (Ctrl-C, SIGTERM) or ``incomplete`` (a crashed xdist
            worker, ``-x``/``--maxfail``).
        reason: one phrase: where the session was interrupted, or why it is incomplete.
        not_run: collected tests that never reported (not run).
        lost: ``(test id, pair id)`` of checks that ran but whose results never reached the
            controller (their xdist worker crashed before sending them).
        workers_lost: xdist workers that ended without sending their results.
    """

    status: str = COMPLETE
    reason: str | None = None
    not_run: tuple[str, ...] = ()
    lost: tuple[tuple[str, str], ...] = ()
    workers_lost: int = 0

    @property
    def complete(self) -> bool:
        return self.status == COMPLETE

    def to_dict(self) -> dict[str, Any] | None:
        """``summary.json``'s ``missing`` entry; None for a complete session."""
        if self.complete:
            return None
        return {
            "reason": self.reason,
            "not_run": list(self.not_run),
            "lost": [{"test": test, "pair": pair} for test, pair in self.lost],
            "workers_lost": self.workers_lost,
        }

    def headline(self) -> str | None:
        """One sentence for the terminal and the HTML report; None for a complete session."""
        if self.complete:
            return None
        parts = [f"session {self.status}" + (f" ({self.reason})" if self.reason else "")]
        if self.not_run:
            parts.append(f"{len(self.not_run)} test(s) did not run: {_names(self.not_run)}")
        if self.lost:
            parts.append(f"{len(self.lost)} check(s) ran but their results were lost: {_names(self.lost)}")
        if self.workers_lost:
            parts.append(f"{self.workers_lost} xdist worker(s) sent no results (crashed?)")
        return "; ".join(parts) + ". These artifacts do not cover the whole session."


def _names(items: tuple[Any, ...]) -> str:
    shown = [f"{i[0]} (pair '{i[1]}')" if isinstance(i, tuple) else str(i) for i in items[:SHOWN]]
    return ", ".join(shown) + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")
