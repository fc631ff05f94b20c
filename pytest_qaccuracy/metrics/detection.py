"""Detection precision and recall at an IoU threshold, after decoding YOLO-style outputs.

A YOLOv8-style output is ``(records, 4 + classes, anchors)``: per anchor a box (centre x, centre y,
width, height) and one score per class. :class:`YoloDetection` keeps the anchors whose best class
score reaches ``conf``, suppresses overlaps per class (greedy NMS at ``nms_iou``, best score first),
and keeps at most ``max_det`` boxes per record. Matching is greedy too: every detection, best score
first, takes the unmatched target box of its class with the highest IoU, a true positive when that
IoU is at least ``iou``; detections left are false positives, targets left false negatives.
``precision = TP / (TP + FP)``, ``recall = TP / (TP + FN)`` over all records.

Targets are one array per record, ``(boxes, 5)`` rows ``x1, y1, x2, y2, class`` (or ``(boxes, 4)``:
any class). Without targets, the fp32 model's detections are the targets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from pytest_qaccuracy.metrics.task import TaskMetric, ratio


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` (n, 4) with every box of ``b`` (m, 4), corners ``x1, y1, x2, y2``."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=-1)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=-1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=-1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> np.ndarray:
    """Indices kept by greedy non-maximum suppression, best score first (ties: lower index first)."""
    order = np.argsort(-scores, kind="stable")
    iou = box_iou(boxes[order], boxes[order])
    kept = np.zeros(len(order), bool)
    suppressed = np.zeros(len(order), bool)
    for i in range(len(order)):
        if not suppressed[i]:
            kept[i] = True
            suppressed |= iou[i] > threshold
    return order[kept]


def decode_yolo(output: np.ndarray, conf: float = 0.25, nms_iou: float = 0.7, max_det: int = 300) -> list[np.ndarray]:
    """Per record, ``(detections, 6)`` rows ``x1, y1, x2, y2, score, class`` from ``(records, 4 + C, anchors)``."""
    output = np.asarray(output, np.float32)
    if output.ndim != 3 or output.shape[1] < 5:
        raise ValueError(f"expected (records, 4 + classes, anchors), got shape {output.shape}")
    found = []
    for record in output:
        cx, cy, w, h = record[:4]
        scores = record[4:]
        cls = np.argmax(scores, axis=0)
        best = scores[cls, np.arange(scores.shape[1])]
        keep = best >= conf
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)[keep]
        best, cls = best[keep], cls[keep]
        # per-class NMS in one call: boxes of different classes moved apart so that they never overlap
        shift = cls[:, None] * (float(np.abs(boxes).max(initial=0.0)) * 2 + 1)
        kept = nms(boxes + shift, best, nms_iou)[:max_det]
        found.append(np.column_stack([boxes[kept], best[kept], cls[kept]]).astype(np.float64))
    return found


def match(detections: np.ndarray, targets: np.ndarray, iou: float) -> tuple[int, int, int]:
    """(TP, FP, FN) of one record: greedy matching, best detection first, same class only."""
    detections = np.asarray(detections, np.float64).reshape(-1, 6)
    targets = np.asarray(targets, np.float64)
    targets = targets.reshape(-1, targets.shape[-1] if targets.size else 5)
    if targets.shape[1] not in (4, 5):
        raise ValueError(f"a target must be (boxes, 5) rows x1, y1, x2, y2, class (or (boxes, 4)), got {targets.shape}")
    overlap = box_iou(detections[:, :4], targets[:, :4])
    if targets.shape[1] == 5:
        overlap = np.where(detections[:, 5:6] == targets[None, :, 4], overlap, 0.0)
    taken = np.zeros(len(targets), bool)
    tp = 0
    for i in np.argsort(-detections[:, 4], kind="stable"):
        candidates = np.where(taken, -1.0, overlap[i])
        j = int(np.argmax(candidates)) if len(candidates) else -1
        if j >= 0 and candidates[j] >= iou:
            taken[j] = True
            tp += 1
    return tp, len(detections) - tp, len(targets) - tp


class YoloDetection(TaskMetric):
    """``precision`` and ``recall`` (higher is better) of YOLO-style detections at IoU ``iou``.

    Args:
        output: the ``(records, 4 + classes, anchors)`` output; default: the first.
        iou: the IoU a detection needs to match a target (0.5).
        conf: the smallest class score a detection keeps (0.25, ultralytics' default).
        nms_iou: the IoU above which NMS drops the weaker box (0.7, ultralytics' default).
        max_det: the most detections per record.
    """

    higher_is_better: ClassVar[Mapping[str, bool]] = {"precision": True, "recall": True}

    def __init__(
        self, output: str | None = None, iou: float = 0.5, conf: float = 0.25, nms_iou: float = 0.7, max_det: int = 300
    ) -> None:
        super().__init__()
        self.output, self.iou, self.conf, self.nms_iou, self.max_det = output, iou, conf, nms_iou, max_det

    def decode(self, outputs: Mapping[str, Any]) -> list[np.ndarray]:
        return decode_yolo(outputs[self.output or next(iter(outputs))], self.conf, self.nms_iou, self.max_det)

    def as_targets(self, predictions: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [p[:, [0, 1, 2, 3, 5]] for p in predictions]

    def score(self, predictions: Sequence[np.ndarray], targets: Sequence[Any]) -> dict[str, int]:
        counts = np.array([match(p, t, self.iou) for p, t in zip(predictions, targets, strict=True)], np.int64).reshape(
            -1, 3
        )
        tp, fp, fn = (int(x) for x in counts.sum(axis=0))
        return {"tp": tp, "fp": fp, "fn": fn}

    def finish(self, sums: Mapping[str, int | float]) -> dict[str, float | None]:
        tp, fp, fn = sums.get("tp", 0), sums.get("fp", 0), sums.get("fn", 0)
        return {"precision": ratio(tp, tp + fp), "recall": ratio(tp, tp + fn)}
