"""Artifacts published as one set: a reader sees the old set or the new one, never a mix,
whatever interrupts the writer, and no temp folder or file is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_qaccuracy.atomic import atomic_write_text
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.report import publish
from pytest_qaccuracy.report.publish import check_publishable, publish_folder

OWNED = ("summary.json", "report.html", "pairs")


def _build(run: int, files: int = 3):
    def build(stage: Path) -> list[Path]:
        written = [atomic_write_text(stage / "pairs" / f"p{i}.json", str(run)) for i in range(files)]
        return [*written, atomic_write_text(stage / "summary.json", str(run))]

    return build


def _contents(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_new_folder_appears_whole(tmp_path):
    out = tmp_path / "acc"
    written = publish_folder(out, _build(1), OWNED)
    assert _contents(out) == {"pairs/p0.json": "1", "pairs/p1.json": "1", "pairs/p2.json": "1", "summary.json": "1"}
    assert [p.parent.parent.name for p in written][-1] != "acc"  # built in the temp folder, not in place
    assert [p.name for p in tmp_path.iterdir()] == ["acc"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_a_second_run_replaces_the_set_and_keeps_foreign_files(tmp_path, monkeypatch, exchange):
    out = tmp_path / "acc"
    publish_folder(out, _build(1, files=3), OWNED)
    (out / ".gitignore").write_text("*\n")
    (out / ".summary.json.0123456789abcdef.tmp").write_text("left by an older version")
    if not exchange:
        monkeypatch.setattr(publish, "_exchange", lambda a, b: False)
    publish_folder(out, _build(2, files=2), OWNED)
    # p2.json of run 1 is gone: no mix of two runs; the user's file stays; the stale temp file goes
    assert _contents(out) == {".gitignore": "*\n", "pairs/p0.json": "2", "pairs/p1.json": "2", "summary.json": "2"}
    assert [p.name for p in tmp_path.iterdir()] == ["acc"]


def test_a_failed_build_leaves_the_old_set_and_no_temp_folder(tmp_path):
    out = tmp_path / "acc"
    publish_folder(out, _build(1), OWNED)

    def broken(stage: Path) -> None:
        _build(2)(stage)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        publish_folder(out, broken, OWNED)
    assert set(_contents(out).values()) == {"1"}
    assert [p.name for p in tmp_path.iterdir()] == ["acc"]


def test_folders_that_cannot_be_replaced_are_refused(tmp_path):
    out = tmp_path / "acc"
    (out / "baselines").mkdir(parents=True)
    with pytest.raises(InputError) as error:
        check_publishable(out, "--qaccuracy-artifacts-dir", OWNED)
    assert str(error.value) == (
        f"--qaccuracy-artifacts-dir {out}: holds baselines/, not written by pytest-qaccuracy; the folder is "
        "replaced as a whole each time its artifacts are written: move them or choose a folder of its own"
    )
    with pytest.raises(InputError, match="holds baselines/"):
        publish_folder(out, _build(1), OWNED)
    assert [p.name for p in out.iterdir()] == ["baselines"] and [p.name for p in tmp_path.iterdir()] == ["acc"]
    with pytest.raises(InputError, match=f"holds {tmp_path / 'project'}; artifacts need a folder of their own"):
        check_publishable(tmp_path, "qaccuracy_artifacts_dir", OWNED, protected=[tmp_path / "project"])
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="is a file, expected a directory"):
        check_publishable(tmp_path / "file", "qaccuracy_artifacts_dir", OWNED)


#: The calls publishing makes that change the disk: an interrupt may land just after any of them.
STEPS = ("open", "fsync", "replace", "rename", "link", "mkdir", "rmdir", "unlink")


def test_an_interrupt_after_any_step_leaves_the_old_set_or_the_new_one(tmp_path, monkeypatch):
    """Deterministic: KeyboardInterrupt right after the Nth call that changes the disk, for every N."""
    out = tmp_path / "acc"
    publish_folder(out, _build(1, files=3), OWNED)
    (out / "notes.txt").write_text("mine")
    old = _contents(out)
    new = {**{f"pairs/p{i}.json": "2" for i in range(2)}, "summary.json": "2", "notes.txt": "mine"}
    for n in range(1, 200):
        count = [0]

        def counted(real, count=count, n=n):
            def call(*args, **kwargs):
                result = real(*args, **kwargs)
                count[0] += 1
                if count[0] == n:
                    raise KeyboardInterrupt
                return result

            return call

        for name in STEPS:
            monkeypatch.setattr(os, name, counted(getattr(os, name)))
        monkeypatch.setattr(publish, "_exchange", counted(publish._exchange))
        try:
            publish_folder(out, _build(2, files=2), OWNED)
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        monkeypatch.undo()
        assert [p.name for p in tmp_path.iterdir()] == ["acc"], n
        assert _contents(out) in (old, new), n
        if not interrupted:  # every step has been interrupted once
            assert n > 10
            break
        if _contents(out) == new:  # interrupted after the swap: publish the old set again
            publish_folder(out, _build(1, files=3), OWNED)
    else:
        pytest.fail("publishing never completed")


WRITER = """
import itertools, sys
from pathlib import Path
from pytest_qaccuracy.atomic import atomic_write_text
from pytest_qaccuracy.report.publish import publish_folder

