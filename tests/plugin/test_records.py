"""The plugin's records: built by keyword, plain builtins in one place (to_dict / to_wire) and back."""

from __future__ import annotations

import json

from pytest_qaccuracy.outcomes import Outcome
from pytest_qaccuracy.plugin.records import (
    ExclusionTarget,
    PairRecord,
    RecordedCheck,
    SensitivityEntry,
    TargetRun,
    WorkerPayload,
    merge_targets,
)

OUTCOME = Outcome(
    check="min_cosine",
    kind="tolerance",
    scope="output",
    subject="output 'y'",
    metric="cosine",
    op=">=",
    threshold=0.99,
    value=0.5,
    passed=False,
    source="marker",
    detail="cosine 0.5 < 0.99 for output 'y'",
)


def _record(**changes: object) -> PairRecord:
    base = {
        "id": "int8",
        "key": "int8|m.onnx|m.int8.onnx|d.npz",
        "stem": "int8-0123abcd",
        "fp32": "/r/m.onnx",
        "quantized": "/r/m.int8.onnx",
        "data": "/r/d.npz",
        "labels": None,
        "backend": "onnxruntime",
        "scheme": "onnxruntime",
        "comparison": {"records": 3, "outputs": []},
    }
    return PairRecord(**{**base, **changes})  # type: ignore[arg-type]


def test_a_check_is_flat_in_the_record_document() -> None:
    check = RecordedCheck(test="t.py::test_a", index=2, outcome=OUTCOME, xfail="known")
    assert list(check.to_dict()) == [
        "test", "index", "kind", "check", "scope", "subject", "deployment", "target", "metric", "op", "threshold",
        "value", "params", "output", "k", "passed", "source", "detail", "xfail",
    ]  # fmt: skip
    assert check.to_dict()["threshold"] == 0.99 and check.to_dict()["xfail"] == "known"
    assert RecordedCheck.from_dict(check.to_dict()) == check


def test_a_bare_record_has_no_optional_keys() -> None:
    document = _record().to_dict()
    assert list(document) == [
        "id", "key", "stem", "fp32", "quantized", "data", "labels", "backend", "scheme", "comparison", "topk", "checks",
    ]  # fmt: skip
    assert document["checks"] == [] and document["topk"] == {}


def test_a_full_record_survives_json_and_comes_back_equal() -> None:
    target = ExclusionTarget(check="min_cosine", target="output 'y'", metric="cosine", threshold=0.99, source="marker")
    tflite = TargetRun(backend="integer", scheme="tflite", outputs={"y": {"cosine": 0.9}}, topk={}, passed=False)
    record = _record(
        topk={"y": {"k": {"1": {"agreement": 0.75}}}},
        checks=(RecordedCheck(test="t", index=0, outcome=OUTCOME),),
        agreement={"scheme": "tflite", "records": 3},
        targets={"tflite": tflite},
        sensitivity=SensitivityEntry(mode="single", metric="cosine", error="E: x", target_from=target),
    )
    document = record.to_dict()
    assert list(document)[-3:] == ["agreement", "targets", "sensitivity"]
    assert document["sensitivity"] == {
        "mode": "single",
        "metric": "cosine",
        "error": "E: x",
        "target_from": {"check": "min_cosine", "target": "output 'y'", "metric": "cosine", "threshold": 0.99,
                        "source": "marker"},
    }  # fmt: skip
    assert document["targets"]["tflite"] == {
        "backend": "integer", "scheme": "tflite", "outputs": {"y": {"cosine": 0.9}}, "topk": {}, "passed": False,
    }  # fmt: skip
    assert PairRecord.from_dict(json.loads(json.dumps(document))) == record
    assert not record.passed and _record().passed


def test_sorted_orders_checks_by_test_then_position() -> None:
    checks = [RecordedCheck(test=t, index=i, outcome=OUTCOME) for t, i in (("b", 0), ("a", 1), ("a", 0))]
    ordered = _record(checks=tuple(checks)).sorted().checks
    assert [(c.test, c.index) for c in ordered] == [("a", 0), ("a", 1), ("b", 0)]


def test_worker_payload_wire_form() -> None:
    record = _record(checks=(RecordedCheck(test="t", index=0, outcome=OUTCOME),))
    wire = WorkerPayload(records={record.key: record}, interrupted="during the tests").to_wire()
    assert json.loads(json.dumps(wire, allow_nan=False)) == wire
    assert wire["interrupted"] == "during the tests" and wire["records"][record.key]["checks"][0]["value"] == 0.5
    back = WorkerPayload.from_wire(wire)
    assert back is not None and back.records == {record.key: record} and back.interrupted == "during the tests"
    assert WorkerPayload.from_wire(None) is None and WorkerPayload.from_wire({}) is None


def test_a_target_passes_only_if_every_check_on_it_did() -> None:
    def run(passed: bool, cosine: float) -> TargetRun:
        return TargetRun(backend="integer", scheme="tflite", outputs={"y": {"cosine": cosine}}, topk={}, passed=passed)

    merged = merge_targets({"tflite": run(False, 0.5)}, {"tflite": run(True, 0.6), "glow": run(True, 0.7)})
    assert merged == {"tflite": run(False, 0.6), "glow": run(True, 0.7)}  # the newest figures, the joint verdict
    assert merge_targets({"tflite": run(True, 0.5)}, {"tflite": run(True, 0.6)}) == {"tflite": run(True, 0.6)}
