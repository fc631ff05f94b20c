"""Progress on stderr: the line itself, when it is shown, and the commands in a real pseudo-terminal."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
import threading
import time

import pytest

from pytest_qaccuracy.cli import main
from pytest_qaccuracy.data.progress import (
    ENV,
    ProgressLine,
    ProgressLog,
    format_seconds,
    heartbeat,
    note,
    progress_for,
    reporting,
    step,
    task,
)

ERASE = "\r\x1b[K"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_line_shows_records_rate_and_time_left() -> None:
    clock = Clock()
    line = ProgressLine(io.StringIO(), clock=clock)
    line.start("compare", 40)
    assert line.line(clock.now) == "compare: 0 / 40 records"
    clock.now += 2.0
    line.advance(10)
    assert line.line(clock.now) == "compare: 10 / 40 records, 5 rec/s, 6s left"
    assert [format_seconds(s) for s in (0.4, 59, 185, 3720)] == ["0s", "59s", "3m05s", "1h02m"]


def test_redrawn_at_most_every_interval_and_erased_at_the_end() -> None:
    clock, stream = Clock(), io.StringIO()
    line = ProgressLine(stream, interval=0.25, clock=clock)
    line.start("run", 100)
    for _ in range(99):  # 99 batches within 0.099 s: one redraw at most, besides the first and last
        clock.now += 0.001
        line.advance(1)
    clock.now += 0.001
    line.advance(1)
    line.finish()
    text = stream.getvalue()
    assert text.count("\r") == 3 and text.endswith(ERASE)  # start, the last batch, then the erase
    assert "run: 100 / 100 records" in text and "\n" not in text


def test_a_redraw_exactly_one_interval_later_and_at_the_time_of_the_batch() -> None:
    class Ticking(Clock):  # every reading of the clock moves it on (in steps exact in binary)
        def __call__(self) -> float:
            self.now += 0.25
            return self.now

    clock, stream = Ticking(), io.StringIO()
    line = ProgressLine(stream, interval=1.0, clock=clock)
    line.start("run", 100)  # started at 100.25, drawn at 100.5
    clock.now = line.drawn_at + 0.75  # the batch's reading is exactly one interval after the draw
    line.advance(10)
    assert stream.getvalue().count("\r") == 2
    assert line.drawn_at == 101.5  # drawn at the time advance read, not at a later reading


def test_a_line_and_a_note_are_cut_one_column_short_of_the_terminal(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "20")
    stream = io.StringIO()
    line = ProgressLine(stream, clock=Clock())
    line.start("a-rather-long-label", 1000)
    assert stream.getvalue() == "\ra-rather-long-label\x1b[K"  # 19 characters: a wrapped line cannot be redrawn
    stream.seek(0)
    stream.truncate()
    line.note("0123456789abcdefghijklmnop")
    assert stream.getvalue() == "\r0123456789abcdefghi\x1b[K"
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr("shutil.get_terminal_size", lambda fallback: os.terminal_size(fallback))
    stream.seek(0)
    stream.truncate()
    line.note("x" * 100)  # no terminal: 80 columns
    assert stream.getvalue() == "\r" + "x" * 79 + "\x1b[K"


def test_a_note_after_close_starts_its_own_line_below_again() -> None:
    stream = io.StringIO()
    line = ProgressLine(stream, clock=Clock(), below=True)
    line.note("first")
    line.close()
    line.close()  # a second close erases nothing more
    line.note("second")
    assert stream.getvalue() == "\n\rfirst\x1b[K" + ERASE + "\x1b[A" + "\n\rsecond\x1b[K"


def test_below_draws_under_the_current_line_and_goes_back_up() -> None:
    stream = io.StringIO()
    line = ProgressLine(stream, below=True)
    line.start("sensitivity", 1)
    line.finish()
    assert stream.getvalue().startswith("\n\r") and stream.getvalue().endswith(ERASE + "\x1b[A")


def test_a_log_gets_a_plain_line_at_most_every_30_seconds_of_a_long_job() -> None:
    clock, stream = Clock(), io.StringIO()
    log = ProgressLog(stream, clock=clock)
    log.start("compare", 1000)
    for _ in range(100):  # 10 records every 1.5 s: 150 s in all
        clock.now += 1.5
        log.advance(10)
    log.finish()
    lines = stream.getvalue().splitlines()
    assert stream.getvalue().endswith("\n") and "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()
    # at 30, 60, 90 and 120 s (the batch that crosses each 30 s mark), then the end
    assert lines == [
        "compare: 200 / 1000 records, 6.67 rec/s, 2m00s left",
        "compare: 400 / 1000 records, 6.67 rec/s, 1m30s left",
        "compare: 600 / 1000 records, 6.67 rec/s, 1m00s left",
        "compare: 800 / 1000 records, 6.67 rec/s, 30s left",
        "compare: 1000 / 1000 records in 2m30s",
    ]


def test_a_log_gets_nothing_for_a_short_job_and_a_new_line_below_pytest_results() -> None:
    clock, stream = Clock(), io.StringIO()
    log = ProgressLog(stream, clock=clock, below=True)
    log.start("sensitivity", 10)
    clock.now += 29.9
    log.advance(9)
    log.advance(1)
    log.finish()
    assert stream.getvalue() == ""
    log.start("cumulative", 10)
    clock.now += 31
    log.advance(5)
    clock.now += 1
    log.advance(5)
    log.finish()
    assert stream.getvalue() == (
        "\ncumulative: 5 / 10 records, 0.161 rec/s, 31s left\ncumulative: 10 / 10 records in 32s\n"
    )


@pytest.mark.parametrize(
    ("env", "tty", "quiet", "shown"),
    [
        (None, True, False, ProgressLine),
        (None, False, False, ProgressLog),  # a pipe, a CI log: plain lines of long jobs
        (None, True, True, None),
        (None, False, True, None),
        ("0", True, False, None),
        ("0", False, False, None),
        ("1", False, False, ProgressLine),
        ("1", False, True, None),  # -q wins over the environment
    ],
)
def test_which_progress_is_shown(
    monkeypatch: pytest.MonkeyPatch, env: str | None, tty: bool, quiet: bool, shown: type | None
) -> None:
    if env is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, env)
    stream = Tty() if tty else io.StringIO()
    progress = progress_for(stream, quiet=quiet)
    assert (None if progress is None else type(progress)) is shown


def test_progress_for_keeps_below_and_its_stream_and_reads_a_stream_without_isatty(monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    tty, log = Tty(), io.StringIO()
    line = progress_for(tty)  # not quiet by default
    assert type(line) is ProgressLine and line.stream is tty and line.below is False
    assert progress_for(tty, below=True).below is True
    plain = progress_for(log, below=True)
    assert type(plain) is ProgressLog and plain.stream is log and plain.below is True
    assert progress_for(log).below is False

    class Bare:  # a file-like object without isatty (a logging stream, a wrapper): a log
        def write(self, text: str) -> None:
            pass

    assert type(progress_for(Bare())) is ProgressLog


def test_the_rate_and_time_left_at_their_edges() -> None:
    clock = Clock()
    line = ProgressLine(io.StringIO(), clock=clock)
    line.start("run", 40)
    line.done = 10
    assert line.line(clock.now) == "run: 10 / 40 records"  # no time elapsed yet: no rate
    assert line.line(clock.now + 0.5) == "run: 10 / 40 records, 20 rec/s, 2s left"  # under a second
    line.done = 40
    assert line.line(clock.now + 100.0) == "run: 40 / 40 records, 0.4 rec/s, 0s left"
    line.done = 2000
    line.total = 4000
    assert line.line(clock.now + 1.6) == "run: 2000 / 4000 records, 1250 rec/s, 2s left"  # not 1.25e+03
    assert [format_seconds(s) for s in (3599.4, 3600, 7260)] == ["59m59s", "1h00m", "2h01m"]


def test_default_redraw_interval_is_a_quarter_second() -> None:
    clock, stream = Clock(), io.StringIO()
    line = ProgressLine(stream, clock=clock)
    line.start("run", 100)
    clock.now += 0.125
    line.advance(1)
    assert stream.getvalue().count("\r") == 1
    clock.now += 0.125
    line.advance(1)
    assert stream.getvalue().count("\r") == 2


def test_a_log_notes_exactly_one_interval_later() -> None:
    clock, stream = Clock(), io.StringIO()
    log = ProgressLog(stream, interval=30.0, clock=clock)
    clock.now += 30.0
    log.note("first")
    clock.now += 29.5
    log.note("too soon")
    clock.now += 0.5
    log.note("second")
    assert stream.getvalue() == "first\nsecond\n"


def test_the_heartbeat_is_a_named_daemon_thread_on_the_logs_clock() -> None:
    import threading

    from pytest_qaccuracy.data.progress import Heartbeat

    with Heartbeat(lambda text: None, "job", interval=60.0) as beat:
        (thread,) = [t for t in threading.enumerate() if t.name == "qaccuracy-heartbeat"]
        assert thread.daemon  # a job that never returns cannot keep the interpreter from exiting
    assert beat._thread is thread and not thread.is_alive()
    clock, stream = Clock(), io.StringIO()
    log = ProgressLog(stream, interval=60.0, clock=clock)
    with reporting(log), heartbeat("job"):
        assert log.beat is not None and log.beat.clock is clock and log.beat.started == 100.0


def test_nested_tasks_count_on_the_outer_line_and_errors_erase_it() -> None:
    stream = io.StringIO()
    with task("nothing", 3) as advance:  # no reporter: a no-op
        advance(3)
    assert stream.getvalue() == ""
    with reporting(ProgressLine(stream, interval=0.0)):
        with task("sensitivity", 4) as outer:
            with task("inner", 2) as inner:
                assert inner == outer
                inner(2)
            outer(2)
        with pytest.raises(RuntimeError), task("compare", 5) as advance:
            advance(1)
            raise RuntimeError
        with task("after", 1) as advance:  # the failed task left no state behind
            advance(1)
    text = stream.getvalue()
    assert "sensitivity: 4 / 4 records" in text and "inner" not in text
    assert "compare: 1 / 5 records" in text and "after: 1 / 1 records" in text
    assert text.count(ERASE) == 3


def _command(zoo, tmp_path, name: str) -> list[str]:
    fp32, quant, data = str(zoo["fp32"]), str(zoo["qdq_u8"]), str(zoo["data"])
    return {
        "compare": ["compare", fp32, quant, "--data", data, "--metrics", "sqnr", "--batch-size", "4"],
        "sensitivity": ["sensitivity", fp32, quant, "--data", data, "--batch-size", "4"],
        "calibrate": [
            "calibrate",
            fp32,
            "--data",
            data,
            "--method",
            "kl",
            "--no-check",
            "--out",
            str(tmp_path / "c.onnx"),
        ],
        "run": ["run", quant, "--data", data, "--out", str(tmp_path / "o.h5"), "--batch-size", "4"],
    }[name]


@pytest.mark.parametrize("name", ["compare", "sensitivity", "calibrate", "run"])
def test_every_command_reports_its_records(
    zoo, tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(ENV, "1")
    assert main(_command(zoo, tmp_path, name)) == 0
    err = capsys.readouterr().err
    total = 24 if name == "calibrate" else 12  # kl reads the records twice; sensitivity counts one pass here
    if name == "sensitivity":
        total = int(re.search(r"sensitivity: \d+ / (\d+) records", err).group(1))
        assert total % 12 == 0
    assert f"{name}: 0 / {total} records" in err and f"{name}: {total} / {total} records" in err
    assert err.endswith(ERASE)
    assert main([*_command(zoo, tmp_path, name), "-q"]) == 0
    assert capsys.readouterr().err == ""


def _spawn(args: list[str], tty: bool) -> tuple[str, str, int]:
    """Run the command with stderr on a pseudo-terminal (or a pipe); (stdout, stderr, exit code)."""
    env = {k: v for k, v in os.environ.items() if k != ENV} | {"COLUMNS": "200"}
    command = [sys.executable, "-m", "pytest_qaccuracy.cli", *args]
    if not tty:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        return done.stdout, done.stderr, done.returncode
    master, slave = pty.openpty()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    out, _ = proc.communicate(timeout=300)
    return out.decode(), b"".join(chunks).decode(), proc.returncode


def test_compare_in_a_terminal_shows_progress_and_a_pipe_gets_none(zoo, tmp_path) -> None:
    args = _command(zoo, tmp_path, "compare")
    out, err, code = _spawn(args, tty=True)
    assert code == 0 and "sqnr" in out
    assert "compare: 0 / 12 records" in err and "compare: 12 / 12 records, " in err and " left" in err
    assert err.endswith(ERASE) and "\n" not in err  # redrawn in place, erased before the table
    piped_out, piped_err, code = _spawn(args, tty=False)
    assert code == 0 and piped_err == "" and piped_out == out
    _, quiet_err, code = _spawn([*args, "--quiet"], tty=True)
    assert code == 0 and quiet_err == ""


def test_heartbeat_speaks_only_after_a_silence_and_stops_with_its_job():
    """A line from the background thread once nothing was said for the interval; the job's own lines
    (``say``) reset the clock; nothing after the job ends."""
    import threading
    import time

    from pytest_qaccuracy.data.progress import Heartbeat

    lines: list[str] = []
    lock = threading.Lock()

    def write(text: str) -> None:
        with lock:
            lines.append(text)

    with Heartbeat(write, "recipe", interval=0.05) as beat:
        for _ in range(20):  # a job that talks every 10 ms: never silent long enough
            beat.say("recipe: step")
            time.sleep(0.01)
        talking = list(lines)
        time.sleep(0.32)  # then silent: about six beats
    after = len(lines)
    time.sleep(0.15)
    assert talking == ["recipe: step"] * 20
    beats = lines[20:]
    assert 3 <= len(beats) <= 8, beats
    assert all(re.fullmatch(r"recipe: still working \(0s since the last line, \ds in all\)", b) for b in beats)
    assert len(lines) == after  # the thread ended with the job


def test_heartbeat_default_interval_is_the_log_interval(monkeypatch):
    from pytest_qaccuracy.data import progress

    monkeypatch.setattr(progress, "LOG_INTERVAL", 7.0)
    assert progress.Heartbeat(print, "x").interval == 7.0
    assert progress.Heartbeat(print, "x", interval=2.0).interval == 2.0


def test_notes_in_a_log_at_most_every_interval_with_the_prefix() -> None:
    """A long job's steps (the recipe search) in a log: a plain line when ``interval`` seconds passed
    since the last one (or since the log began), each with the worker's prefix."""
    clock, stream = Clock(), io.StringIO()
    log = ProgressLog(stream, interval=30.0, clock=clock, prefix="[gw1] ")
    with reporting(log):
        note("step 0")  # the log just began: nothing yet
        for step, seconds in ((1, 31.0), (2, 10.0), (3, 25.0), (4, 1.0)):
            clock.now += seconds
            note(f"step {step}")
    assert stream.getvalue() == "[gw1] step 1\n[gw1] step 3\n"
    note("outside")  # no progress installed: nothing, no error
    assert stream.getvalue() == "[gw1] step 1\n[gw1] step 3\n"