def build(run):
    def write(stage):
        for i in range(12):
            atomic_write_text(stage / "pairs" / f"p{i}.json", str(run) * 2000)
        atomic_write_text(stage / "summary.json", str(run))
    return write

print("ready", flush=True)
try:
    for run in itertools.count():
        publish_folder(Path(sys.argv[1]), build(run), ("summary.json", "pairs"))
except KeyboardInterrupt:
    sys.exit(130)
"""


def _wait_interrupting(process: subprocess.Popen, stderr: Path, deadline: float = 30.0) -> int:
    """Wait for ``process``, pressing Ctrl-C again only where Python said it dropped the last one: a
    KeyboardInterrupt raised inside a weakref callback or ``__del__`` is printed as "Exception ignored
    in ..." and the program goes on (seen on Python 3.13 when the signal lands in an import's lock
    clean-up). A writer that goes on without that line swallowed the interrupt itself: a failure."""
    end, dropped = time.monotonic() + deadline, 0
    while True:
        try:
            return process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            said = stderr.read_text().count("Exception ignored in")
            assert said > dropped, f"the writer went on after Ctrl-C, and Python did not drop it: {stderr.read_text()}"
            assert time.monotonic() < end, "the writer outlived every Ctrl-C"
            dropped = said
            process.send_signal(signal.SIGINT)


SWALLOWS = """
import signal, sys, time
def dropped(number, frame):  # as Python reports an interrupt it drops, then back to the default
    print("Exception ignored in: <function remove>", file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGINT, dropped if sys.argv[1] == "drops" else lambda number, frame: None)
print("ready", flush=True)
try:
    while True:
        time.sleep(0.01)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_second_ctrl_c_only_where_python_dropped_the_first(tmp_path) -> None:
    script = tmp_path / "swallows.py"
    script.write_text(SWALLOWS)
    for how in ("drops", "swallows"):
        stderr = tmp_path / f"{how}.txt"
        with stderr.open("w") as errors:
            command = [sys.executable, str(script), how]
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
        try:
            assert process.stdout.readline() == "ready\n"
            process.send_signal(signal.SIGINT)
            if how == "drops":
                assert _wait_interrupting(process, stderr) == 130
            else:
                with pytest.raises(AssertionError, match="the writer went on after Ctrl-C, and Python did not drop it"):
                    _wait_interrupting(process, stderr)
        finally:
            process.kill()
            process.wait()
            process.stdout.close()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigint_at_many_points_leaves_one_whole_set_and_no_temp_files(tmp_path):
    """A real process publishing sets in a loop, interrupted after 14 different delays: the signal
    lands in a write, an fsync, a rename, the swap or the removal of the old set."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    for attempt in range(14):
        root = tmp_path / f"run{attempt}"
        root.mkdir()
        stderr = tmp_path / f"stderr{attempt}.txt"
        with stderr.open("w") as errors:
            process = subprocess.Popen(
                [sys.executable, str(script), str(root / "acc")], stdout=subprocess.PIPE, stderr=errors, text=True
            )
        assert process.stdout.readline() == "ready\n"
        time.sleep(0.003 * attempt)
        process.send_signal(signal.SIGINT)
        # 130 from the writer's handler; -SIGINT when the signal lands outside it (during interpreter
        # start-up or shutdown, seen on Python 3.10): the folder must be whole either way
        assert _wait_interrupting(process, stderr) in (130, -signal.SIGINT)
        process.stdout.close()
        assert [p.name for p in root.iterdir()] in ([], ["acc"]), attempt  # no temp sibling
        if (root / "acc").exists():
            contents = _contents(root / "acc")
            run = contents["summary.json"]
            assert sorted(contents) == sorted(["summary.json", *(f"pairs/p{i}.json" for i in range(12))])
            assert all(text == run * 2000 for name, text in contents.items() if name != "summary.json")
    assert os.listdir(tmp_path).count("writer.py") == 1
