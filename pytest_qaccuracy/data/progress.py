"""Progress of the loops over a dataset's records: one line on a terminal, redrawn in place; in a
log (a pipe, a CI job's captured output), a plain line at most every 30 seconds of a long job.

A loop runs inside ``with task(label, total) as advance:`` and calls ``advance(len(batch))``; a
job of several passes opens one task around them all. Tasks report to the progress installed by
:func:`reporting` and do nothing when there is none, so the library stays silent unless the caller
(the ``qaccuracy`` command, the pytest plugin) asks for a line.
The reporter is a context variable rather than a parameter so that the loops deep inside
``compare``, ``sensitivity`` and ``calibrate`` need no new argument on every public function.
A long job made of steps rather than records reports them with :func:`note` (a line redrawn in
place on a terminal, a plain line in a log at most every ``LOG_INTERVAL`` seconds) or :func:`step`
(the same on a terminal, every one a plain line in a log: the recipe search's experiments). Inside
:func:`heartbeat`, a log also says ``still working`` whenever it was silent for its interval (one
long step of a job: a ``quantize_static``, a ranking's pass).
Whether a line is shown is :func:`progress_for`'s decision: never with ``quiet`` (``-q``), else as
``QACCURACY_PROGRESS`` says (``0`` off, ``1`` the redrawn line), else the redrawn line on a terminal
and the plain lines elsewhere.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import IO

#: ``0`` never shows progress, ``1`` always does (tests, terminals that do not say they are one).
ENV = "QACCURACY_PROGRESS"
#: Seconds between two plain lines in a log (and before the first one).
LOG_INTERVAL = 30.0


class ProgressLine:
    """``label: done / total records, rate rec/s, time left`` on ``stream``, redrawn at most every
    ``interval`` seconds and erased when the job ends (so the command's own output follows cleanly).

    ``below``: draw on a line of its own under the cursor's line and go back up when done (pytest's
    last line of test results has no newline yet, and must not be overwritten).
    """

    def __init__(
        self,
        stream: IO[str],
        interval: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        below: bool = False,
    ) -> None:
        self.stream, self.interval, self.clock, self.below = stream, interval, clock, below
        self.label, self.total, self.done = "", 0, 0
        self.started = self.drawn_at = 0.0
        self.noting = False  # a note is drawn on the line below the cursor's

    def note(self, text: str) -> None:
        """A finished step: drawn in place (below the cursor's line, where a job draws), until the
        next note or :meth:`close`."""
        if self.below and not self.noting:
            self.stream.write("\n")
        self.noting = True
        width = shutil.get_terminal_size((80, 24)).columns - 1
        self.stream.write("\r" + text[:width] + "\x1b[K")
        self.stream.flush()

    def step(self, text: str) -> None:
        """A finished step worth a line of its own in a log; on a terminal, a :meth:`note`."""
        self.note(text)

    def close(self) -> None:
        """Erase the last note (and go back up): the reporting ends."""
        if self.noting:
            self.noting = False
            self.stream.write("\r\x1b[K" + ("\x1b[A" if self.below else ""))
            self.stream.flush()

    def start(self, label: str, total: int) -> None:
        self.label, self.total, self.done = label, total, 0
        self.started = self.clock()
        if self.below:
            self.stream.write("\n")
        self._draw()

    def advance(self, records: int) -> None:
        self.done += records
        now = self.clock()
        if now - self.drawn_at >= self.interval or self.done >= self.total:
            self._draw(now)

    def finish(self) -> None:
        self.stream.write("\r\x1b[K" + ("\x1b[A" if self.below else ""))
        self.stream.flush()

    def _draw(self, now: float | None = None) -> None:
        self.drawn_at = self.clock() if now is None else now
        width = shutil.get_terminal_size((80, 24)).columns - 1  # a wrapped line cannot be redrawn
        self.stream.write("\r" + self.line(self.drawn_at)[:width] + "\x1b[K")
        self.stream.flush()

    def line(self, now: float) -> str:
        """The text shown at time ``now`` (pure, for tests)."""
        text = f"{self.label}: {self.done} / {self.total} records"
        elapsed = now - self.started
        if self.done and elapsed > 0:
            rate = self.done / elapsed
            left = max(self.total - self.done, 0) / rate
            shown = f"{rate:.0f}" if rate >= 100 else f"{rate:.3g}"
            text += f", {shown} rec/s, {format_seconds(left)} left"
        return text


class ProgressLog(ProgressLine):
    """Plain lines for a log that cannot be redrawn: nothing during a job's first ``interval``
    seconds (a short job prints nothing), then ``label: done / total records, rate, time left`` at
    most every ``interval`` seconds, and ``label: done / total records in <time>`` when a job that
    printed a line ends; a :meth:`step` every time, a :meth:`note` at most every ``interval`` seconds.
    ``prefix`` starts every line (an xdist worker's ``[gw0] ``)."""

    def __init__(
        self,
        stream: IO[str],
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        below: bool = False,
        prefix: str = "",
    ) -> None:
        super().__init__(stream, LOG_INTERVAL if interval is None else interval, clock, below)
        self.printed, self.prefix = False, prefix  # printed: the current job printed a line
        self.began = False  # the log printed a line (the first one starts a new line ``below``)
        self.noted_at = clock()  # a note is printed at most every ``interval`` seconds
        self.beat: Heartbeat | None = None  # set by :func:`heartbeat`: lines go through it

    def note(self, text: str) -> None:
        """A finished step, as a plain line, when ``interval`` seconds passed since the last note
        (or since this log began)."""
        now = self.clock()
        if now - self.noted_at >= self.interval:
            self._print(text)
            self.noted_at = now

    def step(self, text: str) -> None:
        """A finished step: always a plain line."""
        self._print(text)
        self.noted_at = self.clock()

    def close(self) -> None:
        pass

    def start(self, label: str, total: int) -> None:
        self.label, self.total, self.done, self.printed = label, total, 0, False
        self.started = self.drawn_at = self.clock()

    def advance(self, records: int) -> None:
        self.done += records
        now = self.clock()
        if now - self.drawn_at >= self.interval and self.done < self.total:
            self._print(self.line(now))
            self.drawn_at = now

    def finish(self) -> None:
        if self.printed:
            took = format_seconds(self.clock() - self.started)
            self._print(f"{self.label}: {self.done} / {self.total} records in {took}")

    def _print(self, text: str) -> None:
        self.printed = True
        if self.beat is not None:  # under the heartbeat's lock, and its clock starts again
            self.beat.say(text)
        else:
            self.write_line(text)

    def write_line(self, text: str) -> None:
        """``text`` as a line of this log (with its prefix); the heartbeat's thread writes here too."""
        # below: pytest's last line of results has no newline yet; the first line starts a new one
        lead = "\n" if self.below and not self.began else ""
        self.began = True
        self.stream.write(f"{lead}{self.prefix}{text}\n")
        self.stream.flush()


class Heartbeat:
    """A line to ``write`` whenever nothing was said for ``interval`` seconds, from a background
    thread: a step of a long job (one ``quantize_static``, one onnxruntime calibrator, one model run
    on every record) can outlast any record loop's progress, and a captured CI log must not look
    hung. The job says its own lines through :meth:`say`, which resets the clock; the thread only
    writes (under the same lock), never touches the job."""

    def __init__(
        self,
        write: Callable[[str], None],
        label: str,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.write, self.label, self.clock = write, label, clock
        self.interval = LOG_INTERVAL if interval is None else interval
        self.started = self.last = clock()
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread: threading.Thread | None = None

    def say(self, text: str) -> None:
        """Write one of the job's own lines."""
        with self._lock:
            self.write(text)
            self.last = self.clock()

    def __enter__(self) -> Heartbeat:
        self.started = self.last = self.clock()
        if self.interval <= 0:  # every line is printed anyway: nothing to beat
            return self
        self._thread = threading.Thread(target=self._beat, name="qaccuracy-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(max(self.interval - (self.clock() - self.last), 0.01)):
            with self._lock:
                now = self.clock()
                if now - self.last >= self.interval and not self._stop.is_set():
                    quiet, took = format_seconds(now - self.last), format_seconds(now - self.started)
                    self.write(f"{self.label}: still working ({quiet} since the last line, {took} in all)")
                    self.last = now


def format_seconds(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


_current: ContextVar[ProgressLine | None] = ContextVar("qaccuracy_progress", default=None)
_active: ContextVar[Callable[[int], None] | None] = ContextVar("qaccuracy_progress_task", default=None)


def progress_for(stream: IO[str], quiet: bool = False, below: bool = False) -> ProgressLine | None:
    """The progress on ``stream`` (see the module docstring): a :class:`ProgressLine` redrawn on a
    terminal, a :class:`ProgressLog` of plain lines elsewhere, None when silenced."""
    forced = os.environ.get(ENV, "").strip()
    if quiet or forced == "0":
        return None
    isatty = getattr(stream, "isatty", None)
    if forced == "1" or (isatty is not None and isatty()):
        return ProgressLine(stream, below=below)
    return ProgressLog(stream, below=below)


@contextmanager
def reporting(progress: ProgressLine | None) -> Iterator[None]:
    """Loops run inside report to ``progress`` (None: to nothing)."""
    token = _current.set(progress)
    try:
        yield
    finally:
        _current.reset(token)
        if progress is not None:
            progress.close()


def note(text: str) -> None:
    """Report a finished step of a long job (one line of text) to the progress installed by
    :func:`reporting`; nothing when there is none."""
    progress = _current.get()
    if progress is not None:
        progress.note(text)


def step(text: str) -> None:
    """Report a finished step of a long job that a log prints every time (:meth:`ProgressLog.step`;
    redrawn on a terminal as a :func:`note`); nothing when no progress is installed."""
    progress = _current.get()
    if progress is not None:
        progress.step(text)


@contextmanager
def heartbeat(label: str) -> Iterator[None]:
    """While inside, a log installed by :func:`reporting` says ``label: still working (...)`` whenever
    it printed nothing for its interval (:class:`Heartbeat`, a daemon thread that ends with the
    block); nothing on a terminal (its line shows the job) or when no progress is installed."""
    progress = _current.get()
    if not isinstance(progress, ProgressLog) or progress.beat is not None:
        yield
        return
    beat = Heartbeat(progress.write_line, label, progress.interval, progress.clock)
    progress.beat = beat
    try:
        with beat:
            yield
    finally:
        progress.beat = None


def _ignore(records: int) -> None:
    pass


@contextmanager
def task(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """One job of ``total`` records; yields ``advance(records)``. Inside another task it adds to
    that one (a multi-pass job counts all its passes on one line)."""
    outer, progress = _active.get(), _current.get()
    if outer is not None or progress is None:
        yield outer or _ignore
        return
    progress.start(label, total)
    token = _active.set(progress.advance)
    try:
        yield progress.advance
    finally:
        _active.reset(token)
        progress.finish()
