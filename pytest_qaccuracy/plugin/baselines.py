"""The baseline workflow: one folder (``qaccuracy_baseline_dir``, default ``.qaccuracy-baselines/``),
compared when it exists, rewritten by ``--qaccuracy-update-baselines``; one summary line.

A baseline is ``<folder>/<id>-<hash8>.json`` (:func:`~pytest_qaccuracy.report.baseline.profile`).
Comparing is automatic once the folder exists: a pair without a baseline there is *missing* (its
suite ``drift`` item skips) unless ``--qaccuracy-baseline=DIR`` asks for every pair to have one.
Updating writes, at the end of the session and on the controller only, the pairs that ran and
passed (``--qaccuracy-update-all-baselines``: failing ones too). Files no pair of the session
produced are listed as *stale*, and deleted with ``--qaccuracy-prune-baselines`` when the session
ran every test (complete, nothing deselected). Only stdlib at module level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_qaccuracy.plugin.pairs import PairSpec
    from pytest_qaccuracy.plugin.records import PairRecord
    from pytest_qaccuracy.plugin.settings import QAccuracySettings
    from pytest_qaccuracy.report.baseline import BaselineStatus, DriftRule

UPDATE_HINT = "write one with --qaccuracy-update-baselines"
#: The ``op`` of a drift row for a metric better than its baseline beyond the rule.
IMPROVED = "improved"


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
        return path.relative_to(root).as_posix()  # the root itself: "."
    except ValueError:
        return str(path)


def _unread(record: PairRecord) -> bool:
    """The pair's baseline was not compared: the failing ``baseline`` row of
    :meth:`QAccuracySession.drift` (a file that cannot be read, or a strict folder without one)."""
    return any(
        c.outcome.check == "drift" and c.outcome.metric == "baseline" and not c.outcome.passed for c in record.checks
    )


def _drifted(record: PairRecord) -> bool:
    return not _unread(record) and any(
        c.outcome.check == "drift" and not c.outcome.passed and c.outcome.op != IMPROVED for c in record.checks
    )


def _improved(record: PairRecord) -> bool:
    return any(c.outcome.check == "drift" and c.outcome.op == IMPROVED for c in record.checks)


def drift_rules(settings: QAccuracySettings) -> list[DriftRule]:
    """The session's drift rules (``qaccuracy_max_drift``, else the default), parsed."""
    from pytest_qaccuracy.report.baseline import DEFAULT_DRIFT, parse_drift_rule

    return [parse_drift_rule(text) for text in settings.max_drift or DEFAULT_DRIFT]


def pair_files(record: PairRecord | PairSpec) -> dict[str, str | None]:
    """The files a baseline records the sha256 of, by the name it records them under."""
    return {
        "fp32_model": str(record.fp32),
        "quantized_model": str(record.quantized),
        "data": str(record.data),
        "labels": str(record.labels) if record.labels else None,
    }


def _prune(folder: Path, names: Sequence[str]) -> tuple[str, ...]:
    """Delete the named files of ``folder`` that are baselines (a file that does not read as one
    is left where it is); the names deleted."""
    from pytest_qaccuracy.report.baseline import load_baseline

    pruned = []
    for name in names:
        path = folder / name
        try:
            load_baseline(path)
        except ValueError:
            continue
        path.unlink(missing_ok=True)
        pruned.append(name)
    return tuple(pruned)


def finish_baselines(
    settings: QAccuracySettings, records: Sequence[PairRecord], root: Path, prune_refused: str | None = None
) -> tuple[BaselineStatus | None, list[Path]]:
    """Write baselines when asked and say what the session did with its folder; ``(None, [])``
    when it neither compared nor wrote any. With ``--qaccuracy-prune-baselines``, delete the
    stale files unless ``prune_refused`` says why not. Raises OSError when a write fails."""
    from pytest_qaccuracy.analysis.results import ComparisonResult
    from pytest_qaccuracy.report.baseline import BaselineStatus, baseline_files, profile, provenance, write_baseline

    stems = {f"{record.stem}.json" for record in records}
    if settings.save_baseline_dir is not None:
        folder = settings.save_baseline_dir
        found: dict[str, list[str]] = {"saved": [], "updated": [], "unchanged": [], "failing": []}
        written = []
        rules = drift_rules(settings)
        for record in records:
            if not (settings.save_failing_baselines or record.passed):
                found["failing"].append(record.id)
                continue
            path = folder / f"{record.stem}.json"
            result = ComparisonResult.from_dict(record.comparison)
            document = profile(result, record.id, record.task, rules, provenance(pair_files(record)))
            found[write_baseline(path, document)].append(record.id)
            written.append(path)
        stale = tuple(name for name in baseline_files(folder) if name not in stems)
        lists = {key: tuple(value) for key, value in found.items()}
        status = BaselineStatus(shown(folder, root), True, stale=stale, **lists)
        return _pruned(status, folder, settings, prune_refused), written
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
        improved=tuple(r.id for r in records if _improved(r)),
    )
    return _pruned(status, folder, settings, prune_refused), []


def _pruned(status: BaselineStatus, folder: Path, settings: QAccuracySettings, refused: str | None) -> BaselineStatus:
    """``status`` after pruning its stale files, when asked and allowed."""
    if not settings.prune_baselines or not status.stale:
        return status
    if refused:
        return replace(status, prune_refused=refused)
    pruned = _prune(folder, status.stale)
    return replace(status, stale=tuple(n for n in status.stale if n not in pruned), pruned=pruned)
