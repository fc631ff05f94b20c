"""``atomic.py`` on its own: temp names, folders, binary mode, strict JSON and the up-front
checks of output paths (docs/cli.md: one error line before any work)."""

from __future__ import annotations

import json
import math
import re

import pytest

from pytest_qaccuracy import atomic
from pytest_qaccuracy.errors import InputError


def test_temp_names_are_hidden_random_and_beside_the_target(tmp_path) -> None:
    target = tmp_path / "summary.json"
    first, second = atomic.temp_name(target), atomic.temp_name(target)
    assert first.parent == tmp_path and first != second
    assert re.fullmatch(r"\.summary\.json\.[0-9a-f]{16}\.tmp", first.name)


def test_missing_folders_are_created_and_binary_mode_writes_bytes(tmp_path) -> None:
    target = tmp_path / "a" / "b" / "blob.bin"
    assert atomic.atomic_write(target, lambda handle: handle.write(b"\x00\xff"), mode="wb") == target
    assert target.read_bytes() == b"\x00\xff"
    text = tmp_path / "c" / "d" / "note.txt"
    atomic.atomic_write_text(text, "é → ∞")
    assert text.read_bytes() == "é → ∞".encode()
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["blob.bin"]  # no temp file left


def test_temp_folders_are_removed_with_their_content(tmp_path) -> None:
    folder = tmp_path / ".out.0123.tmp"
    (folder / "deep").mkdir(parents=True)
    (folder / "deep" / "x.json").write_text("{}")
    atomic.discard(folder)
    atomic.discard(tmp_path / "never-made")  # nothing there: nothing to do
    assert list(tmp_path.iterdir()) == []


def test_finite_json_replaces_nan_and_inf_at_any_depth() -> None:
    data = {"a": [1.5, math.nan, (math.inf, -math.inf)], "b": {"c": 2, "d": "nan", "e": -0.25}}
    assert atomic.finite_json(data) == {"a": [1.5, None, [None, None]], "b": {"c": 2, "d": "nan", "e": -0.25}}


def test_json_is_strict_indented_and_ends_with_a_newline(tmp_path) -> None:
    target = atomic.atomic_write_json(tmp_path / "x.json", {"a": [1.5, math.nan]})
    assert target.read_text() == '{\n  "a": [\n    1.5,\n    null\n  ]\n}\n'


def test_file_targets_checked_before_any_work(tmp_path) -> None:
    (tmp_path / "file.txt").write_text("x")
    atomic.check_file_target(tmp_path / "file.txt", "--out")  # an existing file is replaced
    atomic.check_file_target(tmp_path / "new" / "deeper" / "out.json", "--out")  # folders will be made
    with pytest.raises(InputError, match=rf"^--out {re.escape(str(tmp_path))}: is a directory, expected a file$"):
        atomic.check_file_target(tmp_path, "--out")
    below = tmp_path / "file.txt" / "a" / "b.json"
    message = f"--out {below}: cannot be created, {tmp_path / 'file.txt'} is not a directory"
    with pytest.raises(InputError, match=f"^{re.escape(message)}$"):
        atomic.check_file_target(below, "--out")


def test_dir_targets_checked_before_any_work(tmp_path) -> None:
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "out" / "index.html").mkdir(parents=True)
    atomic.check_dir_target(tmp_path / "new" / "deeper", "--html")  # will be made
    atomic.check_dir_target(tmp_path / "out", "--html", ["summary.json"])
    with pytest.raises(
        InputError, match=f"^{re.escape(f'--html {tmp_path}/out: index.html exists there as a directory')}$"
    ):
        atomic.check_dir_target(tmp_path / "out", "--html", ["summary.json", "index.html"])
    with pytest.raises(
        InputError, match=f"^{re.escape(f'--html {tmp_path}/file.txt: is a file, expected a directory')}$"
    ):
        atomic.check_dir_target(tmp_path / "file.txt", "--html")
    below = tmp_path / "file.txt" / "sub"
    with pytest.raises(InputError, match=re.escape(f"--html {below}: cannot be created, {tmp_path}/file.txt is not")):
        atomic.check_dir_target(below, "--html")


def test_discard_never_raises_when_a_removal_fails(tmp_path, monkeypatch) -> None:
    """Discarding runs while another error is on its way: it must not replace that error."""
    folder = tmp_path / ".out.0123.tmp"
    (folder / "deep").mkdir(parents=True)

    def refuse(*args, **kwargs):
        raise PermissionError("busy")

    monkeypatch.setattr(atomic.os, "rmdir", refuse)
    atomic.discard(folder)  # no exception; the folder may stay


def test_a_failed_write_is_one_input_error_naming_the_option(tmp_path, monkeypatch) -> None:
    """A full disk (ENOSPC at fsync) while writing ``--json``: one InputError naming the option, the
    path and the reason; the earlier file is as it was and no temp file is left."""
    import errno
    import os

    target = tmp_path / "r.json"
    atomic.atomic_write_json(target, {"run": 1})

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(InputError) as info, atomic.write_errors("--json", target):
        atomic.atomic_write_json(target, {"run": 2})
    assert str(info.value) == f"--json {target}: could not be written (No space left on device); left as it was"
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert json.loads(target.read_text()) == {"run": 1} and [p.name for p in tmp_path.iterdir()] == ["r.json"]
    fire = re.escape(f"--out {target}: could not be written (disk on fire); left")
    with pytest.raises(InputError, match=fire), atomic.write_errors("--out", target):
        raise OSError("disk on fire")  # no errno: the text is the reason
    with pytest.raises(ValueError, match="not an OSError"), atomic.write_errors("--out", target):
        raise ValueError("not an OSError")  # other errors pass through unchanged
