"""Recipe targets beyond tensor metrics: top-k drop, rtol/atol, task values (issue 31 item 1, issue 33
item 5), each value checked against an independent numpy computation on onnxruntime's outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from pytest_qaccuracy.analysis.recipe import Budget, parse_checks, search_recipe
from pytest_qaccuracy.analysis.recipe.measure import HOST, TASK
from pytest_qaccuracy.errors import InputError
from tests.ort_features import needs_cache

pytestmark = needs_cache

SUITE = Path(__file__).resolve().parents[2] / "example_suites"
FP32 = SUITE / "models" / "digits_cnn.onnx"
CALIB = SUITE / "data" / "digits_calib.npz"
TEST = SUITE / "data" / "digits_test.npz"
METRIC = "digits_metrics:WorstClassRecall"


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(SUITE))  # digits_metrics.py, the example suite's own metric


def _logits(model: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _worst_recall(predicted: np.ndarray, labels: np.ndarray) -> float:
    """min over classes present of (hits / seen), by hand."""
    recalls = [np.mean(predicted[labels == c] == c) for c in np.unique(labels)]
    return float(min(recalls))


def test_task_topk_and_allclose_targets_are_measured_as_numpy_computes_them(on_path, tmp_path):
    checks = ["max_drop:worst_class_recall<=0.02", "min:worst_class_recall>=0.5", "max_top1_drop<=0.01"]
    checks += ["rtol<=0.05", "atol<=0.05"]
    out = tmp_path / "best.onnx"
    result = search_recipe(
        FP32, CALIB, TEST, checks, tasks=[METRIC], methods=["minmax"], budget=Budget(experiments=2), model_out=out
    )
    best = result.best_step
    assert not best.estimated and best.skipped is None
    data = np.load(TEST)
    x, labels = data["x"], data["labels"]
    ref, test = _logits(FP32, x), _logits(out, x)
    measured = best.measured[HOST]
    fp32_recall, q_recall = _worst_recall(ref.argmax(1), labels), _worst_recall(test.argmax(1), labels)
    assert measured[TASK]["min:worst_class_recall"] == pytest.approx(q_recall, abs=1e-12)
    assert measured[TASK]["max_drop:worst_class_recall"] == pytest.approx(fp32_recall - q_recall, abs=1e-12)
    drop = np.mean(ref.argmax(1) == labels) - np.mean(test.argmax(1) == labels)
    assert measured["logits"]["max_top1_drop"] == pytest.approx(drop, abs=1e-12)
    outside = np.abs(test.astype(np.float64) - ref) > 0.05 + 0.05 * np.abs(ref.astype(np.float64))
    assert measured["logits"]["allclose"] == pytest.approx(outside.mean(), abs=1e-12)
    # the verdict is the thresholds applied to those values
    expected = fp32_recall - q_recall <= 0.02 and q_recall >= 0.5 and drop <= 0.01 and not outside.any()
    assert best.passed == expected
    assert [str(c) for c in parse_checks(checks)][-1] == "allclose <= 0 (rtol=0.05, atol=0.05)"


def test_unreachable_task_target_is_best_effort(on_path):
    """No recipe reads every digit better than the fp32 model does by 0.5: best effort, not met."""
    result = search_recipe(
        FP32,
        CALIB,
        TEST,
        ["max_drop:worst_class_recall<=-0.5"],
        tasks=[METRIC],
        methods=["minmax"],
        budget=Budget(experiments=2),
    )
    assert not result.met and result.best_step is not None and not result.best_step.estimated
    assert result.best_step.measured[HOST][TASK]["max_drop:worst_class_recall"] > -0.5


@pytest.mark.parametrize(
    ("checks", "tasks", "message"),
    [
        (["max_drop:worst_class_recall<=0.01"], [], "name the task metric that computes it"),
        (["max_drop:cer<=0.01"], [METRIC], "no task metric computes 'cer' \\(they compute: worst_class_recall\\)"),
        (["max_top1_drop>=0.01"], [], "is better when lower"),
        (["max_top1_drop<=1.5"], [], "no model can meet it"),
        (["rtol<=-1"], [], "no model can meet it"),
        (["min:worst_class_recall<=0.9"], [METRIC], "is better when higher"),
    ],
)
def test_bad_targets_are_one_line_errors(on_path, checks, tasks, message):
    with pytest.raises(InputError, match=message):
        search_recipe(FP32, CALIB, TEST, checks, tasks=tasks, methods=["minmax"], budget=Budget(experiments=1))


def test_topk_drop_needs_labels(tmp_path):
    data = np.load(TEST)
    unlabelled = tmp_path / "unlabelled.npz"
    np.savez(unlabelled, x=data["x"][:20])
    with pytest.raises(InputError, match="has no labels"):
        search_recipe(FP32, CALIB, unlabelled, ["max_top1_drop<=0.01"], budget=Budget(experiments=1))


def test_command_task_target_with_sidecar_targets(on_path, tmp_path, capsys):
    """``--task-metric`` and ``--task-targets``: the sidecar's targets are what the metric scores."""
    from pytest_qaccuracy.cli import main

    labels = np.load(TEST)["labels"]
    sidecar = tmp_path / "targets.jsonl"
    sidecar.write_text("".join(json.dumps({"record": i, "target": int(v)}) + "\n" for i, v in enumerate(labels)))
    out = tmp_path / "out"
    code = main(
        [
            "recipe", str(FP32), "--data", str(CALIB), "--eval", str(TEST), "--out-dir", str(out),
            "--target", "min:worst_class_recall>=0.5", "--task-metric", METRIC,
            "--task-targets", str(sidecar), "--methods", "minmax", "--budget", "1", "-q",
        ]
    )  # fmt: skip
    document = json.loads((out / "digits_cnn.recipe.json").read_text())
    step = document["steps"][document["best"]]
    model = out / "digits_cnn.recipe.onnx"
    q_recall = _worst_recall(_logits(model, np.load(TEST)["x"]).argmax(1), labels)
    assert step["measured"][HOST][TASK]["min:worst_class_recall"] == pytest.approx(q_recall, abs=1e-12)
    assert code == (0 if q_recall >= 0.5 else 1)
    assert "min:worst_class_recall" in capsys.readouterr().out
