"""Unit tests of the JUnit XML properties of a pair check (``plugin/properties.py``): every property
written out by hand, from results and statistics built as plain objects."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pytest_qaccuracy.outcomes import Outcome
from pytest_qaccuracy.plugin.properties import (
    check_properties,
    gate_properties,
    pair_properties,
    recipe_properties,
    target_properties,
)
from pytest_qaccuracy.plugin.records import TargetRun


def _output(name: str, **metrics: Any) -> SimpleNamespace:
    return SimpleNamespace(name=name, metrics=metrics)


def _task(fp32: float | None, quantized: float | None, drop: float | None) -> SimpleNamespace:
    return SimpleNamespace(fp32=fp32, quantized=quantized, drop=drop)


HEAD = [
    ("qaccuracy.pair", "p1"),
    ("qaccuracy.passed", "true"),
    ("qaccuracy.backend", "integer"),
    ("qaccuracy.scheme", "tflite"),
]


def test_pair_properties_without_statistics() -> None:
    result = SimpleNamespace(outputs=[_output("y", cosine=np.float32(0.5), mse=2.0, lsb=0.0), _output("z", sqnr=40.25)])
    props = pair_properties("p1", "integer", "tflite", result, None, True)
    assert props == [
        *HEAD,
        ("qaccuracy.y.cosine", "0.5"),
        ("qaccuracy.y.lsb", "0"),  # zero is a value: written
        ("qaccuracy.z.sqnr", "40.25"),
    ]
    assert all(type(value) is str for _, value in props)


def test_pair_properties_verdict_is_lower_case() -> None:
    result = SimpleNamespace(outputs=[])
    assert pair_properties("p", "onnxruntime", "onnxruntime-avx2", result, None, False) == [
        ("qaccuracy.pair", "p"),
        ("qaccuracy.passed", "false"),
        ("qaccuracy.backend", "onnxruntime"),
        ("qaccuracy.scheme", "onnxruntime-avx2"),
    ]


def test_pair_properties_with_topk_and_task_values() -> None:
    result = SimpleNamespace(
        outputs=[_output("y", cosine=0.123456789, sqnr=None, lsb=1234567.0), _output("w"), _output("z", sqnr=3.0)]
    )
    stats = SimpleNamespace(
        topk={
            "y": {"k": {1: {"agreement": 0.75, "accuracy_drop": 0.0}, 5: {"agreement": 1.0, "accuracy_drop": None}}},
            "w": {"records": 3},  # no "k": nothing written
            "other": {"k": {1: {"agreement": 0.1}}},  # not an output of the result
        },
        task={"acc": _task(0.9, 0.85, 0.05), "f1": _task(None, 0.5, None)},
    )
    assert pair_properties("p1", "integer", "tflite", result, stats, True) == [
        *HEAD,
        ("qaccuracy.y.cosine", "0.123457"),
        ("qaccuracy.y.lsb", "1.23457e+06"),
        ("qaccuracy.y.top1_agreement", "0.75"),
        ("qaccuracy.y.top1_accuracy_drop", "0"),
        ("qaccuracy.y.top5_agreement", "1"),
        ("qaccuracy.z.sqnr", "3"),
        ("qaccuracy.task.acc.fp32", "0.9"),
        ("qaccuracy.task.acc.quantized", "0.85"),
        ("qaccuracy.task.acc.drop", "0.05"),
        ("qaccuracy.task.f1.quantized", "0.5"),
    ]


def test_pair_properties_with_statistics_but_no_topk_entry() -> None:
    result = SimpleNamespace(outputs=[_output("y", cosine=1.0)])
    stats = SimpleNamespace(topk={}, task={})
    assert pair_properties("p1", "integer", "tflite", result, stats, True) == [*HEAD, ("qaccuracy.y.cosine", "1")]


def _outcome(**changes: Any) -> Outcome:
    base: dict[str, Any] = {
        "kind": "tolerance",
        "check": "min_sqnr",
        "scope": "output",
        "subject": "output 'y'",
        "metric": "sqnr",
        "op": ">=",
        "threshold": 30.0,
        "value": 12.5,
        "output": "y",
        "passed": False,
        "source": "marker",
        "detail": "not written",
    }
    return Outcome(**{**base, **changes})


def test_check_properties_one_compact_json_per_check() -> None:
    first = _outcome(deployment="tflite", k=None)
    second = _outcome(
        kind="rule",
        check="rtol",
        scope="layer",
        subject="layer 'conv'",
        metric="rtol",
        op="<=",
        threshold=None,
        value=0.25,
        params={"rtol": 0.1, "atol": 0.01},
        output=None,
        k=3,
        passed=True,
        source="ini",
    )
    props = check_properties([first, second])
    assert [name for name, _ in props] == ["qaccuracy.check", "qaccuracy.check"]
    assert json.loads(props[0][1]) == {
        "kind": "tolerance",
        "check": "min_sqnr",
        "scope": "output",
        "subject": "output 'y'",
        "deployment": "tflite",
        "metric": "sqnr",
        "op": ">=",
        "threshold": 30.0,
        "value": 12.5,
        "output": "y",
        "k": None,
        "params": {},
        "passed": False,
        "source": "marker",
    }
    assert json.loads(props[1][1]) == {
        "kind": "rule",
        "check": "rtol",
        "scope": "layer",
        "subject": "layer 'conv'",
        "deployment": None,
        "metric": "rtol",
        "op": "<=",
        "threshold": None,
        "value": 0.25,
        "output": None,
        "k": 3,
        "params": {"rtol": 0.1, "atol": 0.01},
        "passed": True,
        "source": "ini",
    }
    assert ": " not in props[1][1] and ", " not in props[1][1]  # compact
    assert props[1][1].startswith('{"kind":"rule","check":"rtol",')


@pytest.mark.parametrize(("number", "text"), [(math.inf, "inf"), (-math.inf, "-inf"), (math.nan, "nan")])
def test_check_properties_write_non_finite_numbers_as_text(number: float, text: str) -> None:
    for name in ("threshold", "value"):
        (prop,) = check_properties([_outcome(**{name: number})])
        data = json.loads(prop[1], parse_constant=lambda c: pytest.fail(f"bare {c} in strict JSON"))
        assert data[name] == text
        assert data["value" if name == "threshold" else "threshold"] == (12.5 if name == "threshold" else 30.0)


def test_check_properties_of_no_checks() -> None:
    assert check_properties([]) == []


def test_target_properties() -> None:
    targets = {
        "tflite": TargetRun(
            backend="integer",
            scheme="tflite",
            outputs={"y": {"cosine": 0.5, "sqnr": None, "lsb": 3.0}, "z": {"sqnr": 20.0}},
            topk={},
            passed=False,
            task={"acc": {"fp32": 0.9, "quantized": 0.8}, "f1": {"fp32": 0.5, "quantized": None}, "r": {}},
        ),
        "glow": TargetRun(backend="integer", scheme="glow", outputs={"y": {"cosine": 1.0}}, topk={}, passed=True),
    }
    assert target_properties(targets) == [
        ("qaccuracy.target.tflite.passed", "false"),
        ("qaccuracy.target.tflite.y.cosine", "0.5"),
        ("qaccuracy.target.tflite.z.sqnr", "20"),
        ("qaccuracy.target.tflite.task.acc", "0.8"),
        ("qaccuracy.target.glow.passed", "true"),
        ("qaccuracy.target.glow.y.cosine", "1"),
    ]
    assert target_properties({}) == []


def test_gate_properties() -> None:
    tensors = [SimpleNamespace(max_steps=s) for s in (2, 7, 0)]
    agreement = SimpleNamespace(scheme="tflite", tensors=tensors, first_divergence="conv_1")
    assert gate_properties(agreement) == [
        ("qaccuracy.agreement.scheme", "tflite"),
        ("qaccuracy.agreement.max_steps", "7"),
        ("qaccuracy.agreement.first_divergence", "conv_1"),
    ]
    empty = SimpleNamespace(scheme="glow", tensors=[], first_divergence=None)
    assert gate_properties(empty) == [
        ("qaccuracy.agreement.scheme", "glow"),
        ("qaccuracy.agreement.max_steps", "0"),
        ("qaccuracy.agreement.first_divergence", ""),
    ]


def _recipe(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "met": True,
        "stopped": "met",
        "quantize_static": {"per_channel": True, "calibration_cache_path": None},
        "best": 1,
        "steps": [
            {"measured": {"own": {"y": {"cosine": 0.1}}}},
            {"measured": {"own": {"y": {"cosine": 0.999, "sqnr": None}}, "tflite": {"z": {"sqnr": 31.5}}}},
        ],
    }
    return {**base, **changes}


def test_recipe_properties_of_a_full_recipe() -> None:
    entry = {
        "recipe": _recipe(convert_opset=13, pair_data={"met": False}),
        "recipe_files": {"json": "pairs/p.recipe.json", "ranges": "pairs/p.ranges.json"},
    }
    props = recipe_properties([{"id": "p", "sensitivity": entry}])
    assert props == [
        ("qaccuracy.recipe.p.met", "true"),
        ("qaccuracy.recipe.p.stopped", "met"),
        (
            "qaccuracy.recipe.p.quantize_static",
            '{"calibration_cache_path": "pairs/p.ranges.json", "per_channel": true}',
        ),
        ("qaccuracy.recipe.p.convert_opset", "13"),
        ("qaccuracy.recipe.p.files", "pairs/p.recipe.json,pairs/p.ranges.json"),
        ("qaccuracy.recipe.p.own.y.cosine", "0.999"),
        ("qaccuracy.recipe.p.own.y.sqnr", "n/a"),
        ("qaccuracy.recipe.p.tflite.z.sqnr", "31.5"),
        ("qaccuracy.recipe.p.pair_data.met", "false"),
    ]


def test_recipe_properties_of_notes_and_partial_recipes() -> None:
    records = [
        {"id": "none"},  # not analysed
        {"id": "empty", "sensitivity": None},
        {"id": "note", "sensitivity": {"recipe_note": "not searched: no failed check"}},
        {"id": "blank", "sensitivity": {"recipe_note": "", "recipe": {}}},
        {
            "id": "unmet",
            "sensitivity": {
                "recipe": _recipe(met=False, stopped="budget", best=None, convert_opset=None, pair_data={}),
                "recipe_note": "stopped early",
            },
        },
        {"id": "first", "sensitivity": {"recipe": _recipe(best=0, pair_data={"met": True})}},
    ]
    assert recipe_properties(records) == [
        ("qaccuracy.recipe.note.note", "not searched: no failed check"),
        ("qaccuracy.recipe.unmet.note", "stopped early"),
        ("qaccuracy.recipe.unmet.met", "false"),
        ("qaccuracy.recipe.unmet.stopped", "budget"),
        ("qaccuracy.recipe.unmet.quantize_static", '{"calibration_cache_path": null, "per_channel": true}'),
        ("qaccuracy.recipe.first.met", "true"),
        ("qaccuracy.recipe.first.stopped", "met"),
        ("qaccuracy.recipe.first.quantize_static", '{"calibration_cache_path": null, "per_channel": true}'),
        ("qaccuracy.recipe.first.own.y.cosine", "0.1"),
        ("qaccuracy.recipe.first.pair_data.met", "true"),
    ]
