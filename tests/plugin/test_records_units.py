"""Unit tests of the plugin's records (``plugin/records.py``) and pair specs (``plugin/pairs.py``): in-process
calls, each expected value worked out by hand."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_qaccuracy.outcomes import Outcome
from pytest_qaccuracy.plugin.pairs import PairSpec
from pytest_qaccuracy.plugin.records import (
    PairRecord,
    RecordedCheck,
    TargetRun,
    WorkerPayload,
    agreement_record,
    merge_targets,
)


def _outcome(passed: bool) -> Outcome:
    return Outcome(
        kind="tolerance",
        check="min_cosine",
        scope="output",
        subject="output 'y'",
        metric="cosine",
        op=">=",
        threshold=0.99,
        value=0.995 if passed else 0.5,
        passed=passed,
        source="marker",
        detail="cosine",
    )


def _check(test: str, index: int = 0, passed: bool = True, xfail: str | None = None) -> RecordedCheck:
    return RecordedCheck(test=test, index=index, outcome=_outcome(passed), xfail=xfail)


def _record(*checks: RecordedCheck, tests: dict[str, str] | None = None) -> PairRecord:
    return PairRecord(
        id="p",
        key="p|a.onnx|b.onnx|d.npz",
        stem="p-00000000",
        fp32="/r/a.onnx",
        quantized="/r/b.onnx",
        data="/r/d.npz",
        backend="onnxruntime",
        scheme="onnxruntime",
        comparison={},
        checks=checks,
        tests=tests or {},
    )


def _run(passed: bool, cosine: float = 0.9) -> TargetRun:
    return TargetRun(backend="integer", scheme="tflite", outputs={"y": {"cosine": cosine}}, topk={}, passed=passed)


# records.py


@pytest.mark.parametrize(
    ("known", "new", "merged"),
    [
        (None, True, True),  # a target first seen: its own verdict
        (None, False, False),
        (True, True, True),
        (True, False, False),  # a later failure fails the target
        (False, True, False),  # an earlier failure is kept
        (False, False, False),
    ],
)
def test_merge_targets_joint_verdict(known: bool | None, new: bool, merged: bool) -> None:
    before = {} if known is None else {"t": _run(known, 0.1)}
    assert merge_targets(before, {"t": _run(new, 0.2)}) == {"t": _run(merged, 0.2)}


def test_merge_targets_keeps_known_targets_and_leaves_its_arguments_alone() -> None:
    known = {"a": _run(False, 0.1), "b": _run(True, 0.2)}
    new = {"b": _run(True, 0.3), "c": _run(True, 0.4)}
    merged = merge_targets(known, new)
    assert merged == {"a": _run(False, 0.1), "b": _run(True, 0.3), "c": _run(True, 0.4)}
    assert list(merged) == ["a", "b", "c"]
    assert known == {"a": _run(False, 0.1), "b": _run(True, 0.2)} and list(new) == ["b", "c"]


def test_agreement_record_drops_exactly_the_verdict_keys() -> None:
    data = {"scheme": "tflite", "records": 3, "max_steps_allowed": 1, "first_divergence": "conv", "steps": 0}
    agreement = SimpleNamespace(to_dict=lambda: dict(data))
    assert agreement_record(agreement) == {"scheme": "tflite", "records": 3, "steps": 0}


@pytest.mark.parametrize(
    ("checks", "tests", "status"),
    [
        ((), {}, ("unchecked", None)),
        ((_check("t::a"), _check("t::b")), {}, ("passed", None)),
        ((_check("t::a"), _check("t::b", passed=False)), {}, ("failed", None)),
        ((_check("t::a", passed=False, xfail="known bug"),), {}, ("xfailed", "known bug")),
        (
            (_check("t::a", passed=False, xfail="known bug"), _check("t::b", passed=False)),
            {},
            ("failed", None),
        ),
        (
            (_check("t::a"),),
            {"t::a": "xpassed-strict"},
            ("failed", "passed, but t::a is marked xfail(strict=True)"),
        ),
    ],
)
def test_status_and_passed(
    checks: tuple[RecordedCheck, ...], tests: dict[str, str], status: tuple[str, str | None]
) -> None:
    record = _record(*checks, tests=tests)
    assert record.status == status
    assert record.passed is (status[0] in ("passed", "unchecked"))


def test_with_pytest_outcomes_reads_xfail_only_where_pytest_reported_it() -> None:
    record = _record(
        _check("t::a", 0, passed=False, xfail="recorded"),  # pytest says failed: not expected to fail
        _check("t::b", 0, passed=False),  # pytest says xfailed: expected, with pytest's reason
        _check("t::c", 0, passed=False, xfail="kept"),  # pytest did not report it: kept as recorded
        _check("t::b", 1, passed=True),
    )
    outcomes = {"t::z": ("passed", None), "t::b": ("xfailed", "pytest's reason"), "t::a": ("failed", "ignored")}
    judged = record.with_pytest_outcomes(outcomes)
    assert [(c.test, c.index, c.xfail) for c in judged.checks] == [
        ("t::a", 0, None),
        ("t::b", 0, "pytest's reason"),
        ("t::c", 0, "kept"),
        ("t::b", 1, "pytest's reason"),
    ]
    assert [c.outcome for c in judged.checks] == [c.outcome for c in record.checks]
    assert judged.tests == {"t::a": "failed", "t::b": "xfailed"}  # only tests of the pair that pytest reported
    assert list(judged.tests) == ["t::a", "t::b"]
    assert judged.status == ("failed", None) and record.status == ("failed", None)
    assert (judged.id, judged.key, judged.comparison) == (record.id, record.key, record.comparison)


def test_with_pytest_outcomes_sorts_tests_and_can_turn_a_failure_into_xfailed() -> None:
    record = _record(_check("t::b", passed=False), _check("t::a"))
    judged = record.with_pytest_outcomes({"t::b": ("xfailed", "why"), "t::a": ("passed", None)})
    assert list(judged.tests.items()) == [("t::a", "passed"), ("t::b", "xfailed")]
    assert judged.status == ("xfailed", "why") and not judged.passed
    strict = _record(_check("t::a")).with_pytest_outcomes({"t::a": ("xpassed-strict", None)})
    assert strict.status == ("failed", "passed, but t::a is marked xfail(strict=True)")


def test_with_checks_appends_after_the_existing_ones() -> None:
    first, second, third = _check("t::a", 0), _check("t::b", 0), _check("t::a", 1)
    record = _record(first).with_checks([second, third])
    assert record.checks == (first, second, third)
    assert _record(first).with_checks([]).checks == (first,)


def test_sorted_by_test_first_then_index() -> None:
    checks = (_check("b", 0), _check("a", 2), _check("a", 10), _check("c", 1))
    assert [(c.test, c.index) for c in _record(*checks).sorted().checks] == [("a", 2), ("a", 10), ("b", 0), ("c", 1)]


def test_worker_payload_round_trip_without_interruption() -> None:
    record = _record(_check("t::a", passed=False, xfail="x"))
    wire = WorkerPayload(records={"k": record}).to_wire()
    assert wire == {"records": {"k": record.to_dict()}, "interrupted": None}
    assert WorkerPayload.from_wire(wire) == WorkerPayload(records={"k": record})
    assert WorkerPayload.from_wire({"records": {}}) == WorkerPayload(records={})


# pairs.py


def _spec(root: Path, **changes: object) -> PairSpec:
    base: dict[str, object] = {
        "id": "p",
        "fp32": root / "models" / "a.onnx",
        "quantized": root / "models" / "b.onnx",
        "data": root / "d.npz",
    }
    return PairSpec(**{**base, **changes})  # type: ignore[arg-type]


def test_key_names_the_files_relative_to_the_root(tmp_path: Path) -> None:
    assert _spec(tmp_path).key(tmp_path) == "p|models/a.onnx|models/b.onnx|d.npz"
    labelled = _spec(tmp_path, labels=tmp_path / "l.txt")
    assert labelled.key(tmp_path) == "p|models/a.onnx|models/b.onnx|d.npz|l.txt"


def test_key_keeps_paths_outside_the_root_absolute(tmp_path: Path) -> None:
    root = tmp_path / "project"
    spec = _spec(root, data=tmp_path / "shared" / "d.npz")
    assert spec.key(root) == f"p|models/a.onnx|models/b.onnx|{(tmp_path / 'shared' / 'd.npz').as_posix()}"


def test_key_adds_task_targets_backend_and_scheme_when_set(tmp_path: Path) -> None:
    base = "p|models/a.onnx|models/b.onnx|d.npz"
    assert _spec(tmp_path, task_targets=tmp_path / "t.jsonl").key(tmp_path) == f"{base}|task_targets=t.jsonl"
    assert _spec(tmp_path, backend="integer").key(tmp_path) == f"{base}|backend=integer"
    assert _spec(tmp_path, scheme="tflite").key(tmp_path) == f"{base}|scheme=tflite"
    both = _spec(tmp_path, backend="integer", scheme="glow", task_targets=tmp_path / "t.jsonl")
    assert both.key(tmp_path) == f"{base}|task_targets=t.jsonl|backend=integer|scheme=glow"
    # the defaults spelled out are the defaults: keys of existing pairs stay valid
    assert _spec(tmp_path, backend="onnxruntime", scheme="onnxruntime").key(tmp_path) == base


def test_stem_is_the_safe_id_and_the_keys_hash(tmp_path: Path) -> None:
    spec = _spec(tmp_path, id="my pair/v2")
    key = "my pair/v2|models/a.onnx|models/b.onnx|d.npz"
    assert spec.stem(tmp_path) == "my_pair_v2-" + hashlib.sha256(key.encode()).hexdigest()[:8]


@pytest.fixture
def avx2_host(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This machine's onnxruntime is taken to be ``onnxruntime-avx2`` (the probe's answer is cached
    per process: cleared before and after)."""
    from pytest_qaccuracy.backend import host

    monkeypatch.setenv("QACCURACY_HOST_PRESET", "onnxruntime-avx2")
    host.host_preset.cache_clear()
    yield
    host.host_preset.cache_clear()


