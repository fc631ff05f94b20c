"""The baseline workflow: one folder (``qaccuracy_baseline_dir``, default ``.qaccuracy-baselines/``),
compared when it exists, rewritten by ``--qaccuracy-update-baselines``; one summary line.

A baseline is ``<folder>/<id>-<hash8>.json`` (:func:`~pytest_qaccuracy.report.baseline.profile`).
Comparing is automatic once the folder exists: a pair without a baseline there is *missing* (its
suite ``drift`` item skips) unless ``--qaccuracy-baseline=DIR`` asks for every pair to have one.
Updating writes, at the end of the session and on the controller only, the pairs that ran and
passed (``--qaccuracy-update-all-baselines``: failing ones too). Files are never deleted: those no
pair of the session produced are listed as *stale*. Only stdlib at module level.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_qaccuracy.plugin.pairs import PairSpec
    from pytest_qaccuracy.plugin.records import PairRecord
    from pytest_qaccuracy.plugin.settings import QAccuracySettings
    from pytest_qaccuracy.report.baseline import BaselineStatus

UPDATE_HINT = "write one with --qaccuracy-update-baselines"


def compared_dir(settings: QAccuracySettings) -> Path | None:
    """The folder this session compares against: the baseline folder when it exists (always with
    ``--qaccuracy-baseline``), else None."""
    folder = settings.baseline_dir
    if folder is None or not (settings.baseline_required or folder.is_dir()):
        return None
    return folder


def baseline_path(folder: Path, spec: PairSpec, root: Path) -> Path:
    """The baseline of a pair: ``<folder>/<stem>.json``, the stem of its artifacts."""
    return folder / f"{spec.stem(root)}.json"


def missing_reason(settings: QAccuracySettings, spec: PairSpec, root: Path) -> str | None:
    """Why a pair's drift check cannot run (compared automatically, no baseline yet), or None."""
    folder = compared_dir(settings)
    if folder is None or settings.baseline_required or baseline_path(folder, spec, root).is_file():
        return None
    return f"no baseline for pair '{spec.id}' in {shown(folder, root)} ({UPDATE_HINT})"


def shown(path: Path, root: Path) -> str:
    """``path`` relative to the rootdir when inside it (how users name the folder), else absolute."""
    try:
        return path.relative_to(root).as_posix() or "."
    except ValueError:
        return str(path)


def _unread(record: PairRecord) -> bool:
    """The pair's baseline was not compared: the failing ``baseline`` row of
    :meth:`QAccuracySession.drift` (a file that cannot be read, or a strict folder without one)."""
    return any(
        c.outcome.check == "drift" and c.outcome.metric == "baseline" and not c.outcome.passed for c in record.checks
    )


def _drifted(record: PairRecord) -> bool:
    return not _unread(record) and any(c.outcome.check == "drift" and not c.outcome.passed for c in record.checks)


def finish_baselines(
    settings: QAccuracySettings, records: Sequence[PairRecord], root: Path
) -> tuple[BaselineStatus | None, list[Path]]:
    """Write baselines when asked and say what the session did with its folder; ``(None, [])``
    when it neither compared nor wrote any. Raises OSError when a write fails."""
    from pytest_qaccuracy.analysis.results import ComparisonResult
    from pytest_qaccuracy.report.baseline import BaselineStatus, baseline_files, profile, write_baseline

    stems = {f"{record.stem}.json" for record in records}
    if settings.save_baseline_dir is not None:
        folder = settings.save_baseline_dir
        found: dict[str, list[str]] = {"saved": [], "updated": [], "unchanged": [], "failing": []}
        written = []
        for record in records:
            if not (settings.save_failing_baselines or record.passed):
                found["failing"].append(record.id)
                continue
            path = folder / f"{record.stem}.json"
            document = profile(ComparisonResult.from_dict(record.comparison), record.id, record.task)
            found[write_baseline(path, document)].append(record.id)
            written.append(path)
        stale = tuple(name for name in baseline_files(folder) if name not in stems)
        lists = {key: tuple(value) for key, value in found.items()}
        return BaselineStatus(shown(folder, root), True, stale=stale, **lists), written
    folder = compared_dir(settings)
    if folder is None:
        return None, []
    present = set(baseline_files(folder))
    found = [r for r in records if f"{r.stem}.json" in present]
    status = BaselineStatus(
        shown(folder, root),
        False,
        compared=tuple(r.id for r in found if not _unread(r)),
        drifted=tuple(r.id for r in records if _drifted(r)),
        unreadable=tuple(r.id for r in found if _unread(r)),
        missing=tuple(r.id for r in records if f"{r.stem}.json" not in present),
        stale=tuple(sorted(present - stems)),
    )
    return status, []


__all__ = ["compared_dir", "finish_baselines", "missing_reason", "shown"]