def test_notes_on_a_terminal_are_redrawn_below_and_erased_at_the_end() -> None:
    stream = Tty()
    line = ProgressLine(stream, clock=Clock(), below=True)
    with reporting(line):
        note("step 0")
        note("step 1")
    # one new line under pytest's, redrawn in place, erased, and the cursor back up
    assert stream.getvalue() == "\n\rstep 0\x1b[K\rstep 1\x1b[K" + ERASE + "\x1b[A"


def test_steps_in_a_log_are_every_one_a_line_and_the_first_line_alone_starts_a_new_one() -> None:
    """A log prints every :func:`step` (the recipe search's experiments), however close they follow,
    while notes stay at most one per interval; below pytest's results, only the log's first line
    starts a new line (not each job's first)."""
    clock, stream = Clock(), io.StringIO()
    log = ProgressLog(stream, interval=30.0, clock=clock, below=True, prefix="[gw1] ")
    with reporting(log):
        step("step 0")
        step("step 1")
        note("a note")  # right after a step: dropped
        clock.now += 1
        with task("compare", 10) as advance:
            clock.now += 31
            advance(5)
            advance(5)
        step("step 2")
    assert stream.getvalue() == (
        "\n[gw1] step 0\n[gw1] step 1\n[gw1] compare: 5 / 10 records, 0.161 rec/s, 31s left\n"
        "[gw1] compare: 10 / 10 records in 31s\n[gw1] step 2\n"
    )
    step("outside")  # no progress installed: nothing, no error
    terminal = Tty()
    with reporting(ProgressLine(terminal, clock=Clock())):
        step("step 0")
    assert terminal.getvalue() == "\rstep 0\x1b[K" + ERASE  # a note on a terminal: redrawn, erased