@pytest.mark.usefixtures("avx2_host")
def test_on_target_runs_the_hosts_own_preset_on_onnxruntime(tmp_path: Path) -> None:
    spec = _spec(tmp_path, targets=("tflite", "onnxruntime-avx2"), scores="y")
    for target in ("onnxruntime-avx2", "onnxruntime"):  # "onnxruntime" is the host's preset
        on, name = spec.on_target(target)
        assert name == "onnxruntime-avx2"
        assert (on.backend, on.scheme, on.targets) == ("onnxruntime", "onnxruntime", ())
        assert (on.id, on.fp32, on.scores) == (spec.id, spec.fp32, "y")
    # a scheme named for a pair on onnxruntime is not how the host runs: the target's run drops it
    on, name = _spec(tmp_path, scheme="glow").on_target("onnxruntime-avx2")
    assert (name, on.backend, on.scheme) == ("onnxruntime-avx2", "onnxruntime", "onnxruntime")


@pytest.mark.usefixtures("avx2_host")
def test_on_target_runs_other_presets_on_the_integer_backend(tmp_path: Path) -> None:
    spec = _spec(tmp_path, targets=("tflite",))
    on, name = spec.on_target("tflite")
    assert (name, on.backend, on.scheme, on.targets) == ("tflite", "integer", "tflite", ())
    vnni, name = spec.on_target("onnxruntime-vnni")  # another machine's onnxruntime
    assert (name, vnni.backend, vnni.scheme, vnni.targets) == ("onnxruntime-vnni", "integer", "onnxruntime-vnni", ())
    # a pair that runs on the integer backend runs even the host's preset there
    integer = _spec(tmp_path, backend="integer", scheme="glow", targets=("onnxruntime",))
    on, name = integer.on_target("onnxruntime")
    assert (name, on.backend, on.scheme, on.targets) == ("onnxruntime-avx2", "integer", "onnxruntime-avx2", ())


def test_compare_scheme_only_on_the_integer_backend(tmp_path: Path) -> None:
    assert _spec(tmp_path, backend="integer", scheme="tflite").compare_scheme == "tflite"
    assert _spec(tmp_path, backend="onnxruntime", scheme="tflite").compare_scheme is None
