"""Top-k on real classifier outputs: several outputs, integer labels, sequences.

Goldens come from onnxruntime runs of both models and numpy argmax/argsort, not from the library.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from pytest_qaccuracy.analysis.checks import evaluate
from pytest_qaccuracy.analysis.compare import compare
from pytest_qaccuracy.analysis.outputs import measure_outputs, parse_scores
from pytest_qaccuracy.metrics.topk import ScoreLayout, TopKCounter, score_layout
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.tolerances import Tolerance
from tests.modelzoo import quantize
from tests.output_models import FEATURES, STEPS
from tests.output_models import LABELS as CLASSES
from tests.output_models import classifier as classifier_model

RECORDS = 24


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("classifier")
    fp32 = classifier_model(root / "clf.onnx")
    records = np.random.default_rng(8).standard_normal((RECORDS, 1, FEATURES)).astype(np.float32)
    qdq = quantize(fp32, root / "clf.qdq.onnx", records * 3.0)  # coarse on purpose: some decisions flip
    labels = np.random.default_rng(9).integers(0, CLASSES, RECORDS)
    step_labels = np.random.default_rng(10).integers(0, CLASSES, (RECORDS, STEPS))
    data = root / "data.npz"
    np.savez(data, x=records[:, 0], labels=labels)
    outputs = {}
    for name, path in (("fp32", fp32), ("quantized", qdq)):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outputs[name] = dict(
            zip(["label", "probabilities", "steps"], session.run(None, {"x": records[:, 0]}), strict=True)
        )
    return {"pair": ModelPair(fp32, qdq), "data": data, "labels": labels, "steps": step_labels, **outputs}


def test_a_label_output_next_to_probabilities_counts_the_probabilities(classifier):
    """skl2onnx: the int64 label output is not read as one record of N classes (that would raise
    '24 labels for 1 records'); the float class-score output is counted, the labels left aside."""
    stats = measure_outputs(classifier["pair"], classifier["data"], ks=(1, 3))
    assert set(stats.topk) == {"probabilities"}
    f, q = classifier["fp32"]["probabilities"], classifier["quantized"]["probabilities"]
    top = np.argsort(-q, axis=1, kind="stable")[:, :3]
    agreement = np.mean(top[:, 0] == f.argmax(1))
    agreement3 = np.mean((top == f.argmax(1)[:, None]).any(1))
    counts = stats.topk["probabilities"]
    assert counts["k"]["1"]["agreement"] == pytest.approx(agreement)
    assert counts["k"]["3"]["agreement"] == pytest.approx(agreement3)
    labels = classifier["labels"]
    drop = np.mean(f.argmax(1) == labels) - np.mean(q.argmax(1) == labels)
    assert counts["k"]["1"]["accuracy_drop"] == pytest.approx(drop)
    assert (counts["counted"], counts["units"], counts["records"]) == ("per record", RECORDS, RECORDS)


def test_scores_names_the_label_output(classifier):
    stats = measure_outputs(classifier["pair"], classifier["data"], ks=(1, 5), scores="label")
    counts = stats.topk["label"]
    f, q = classifier["fp32"]["label"], classifier["quantized"]["label"]
    assert list(counts["k"]) == ["1"] and counts["counted"] == "labels per record"
    assert counts["k"]["1"]["agreement"] == pytest.approx(np.mean(f == q))
    labels = classifier["labels"]
    assert counts["k"]["1"]["accuracy_drop"] == pytest.approx(np.mean(f == labels) - np.mean(q == labels))


def test_a_sequence_is_counted_per_position(classifier, tmp_path):
    """A CTC-like (records, steps, classes) output: every step is one decision, labels (records, steps)."""
    data = tmp_path / "steps.npz"
    np.savez(data, x=np.load(classifier["data"])["x"], labels=classifier["steps"])
    stats = measure_outputs(classifier["pair"], data, ks=(1,), scores="steps")
    counts = stats.topk["steps"]
    f, q = classifier["fp32"]["steps"].argmax(-1), classifier["quantized"]["steps"].argmax(-1)
    assert counts["counted"] == "per position (4 per record, classes on axis 2)"
    assert (counts["units"], counts["records"], counts["labelled"]) == (RECORDS * STEPS, RECORDS, RECORDS * STEPS)
    assert counts["k"]["1"]["agreement"] == pytest.approx(np.mean(f == q))
    truth = classifier["steps"]
    assert counts["k"]["1"]["accuracy_drop"] == pytest.approx(np.mean(f == truth) - np.mean(q == truth))
    # classes on axis 1 instead: every class row is a decision among the 4 steps
    unlabelled = tmp_path / "x.npz"
    np.savez(unlabelled, x=np.load(classifier["data"])["x"])
    on_axis_1 = measure_outputs(classifier["pair"], unlabelled, scores="steps:1").topk["steps"]
    assert on_axis_1["units"] == RECORDS * CLASSES and "classes on axis 1" in on_axis_1["counted"]


def test_what_cannot_be_counted_is_one_check_line(classifier):
    """Labels of one class per record against a per-position output: a failed check naming the
    output, dtype and shape, never an exception."""
    stats = measure_outputs(classifier["pair"], classifier["data"], scores="steps")
    assert "steps" not in stats.topk
    batch = 8  # the first batch (RuntimeOptions' default batch size) is where it stops
    assert stats.problems["steps"] == (
        f"output 'steps' float32 ({batch}, {STEPS}, {CLASSES}): {batch} labels for {batch} records (32 positions)"
    )
    result = compare(classifier["pair"], classifier["data"], metrics="cosine", layers=False)
    outcomes = evaluate(result, stats, {"max_top1_drop": Tolerance("max_top1_drop", 0.01, "marker")}, [], "clf")
    (row,) = [o for o in outcomes if o.check == "max_top1_drop"]
    assert not row.passed and row.target == "output 'steps'"
    assert row.detail.startswith("max_top1_drop: cannot count top-1 on output 'steps' float32 (8, 4, 10): 8 labels")
    assert "\n" not in row.detail
    unknown = measure_outputs(classifier["pair"], classifier["data"], scores="logits")
    assert unknown.problems == {"logits": "scores: no output 'logits' (outputs: label, probabilities, steps)"}


def test_score_layouts():
    assert score_layout(np.zeros((2, 10), np.float32)) == ScoreLayout("scores", 1, 1)
    assert score_layout(np.zeros((2, 1, 10, 1), np.float32)) == ScoreLayout("scores", 2, 1)
    assert score_layout(np.zeros((2, 40, 6625), np.float32), -1) == ScoreLayout("scores", 2, 40)
    assert score_layout(np.zeros((2,), np.int64)) == ScoreLayout("labels", 0, 1)
    with pytest.raises(ValueError, match=r"not class scores \(records, classes\)"):
        score_layout(np.zeros((2, 40, 6625), np.float32))
    with pytest.raises(ValueError, match="not an axis after the records"):
        score_layout(np.zeros((2, 40), np.float32), 0)
    assert parse_scores("out:0", ["out:0"]) == ("out:0", None)  # a tf2onnx name taken whole
    assert parse_scores("seq:-1", ["seq"]) == ("seq", -1)


def test_a_counter_of_positions_merges_exactly():
    rng = np.random.default_rng(0)
    ref, test = rng.standard_normal((8, 3, 5)), rng.standard_normal((8, 3, 5))
    labels = rng.integers(0, 5, (8, 3))
    whole = TopKCounter((1, 2), layout=ScoreLayout("scores", 2, 3))
    whole.update(ref, test, labels)
    parts = [TopKCounter((1, 2), layout=ScoreLayout("scores", 2, 3)) for _ in range(2)]
    parts[0].update(ref[:5], test[:5], labels[:5])
    parts[1].update(ref[5:], test[5:], labels[5:])
    parts[0].merge(parts[1])
    assert parts[0].to_dict() == whole.to_dict()
    assert whole.to_dict()["k"]["1"]["agreement"] == pytest.approx(np.mean(ref.argmax(-1) == test.argmax(-1)))
