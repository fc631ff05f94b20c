"""Publish a folder of artifacts as one set: built in a temp sibling folder, swapped in with one rename.

A reader of the folder sees the previous set or the new one, never a mix of two runs or half of
one, whatever interrupts the writer. Files in the folder that the set does not own (a
``.gitignore``, notes) are carried over as hard links; a sub-folder the set does not own is refused,
since replacing the folder would drop it.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import TypeVar

from pytest_qaccuracy.atomic import check_dir_target, discard
from pytest_qaccuracy.errors import InputError

T = TypeVar("T")

#: Linux ``renameat2`` arguments: swap two paths in one step.
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def stage_name(directory: Path) -> Path:
    """A fresh hidden sibling of ``directory``: ``.<name>.<16 hex digits>.tmp``."""
    return directory.parent / f".{directory.name}.{secrets.token_hex(8)}.tmp"


def _is_stale_temp(name: str) -> bool:
    """A temp file of an atomic write that an older version left behind (``.<name>.<random>.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp")


def foreign_entries(directory: Path, owned: Collection[str]) -> tuple[list[Path], list[Path]]:
    """Entries of ``directory`` the set does not own: ``(files to carry over, anything else)``."""
    if not directory.is_dir():
        return [], []
    files, others = [], []
    for entry in sorted(directory.iterdir()):
        if entry.name in owned or _is_stale_temp(entry.name):
            continue
        (files if entry.is_file() and not entry.is_symlink() else others).append(entry)
    return files, others


def check_publishable(directory: Path, what: str, owned: Collection[str], protected: Iterable[Path] = ()) -> None:
    """Refuse, before any work, a folder that cannot be replaced as a whole (``what`` names the option).

    Raises:
        InputError: ``directory`` is a file, cannot be created or written, holds a sub-folder the set
            does not own, or is (or contains) one of ``protected`` (the project, the current folder).
    """
    directory = Path(directory)
    for path in protected:
        if path == directory or directory in path.parents:
            raise InputError(f"{what} {directory}: holds {path}; artifacts need a folder of their own")
    check_dir_target(directory, what)
    if directory.exists() and not os.access(directory.parent, os.W_OK | os.X_OK):
        raise InputError(f"{what} {directory}: cannot be replaced, {directory.parent} is not writable")
    _, others = foreign_entries(directory, owned)
    if others:
        names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in others[:3])
        raise InputError(
            f"{what} {directory}: holds {names}, not written by pytest-qaccuracy; the folder is replaced "
            "as a whole each time its artifacts are written: move them or choose a folder of its own"
        )


def check_out_dir(directory: Path, what: str, owned: Collection[str] = ()) -> None:
    """Refuse, before any work, a command's output folder (``--out-dir``) that cannot be published as
    a set: :func:`~pytest_qaccuracy.atomic.check_dir_target` (``owned`` names the files it will hold),
    then :func:`check_publishable`, never the current folder (it would be replaced under the user).

    Raises:
        InputError: naming ``what`` and the folder.
    """
    check_dir_target(directory, what, owned)
    check_publishable(Path(directory).absolute(), what, owned, protected=(Path.cwd(),))


def _carry_over(files: Iterable[Path], stage: Path) -> None:
    """Hard-link (or copy) the folder's own files into the new set; the originals stay untouched."""
    for file in files:
        try:
            os.link(file, stage / file.name)
        except OSError:
            shutil.copy2(file, stage / file.name)


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    """The C library's ``renameat2``, looked up once (None off Linux or on an old C library)."""
    if not sys.platform.startswith("linux"):
        return None
    return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` in one step (Linux ``renameat2``); False where the system cannot."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a filesystem without RENAME_EXCHANGE
        return False
    raise OSError(code, os.strerror(code), str(b))


def _swap(stage: Path, directory: Path) -> Path | None:
    """Put ``stage`` at ``directory``; returns where the old folder went (to remove), or None."""
    if not directory.exists():
        try:
            os.rename(stage, directory)
            return None
        except OSError as exc:  # another session published meanwhile: swap with its folder
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    if _exchange(stage, directory):
        return stage
    old = stage_name(directory)  # two renames: for a moment no folder, but never a mixed one
    os.rename(directory, old)
    try:
        os.rename(stage, directory)
    except BaseException:
        os.rename(old, directory)
        raise
    return old


def publish_folder(directory: Path, build: Callable[[Path], T], owned: Collection[str]) -> T:
    """Call ``build(stage)`` on an empty temp sibling of ``directory``, then make it ``directory``.

    Files in ``directory`` outside ``owned`` are carried over. On any exception (Ctrl-C included)
    ``directory`` is left as it was and the temp folder removed. Returns what ``build`` returned.

    Raises:
        InputError: ``directory`` holds a sub-folder outside ``owned`` (see :func:`check_publishable`).
    """
    directory = Path(directory).absolute()
    directory.parent.mkdir(parents=True, exist_ok=True)
    stage = stage_name(directory)  # named before it exists: an interrupt inside mkdir still finds it
    leftover: Path | None = stage
    try:
        stage.mkdir()
        result = build(stage)
        files, others = foreign_entries(directory, owned)
        if others:
            check_publishable(directory, "artifacts folder", owned)
        _carry_over(files, stage)
        leftover = _swap(stage, directory)
    finally:
        if leftover is not None:
            discard(leftover)
    return result


def publish_files(directory: Path, build: Callable[[Path], list[Path]], owned: Collection[str]) -> list[Path]:
    """:func:`publish_folder` for a ``build`` that returns the paths it wrote; returns them as published
    (a path inside the temp folder becomes the same path inside ``directory``)."""
    directory = Path(directory).absolute()
    stages: list[Path] = []

    def in_stage(stage: Path) -> list[Path]:
        stages.append(stage)
        return build(stage)

    written = publish_folder(directory, in_stage, owned)
    return [directory / p.relative_to(stages[0]) if p.is_relative_to(stages[0]) else p for p in written]