class Lines(io.StringIO):
    """A stream two threads write to, one line at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            return super().write(text)


def test_heartbeat_speaks_through_a_log_with_its_prefix_and_ends_with_its_block() -> None:
    """In a log, :func:`heartbeat` says ``still working`` with the log's prefix whenever the log was
    silent for its interval; the log's own lines reset the clock; its thread ends with the block. On a
    terminal, with no progress, or with an interval of 0, no thread at all."""
    stream = Lines()
    log = ProgressLog(stream, interval=0.05, prefix="[gw0] ")
    with reporting(log):
        with heartbeat("qaccuracy: analysing pair"):
            for index in range(10):  # a job that talks every 10 ms: never silent long enough
                step(f"step {index}")
                time.sleep(0.01)
            time.sleep(0.32)  # then one long step: about six beats
        after = stream.getvalue()
        time.sleep(0.15)
        assert stream.getvalue() == after  # the thread ended with the block
    lines = after.splitlines()
    assert lines[:10] == [f"[gw0] step {i}" for i in range(10)]
    assert 3 <= len(lines[10:]) <= 8, lines
    beat = r"\[gw0\] qaccuracy: analysing pair: still working \(0s since the last line, 0s in all\)"
    assert all(re.fullmatch(beat, line) for line in lines[10:]), lines
    assert log.beat is None

    before = threading.active_count()
    for progress in (ProgressLine(Tty()), None, ProgressLog(io.StringIO(), interval=0.0)):
        with reporting(progress), heartbeat("qaccuracy: analysing pair"):
            assert threading.active_count() == before
