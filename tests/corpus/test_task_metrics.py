"""The built-in task metrics on the corpus: CTC text of the PP-OCR recognizer, YOLOv8n boxes, Silero
VAD decisions. Every expected value is computed here by other code: rapidocr's own CTC decoder and a
textbook edit distance, a loop-by-loop YOLO decoder and matcher, scikit-learn's ``f1_score``, all on
onnxruntime outputs of the test records (the models' ``test`` split, never their calibration set).
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from corpus_helpers import build_corpus

from pytest_qaccuracy.analysis.task import evaluate_task_metrics

pytestmark = pytest.mark.corpus

VARIANTS = ("qdq_u8s8", "qdq_s8s8_pc", "qop_u8s8")


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _distance(a: str, b: str) -> int:
    """Wagner-Fischer with a full table."""
    table = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = min(table[i - 1][j] + 1, table[i][j - 1] + 1, table[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return table[-1][-1]


@pytest.fixture(scope="module")
def rec_truth(corpus) -> list[str]:
    """The text of each test record of ppocr_rec: the corpus maker replayed, with Pillow's text drawing
    recorded; the replayed images must be the stored records."""
    import corpus_data  # scripts/, on sys.path through corpus_helpers
    from PIL import ImageDraw

    drawn: list[str] = []
    original = ImageDraw.ImageDraw.text

    def record(self, xy, text, *args, **kwargs):
        drawn.append(text)
        return original(self, xy, text, *args, **kwargs)

    ImageDraw.ImageDraw.text = record
    try:
        inputs, _ = build_corpus.MODELS[[m.name for m in build_corpus.MODELS].index("ppocr_rec")].make_data("test")
    finally:
        ImageDraw.ImageDraw.text = original
    stored = np.load(corpus["ppocr_rec"].data())["x"]
    assert np.array_equal(inputs["x"], stored), "the replayed corpus data differs from the stored records"
    assert corpus_data is not None and len(drawn) == len(stored)
    return drawn


def _rapidocr_texts(model: Path, data: Path, characters: list[str]) -> list[str]:
    from rapidocr_onnxruntime.ch_ppocr_rec.utils import CTCLabelDecode

    decoder = CTCLabelDecode(character=list(characters))
    session = _session(model)
    texts = []
    for x in np.load(data)["x"]:
        probabilities = session.run(None, {"x": x})[0]
        texts.append(decoder.decode(probabilities.argmax(axis=2), is_remove_duplicate=True)[0][0])
    return texts


@pytest.mark.parametrize("variant", VARIANTS)
def test_ctc_cer_and_exact_match_of_the_recognizer_match_rapidocr(corpus, rec_truth, variant) -> None:
    entry = corpus["ppocr_rec"]
    metadata = {p.key: p.value for p in onnx.load(entry.fp32, load_external_data=False).metadata_props}
    characters = metadata["character"].splitlines()
    found = evaluate_task_metrics(entry.fp32, entry.model(variant), entry.data(), ["ctc"], targets=rec_truth)
    for side, model in (("fp32", entry.fp32), ("quantized", entry.model(variant))):
        texts = _rapidocr_texts(model, entry.data(), characters)
        cer = sum(_distance(t, r) for t, r in zip(texts, rec_truth, strict=True)) / sum(map(len, rec_truth))
        exact = np.mean([t == r for t, r in zip(texts, rec_truth, strict=True)])
        assert getattr(found["cer"], side) == pytest.approx(cer, abs=1e-12), (side, texts, rec_truth)
        assert getattr(found["exact_match"], side) == pytest.approx(exact, abs=1e-12)
    assert found["cer"].against == "targets" and found["cer"].records == len(rec_truth)


def test_a_suite_gates_the_recognizer_on_cer_against_a_sidecar_file(corpus, rec_truth, pytester) -> None:
    entry = corpus["ppocr_rec"]
    lines = [json.dumps({"record": i, "target": text}) for i, text in enumerate(rec_truth)]
    (pytester.path / "truth.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    pytester.makefile(
        ".toml",
        qaccuracy_rec=f"""
        [defaults]
        fp32 = "{entry.fp32}"
        data = "{entry.data()}"
        task_metrics = ["ctc"]
        task_targets = "truth.jsonl"

        [defaults.tolerances]
        min_cosine = 0
        "max_drop:cer" = 0.05

        [pairs.u8s8]
        quantized = "{entry.model("qdq_u8s8")}"

        [pairs.s8s8_pc]
        quantized = "{entry.model("qdq_s8s8_pc")}"
        """,
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--qaccuracy-sensitivity=off")
    expected = {}
    metadata = {p.key: p.value for p in onnx.load(entry.fp32, load_external_data=False).metadata_props}
    for pair, variant in (("u8s8", "qdq_u8s8"), ("s8s8_pc", "qdq_s8s8_pc")):
        texts = [
            _rapidocr_texts(m, entry.data(), metadata["character"].splitlines())
            for m in (entry.fp32, entry.model(variant))
        ]
        cer = [
            sum(_distance(t, r) for t, r in zip(x, rec_truth, strict=True)) / sum(map(len, rec_truth)) for x in texts
        ]
        expected[pair] = cer[1] - cer[0]
    summary = json.loads((pytester.path / ".qaccuracy" / "summary.json").read_text())
    drops = {p["id"]: p["task"]["cer"]["drop"] for p in summary["pairs"]}
    assert drops == {pair: pytest.approx(drop, abs=1e-12) for pair, drop in expected.items()}
    failed = sum(drop > 0.05 for drop in expected.values())
    result.assert_outcomes(passed=4 - failed, failed=failed)


def _reference_detections(output: np.ndarray, conf: float, nms_iou: float, max_det: int = 300) -> list[tuple]:
    """One record (4 + C, anchors): anchor by anchor, then NMS class by class, written as loops."""

    def iou(a, b) -> float:
        w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
        return w * h / union if union > 0 else 0.0

    candidates = []
    for a in range(output.shape[1]):
        scores = output[4:, a]
        cls = int(np.argmax(scores))
        if scores[cls] >= conf:
            cx, cy, w, h = (float(v) for v in output[:4, a])
            candidates.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, float(scores[cls]), cls))
    kept = []
    for box in sorted(candidates, key=lambda b: -b[4]):
        if all(k[5] != box[5] or iou(k, box) <= nms_iou for k in kept):
            kept.append(box)
    return kept[:max_det], iou


def _reference_counts(dets: list[tuple], targets: list[tuple], iou, threshold: float = 0.5) -> tuple[int, int, int]:
    used, tp = set(), 0
    for det in sorted(dets, key=lambda d: -d[4]):
        options = [(iou(det, t), j) for j, t in enumerate(targets) if j not in used and t[5] == det[5]]
        best = max(options, default=(0.0, None))
        if best[1] is not None and best[0] >= threshold:
            used.add(best[1])
            tp += 1
    return tp, len(dets) - tp, len(targets) - tp


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("conf", [0.005, 0.0])
def test_detection_precision_and_recall_of_yolov8n_match_a_loop_reference(corpus, variant, conf) -> None:
    # the synthetic scenes hold no NudeNet class: every score is low, so the bar is too; at 0 every
    # anchor competes and NMS and matching work on 300 boxes a side
    entry = corpus["yolov8n"]
    found = evaluate_task_metrics(
        entry.fp32, entry.model(variant), entry.data(), [{"metric": "yolo_detection", "conf": conf}]
    )
    with h5py.File(entry.data(), "r") as f:
        images = [f[f"value/{i}/0"][()] for i in range(len(f["value"]))]
    fp32, quant = _session(entry.fp32), _session(entry.model(variant))
    totals = np.zeros(3, int)
    detections = 0
    for image in images:
        truth, iou = _reference_detections(fp32.run(None, {"images": image})[0][0], conf, 0.7)
        dets, _ = _reference_detections(quant.run(None, {"images": image})[0][0], conf, 0.7)
        totals += _reference_counts(dets, truth, iou)
        detections += len(truth)
    tp, fp, fn = totals
    assert detections > 0
    # per-tensor u8 scales of output0 lose the class scores (docs/pytest.md, lost channels): the
    # quantized models may detect nothing, and precision is then undefined (None), recall 0
    assert found["precision"].quantized == (None if tp + fp == 0 else pytest.approx(tp / (tp + fp), abs=1e-12))
    assert found["recall"].quantized == pytest.approx(tp / (tp + fn), abs=1e-12)
    assert (found["precision"].fp32, found["recall"].fp32) == (1.0, 1.0)
    assert found["recall"].against == "fp32"


@pytest.mark.parametrize("variant", VARIANTS)
def test_binary_f1_of_silero_vad_matches_scikit_learn(corpus, variant) -> None:
    from sklearn.metrics import f1_score

    entry = corpus["silero_vad"]
    data = np.load(entry.data())
    voiced = [int(i % 3 == 0) for i in range(len(data["input"]))]  # corpus_data.speech: every third chunk voiced
    threshold = 0.18  # where the fp32 model separates these synthetic chunks
    found = evaluate_task_metrics(
        entry.fp32, entry.model(variant), entry.data(), [{"metric": "binary_f1", "threshold": threshold}], voiced
    )
    for side, model in (("fp32", entry.fp32), ("quantized", entry.model(variant))):
        session = _session(model)
        speech = [
            session.run(None, {"input": data["input"][i], "state": data["state"][i], "sr": np.array(data["sr"][i])})[0]
            for i in range(len(voiced))
        ]
        decisions = [int(float(p.ravel()[0]) >= threshold) for p in speech]
        expected = f1_score(voiced, decisions, zero_division=np.nan)
        value = getattr(found["f1"], side)
        assert (value is None and np.isnan(expected)) or value == pytest.approx(expected, abs=1e-12)
    assert found["f1"].fp32 == 1.0  # the threshold separates the fp32 model's chunks
