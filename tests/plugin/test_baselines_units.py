"""Unit tests of the plugin's baseline workflow (``plugin/baselines.py``) without a pytest session:
which folder is compared, why a pair has no baseline, what a session writes, finds stale and prunes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_qaccuracy.analysis.results import ComparisonResult, LayerResult, OutputResult
from pytest_qaccuracy.outcomes import Outcome
from pytest_qaccuracy.plugin.baselines import (
    IMPROVED,
    UPDATE_HINT,
    _prune,
    baseline_path,
    compared_dir,
    drift_rules,
    finish_baselines,
    missing_reason,
    pair_files,
    shown,
)
from pytest_qaccuracy.plugin.pairs import PairSpec
from pytest_qaccuracy.plugin.records import PairRecord, RecordedCheck
from pytest_qaccuracy.report.baseline import BaselineStatus, DriftRule
from tests.plugin.settings_stand_in import plugin_settings

_settings = plugin_settings


def _spec(root: Path, pair_id: str = "p", labels: Path | None = None) -> PairSpec:
    return PairSpec(id=pair_id, fp32=root / "a.onnx", quantized=root / "b.onnx", data=root / "d.npz", labels=labels)


# --- which folder, which file, why none ----------------------------------------------------------


def test_compared_dir(tmp_path: Path) -> None:
    folder = tmp_path / "baselines"
    assert compared_dir(_settings()) is None
    assert compared_dir(_settings(baseline_dir=folder)) is None  # not there: nothing compared
    assert compared_dir(_settings(baseline_dir=folder, baseline_required=True)) == folder  # asked for
    folder.mkdir()
    assert compared_dir(_settings(baseline_dir=folder)) == folder
    assert compared_dir(_settings(baseline_dir=folder, baseline_required=True)) == folder
    assert compared_dir(_settings(baseline_required=True)) is None


def test_baseline_path_is_the_artifact_stem(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "my pair")
    key = "my pair|a.onnx|b.onnx|d.npz"
    expected = tmp_path / "f" / f"my_pair-{hashlib.sha256(key.encode()).hexdigest()[:8]}.json"
    assert baseline_path(tmp_path / "f", spec, tmp_path) == expected


def test_shown(tmp_path: Path) -> None:
    assert shown(tmp_path / "a" / "b", tmp_path) == "a/b"
    assert shown(tmp_path, tmp_path) == "."
    assert shown(tmp_path.parent / "elsewhere", tmp_path) == str(tmp_path.parent / "elsewhere")


def test_missing_reason(tmp_path: Path) -> None:
    folder = tmp_path / "baselines"
    spec = _spec(tmp_path)
    assert missing_reason(_settings(baseline_dir=folder), spec, tmp_path) is None  # no folder: not compared
    folder.mkdir()
    settings = _settings(baseline_dir=folder)
    assert missing_reason(settings, spec, tmp_path) == (
        "no baseline for pair 'p' in baselines (write one with --qaccuracy-update-baselines)"
    )
    assert UPDATE_HINT == "write one with --qaccuracy-update-baselines"
    # a strict folder fails the check instead of skipping it: no reason to skip
    assert missing_reason(replace(settings, baseline_required=True), spec, tmp_path) is None
    baseline_path(folder, spec, tmp_path).write_text("{}")
    assert missing_reason(settings, spec, tmp_path) is None
    outside = tmp_path.parent / f"{tmp_path.name}-other"
    outside.mkdir()
    reason = missing_reason(_settings(baseline_dir=outside), spec, tmp_path)
    assert reason == f"no baseline for pair 'p' in {outside} ({UPDATE_HINT})"


def test_drift_rules() -> None:
    assert drift_rules(_settings()) == [DriftRule("sqnr", 1.0, False, "sqnr:-1.0")]
    rules = drift_rules(_settings(max_drift=("mse:+10%", " cosine:-0.01 ")))
    assert rules == [DriftRule("mse", 10.0, True, "mse:+10%"), DriftRule("cosine", 0.01, False, "cosine:-0.01")]


def test_pair_files_of_a_spec_and_of_a_record(tmp_path: Path) -> None:
    spec = _spec(tmp_path, labels=tmp_path / "l.txt")
    assert pair_files(spec) == {
        "fp32_model": str(tmp_path / "a.onnx"),
        "quantized_model": str(tmp_path / "b.onnx"),
        "data": str(tmp_path / "d.npz"),
        "labels": str(tmp_path / "l.txt"),
    }
    assert pair_files(_spec(tmp_path))["labels"] is None
    record = _record(tmp_path, "r")
    assert pair_files(record) == {
        "fp32_model": record.fp32,
        "quantized_model": record.quantized,
        "data": record.data,
        "labels": None,
    }


# --- the end of a session ------------------------------------------------------------------------


def _comparison(sqnr: float) -> dict[str, Any]:
    return ComparisonResult(
        fp32_model="a.onnx",
        quantized_model="b.onnx",
        data="d.npz",
        records=2,
        metric_definitions={"sqnr": ""},
        outputs=[OutputResult("y", {"sqnr": sqnr})],
        layers=[LayerResult("t", "t_q", "n", "Conv", 0, {"sqnr": sqnr})],
        higher_is_better={"sqnr": True},
    ).to_dict()


def _drift(passed: bool, metric: str = "sqnr", op: str = ">=") -> RecordedCheck:
    outcome = Outcome(
        kind="drift",
        check="drift",
        scope="output",
        subject="output 'y'",
        metric=metric,
        op=op,
        threshold=1.0,
        value=2.0,
        passed=passed,
        source="baseline",
        detail="drift",
    )
    return RecordedCheck(test="t::test", index=0, outcome=outcome)


def _failed_tolerance() -> RecordedCheck:
    outcome = Outcome(
        kind="tolerance",
        check="min_sqnr",
        scope="output",
        subject="output 'y'",
        metric="sqnr",
        op=">=",
        threshold=40.0,
        value=2.0,
        passed=False,
        source="marker",
        detail="sqnr",
    )
    return RecordedCheck(test="t::test", index=1, outcome=outcome)


def _record(root: Path, pair_id: str, *checks: RecordedCheck, sqnr: float = 31.23456) -> PairRecord:
    for name in ("a.onnx", "b.onnx", "d.npz"):
        if not (root / name).exists():
            (root / name).write_bytes(name.encode())
    return PairRecord(
        id=pair_id,
        key=f"{pair_id}|key",
        stem=f"{pair_id}-stem",
        fp32=str(root / "a.onnx"),
        quantized=str(root / "b.onnx"),
        data=str(root / "d.npz"),
        backend="onnxruntime",
        scheme="onnxruntime",
        comparison=_comparison(sqnr),
        checks=checks,
    )


def test_finish_baselines_does_nothing_without_a_folder(tmp_path: Path) -> None:
    records = [_record(tmp_path, "p")]
    assert finish_baselines(_settings(), records, tmp_path) == (None, [])
    assert finish_baselines(_settings(baseline_dir=tmp_path / "none"), records, tmp_path) == (None, [])


def test_finish_baselines_writes_passing_pairs(tmp_path: Path) -> None:
    folder = tmp_path / "baselines"
    settings = _settings(save_baseline_dir=folder, max_drift=("sqnr:-0.5",))
    good, bad = _record(tmp_path, "good"), _record(tmp_path, "bad", _failed_tolerance())
    status, written = finish_baselines(settings, [good, bad], tmp_path)
    assert written == [folder / "good-stem.json"]
    assert status == BaselineStatus("baselines", True, saved=("good",), failing=("bad",))
    document = json.loads((folder / "good-stem.json").read_text())
    assert document["pair"] == "good"
    # a 0.5 dB rule resolves 0.005 dB: 3 decimals, more than 4 significant digits' 2
    assert document["outputs"] == {"y": {"sqnr": 31.235}} and document["layers"] == {"t": {"sqnr": 31.235}}
    sha = {name: hashlib.sha256(name.encode()).hexdigest() for name in ("a.onnx", "b.onnx", "d.npz")}
    assert document["produced_by"]["sha256"] == {
        "fp32_model": sha["a.onnx"],
        "quantized_model": sha["b.onnx"],
        "data": sha["d.npz"],
    }
    # again: unchanged; with failing pairs too: the failing one is saved; a new value: updated
    assert finish_baselines(settings, [good], tmp_path)[0] == BaselineStatus("baselines", True, unchanged=("good",))
    every = replace(settings, save_failing_baselines=True)
    moved = _record(tmp_path, "good", sqnr=20.0)
    status, written = finish_baselines(every, [moved, bad], tmp_path)
    assert status == BaselineStatus("baselines", True, saved=("bad",), updated=("good",))
    assert written == [folder / "good-stem.json", folder / "bad-stem.json"]
    assert json.loads((folder / "good-stem.json").read_text())["outputs"] == {"y": {"sqnr": 20.0}}


def test_finish_baselines_goes_on_past_a_failing_pair(tmp_path: Path) -> None:
    folder = tmp_path / "baselines"
    records = [_record(tmp_path, "bad", _failed_tolerance()), _record(tmp_path, "good")]
    status, written = finish_baselines(_settings(save_baseline_dir=folder), records, tmp_path)
    assert status == BaselineStatus("baselines", True, saved=("good",), failing=("bad",))
    assert written == [folder / "good-stem.json"]


def test_finish_baselines_saves_the_task_values(tmp_path: Path) -> None:
    folder = tmp_path / "baselines"
    task = {"acc": {"fp32": 0.9, "quantized": 0.812345, "higher_is_better": True}}
    record = replace(_record(tmp_path, "p"), task=task)
    finish_baselines(_settings(save_baseline_dir=folder), [record], tmp_path)
    document = json.loads((folder / "p-stem.json").read_text())
    assert document["task"] == {"acc": 0.8123}  # 4 significant digits
    assert document["higher_is_better"] == {"acc": True, "sqnr": True}


def test_finish_baselines_lists_stale_files_and_prunes_them_when_asked(tmp_path: Path) -> None:
    folder = tmp_path / "baselines"
    settings = _settings(save_baseline_dir=folder)
    finish_baselines(settings, [_record(tmp_path, "old"), _record(tmp_path, "b")], tmp_path)
    (folder / "notes.json").write_text("not a baseline")
    (folder / "readme.txt").write_text("not json either")
    status, _ = finish_baselines(settings, [_record(tmp_path, "b")], tmp_path)
    assert status == BaselineStatus("baselines", True, unchanged=("b",), stale=("notes.json", "old-stem.json"))
    refused, _ = finish_baselines(replace(settings, prune_baselines=True), [_record(tmp_path, "b")], tmp_path, "why")
    assert refused == replace(status, prune_refused="why")
    assert (folder / "old-stem.json").is_file()
    pruned, _ = finish_baselines(replace(settings, prune_baselines=True), [_record(tmp_path, "b")], tmp_path)
    # a file that does not read as a baseline stays, still stale
    assert pruned == replace(status, stale=("notes.json",), pruned=("old-stem.json",))
    assert sorted(p.name for p in folder.iterdir()) == ["b-stem.json", "notes.json", "readme.txt"]
    # nothing stale: nothing pruned, nothing refused
    clean = _settings(save_baseline_dir=tmp_path / "clean", prune_baselines=True)
    status, _ = finish_baselines(clean, [_record(tmp_path, "b")], tmp_path, "why")
    assert status == BaselineStatus("clean", True, saved=("b",))


def test_prune_deletes_only_baselines(tmp_path: Path) -> None:
    _, written = finish_baselines(_settings(save_baseline_dir=tmp_path), [_record(tmp_path, "x")], tmp_path)
    (tmp_path / "bad.json").write_text("{")
    assert _prune(tmp_path, ["bad.json", "x-stem.json", "gone.json"]) == ("x-stem.json", "gone.json")
    assert not written[0].exists() and (tmp_path / "bad.json").is_file()


def test_finish_baselines_compares(tmp_path: Path) -> None:
    folder = tmp_path / "baselines"
    folder.mkdir()
    for name in ("same", "drifted", "unread", "better", "zzz-old", "aaa-old"):
        (folder / f"{name}-stem.json").write_text("{}")
    records = [
        _record(tmp_path, "same", _drift(True)),
        _record(tmp_path, "drifted", _drift(True), _drift(False)),
        _record(tmp_path, "unread", _drift(False, metric="baseline"), _drift(False)),
        _record(tmp_path, "better", _drift(False, op=IMPROVED)),
        _record(tmp_path, "new", _drift(False)),  # no baseline, yet its drift check failed (strict folder)
        _record(tmp_path, "other", _failed_tolerance(), _drift(True, metric="baseline")),
    ]
    status, written = finish_baselines(_settings(baseline_dir=folder), records, tmp_path)
    assert written == []
    assert status == BaselineStatus(
        "baselines",
        False,
        compared=("same", "drifted", "better"),
        drifted=("drifted", "new"),
        unreadable=("unread",),
        missing=("new", "other"),
        stale=("aaa-old-stem.json", "zzz-old-stem.json"),
        improved=("better",),
    )
    assert IMPROVED == "improved"


def test_finish_baselines_compares_and_prunes(tmp_path: Path) -> None:
    folder = tmp_path / "baselines"
    finish_baselines(_settings(save_baseline_dir=folder), [_record(tmp_path, "a"), _record(tmp_path, "b")], tmp_path)
    settings = _settings(baseline_dir=folder, prune_baselines=True)
    status, _ = finish_baselines(settings, [_record(tmp_path, "a")], tmp_path, "deselected tests")
    assert status == BaselineStatus(
        "baselines", False, compared=("a",), stale=("b-stem.json",), prune_refused="deselected tests"
    )
    status, _ = finish_baselines(settings, [_record(tmp_path, "a")], tmp_path)
    assert status == BaselineStatus("baselines", False, compared=("a",), pruned=("b-stem.json",))
    assert sorted(p.name for p in folder.iterdir()) == ["a-stem.json"]
    status, _ = finish_baselines(replace(settings, prune_baselines=False), [_record(tmp_path, "b")], tmp_path)
    assert status == BaselineStatus("baselines", False, missing=("b",), stale=("a-stem.json",))


@pytest.mark.parametrize("checks", [(), (_drift(True, metric="baseline"),)])
def test_a_passed_baseline_row_is_not_unread(tmp_path: Path, checks: tuple[RecordedCheck, ...]) -> None:
    folder = tmp_path / "baselines"
    folder.mkdir()
    (folder / "p-stem.json").write_text("{}")
    status, _ = finish_baselines(_settings(baseline_dir=folder), [_record(tmp_path, "p", *checks)], tmp_path)
    assert status == BaselineStatus("baselines", False, compared=("p",))
