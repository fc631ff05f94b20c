"""Output slices and channels that span too few quantization steps.

The model is a small YOLO-style head: one output (N, 4 + 6, 64) concatenates box coordinates
(0..~300 px) and class scores (0..1), quantized with one scale. Goldens are onnxruntime runs of both
models and numpy on the model's own scale.
"""

from __future__ import annotations

import math
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from pytest_qaccuracy.analysis.checks import evaluate
from pytest_qaccuracy.analysis.compare import compare
from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.analysis.slices import SliceSpec, check_slices, parse_view
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.report.summary import channel_warnings
from pytest_qaccuracy.tolerances import Tolerance, check_tolerance, parse_rules, slice_rules
from tests.modelzoo import quantize
from tests.output_models import BOXES, CLASSES
from tests.output_models import detector as detector_model

RECORDS = 6


@pytest.fixture(scope="module")
def detector(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("detector")
    fp32 = detector_model(root / "det.onnx")
    records = np.random.default_rng(1).standard_normal((RECORDS, 1, 3, 8, 8)).astype(np.float32)
    qdq = quantize(fp32, root / "det.qdq.onnx", records)
    data = root / "det.npz"
    np.savez(data, x=records[:, 0])
    runs = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (fp32, qdq)]
    f, q = (s.run(None, {"x": records[:, 0]})[0].astype(np.float64) for s in runs)
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(qdq)).graph.initializer}
    scale = float(inits["cat_scale"])  # the Reshape keeps the Concat's scale
    return {"pair": ModelPair(fp32, qdq), "data": data, "f": f, "q": q, "scale": scale}


SLICES = check_slices(
    {"boxes": "output0[:, 0:4]", "scores": {"view": "output0[:, 4:]", "min_sqnr": 10.0}}, check_tolerance
)


def _sqnr(f: np.ndarray, q: np.ndarray) -> float:
    return 20 * math.log10(np.linalg.norm(f) / max(np.linalg.norm(f - q), 2.22e-16))


def test_one_scale_hides_the_scores_but_the_whole_output_passes(detector):
    """One scale for boxes and scores: the output as a whole looks fine, nothing but the warning says otherwise."""
    result = compare(detector["pair"], detector["data"], metrics="cosine,sqnr")
    output = result.output("output0")
    f, scale = detector["f"], detector["scale"]
    assert output.metrics["cosine"] > 0.999 and output.metrics["sqnr"] == pytest.approx(_sqnr(f, detector["q"]))
    spans = (f.max(axis=(0, 2)) - f.min(axis=(0, 2))) / scale  # per channel of axis 1, in steps
    low = np.flatnonzero(spans < 2)
    assert list(low) == list(range(BOXES, BOXES + CLASSES)) and spans.max() > 100  # the premise
    report = output.channels
    assert (report.axis, report.low, report.flagged) == (1, "4..9", True)
    assert report.min_steps == pytest.approx(spans.min(), rel=1e-5)
    assert channel_warnings(result.to_dict())[0] == (
        f"output0 channels 4..9 (axis 1) span < 1 step (scale {scale:.6g}) while others span up to "
        f"{spans.max():.0f}: their values are lost; declare slices or quantize them apart"
    )
    assert ComparisonResult.from_dict(result.to_dict()).output("output0").channels == report


def test_slices_are_outputs_with_their_own_metrics_tolerances_and_rules(detector):
    result = compare(detector["pair"], detector["data"], metrics="cosine,sqnr", slices=list(SLICES.values()))
    f, q = detector["f"], detector["q"]
    assert [o.name for o in result.outputs] == ["output0", "boxes", "scores"]
    assert result.output("boxes").quantized_tensor == "output0[:, 0:4]"
    assert result.output("boxes").metrics["sqnr"] == pytest.approx(_sqnr(f[:, :4], q[:, :4]), rel=1e-6)
    assert result.output("scores").metrics["sqnr"] == pytest.approx(_sqnr(f[:, 4:], q[:, 4:]), abs=1e-6)
    assert result.output("scores").metrics["sqnr"] < 3  # every score collapsed
    boxes_rule = SliceSpec("boxes", "output0[:, 0:4]", rules=("sqnr>=25",))
    rules = parse_rules(["det sqnr>=20"], "ini") + slice_rules("det", [boxes_rule], 1)
    outcomes = evaluate(
        result, None, {"min_sqnr": Tolerance("min_sqnr", 5.0, "ini")}, rules, "det", [boxes_rule, SLICES["scores"]]
    )
    by = {(o.target, o.check): o for o in outcomes}
    assert by[("output 'scores'", "min_sqnr")].threshold == 10.0  # the slice's own tolerance
    assert by[("output 'scores'", "min_sqnr")].source == "slice 'scores' min_sqnr="
    assert not by[("output 'scores'", "min_sqnr")].passed and by[("output 'output0'", "min_sqnr")].passed
    assert by[("output 'boxes'", "sqnr>=25")].threshold == 25.0  # its own rule beats the pair's
    assert by[("output 'output0'", "det sqnr>=20")].passed and ("output 'output0'", "sqnr>=25") not in by
    assert by[("output 'scores'", "det sqnr>=20")].threshold == 20.0  # the pair's rule on the other view


def test_min_channel_steps_check(detector):
    result = compare(detector["pair"], detector["data"], metrics="cosine")
    (row,) = evaluate(result, None, {"min_channel_steps": Tolerance("min_channel_steps", 2.0, "marker")}, [], "det")
    assert not row.passed and row.target == "output 'output0'" and row.value < 1
    assert row.detail.endswith(f"for output 'output0' (channels 4..9 of axis 1, scale {detector['scale']:.6g})")


@pytest.mark.parametrize(
    ("view", "message"),
    [
        ("output0", "is not '<output>[<index>, ...]'"),
        ("output0[0, 4:]", "the first index is the record axis and must be ':'"),
        ("output0[:, a:b]", "each index is"),
    ],
)
def test_bad_views_say_why(view, message):
    with pytest.raises(ValueError, match=re.escape(f"slices.s: {view!r}") + ".*" + re.escape(message)):
        check_slices({"s": view})


def test_views_parse_and_must_name_an_output(detector):
    assert parse_view("out[:, ..., 1:-1:2, 3]") == ("out", (slice(None), Ellipsis, slice(1, -1, 2), 3))
    with pytest.raises(ValueError, match=r"slices.s: unknown key 'min_cos'"):
        check_slices({"s": {"view": "o[:]", "min_cos": 1}})
    with pytest.raises(InputError, match=r"slice 's': no output 'logits' \(outputs: output0\)"):
        compare(detector["pair"], detector["data"], metrics="cosine", slices=[SliceSpec("s", "logits[:, 1:]")])


def test_qaccuracy_compare_prints_the_warning(detector, capsys):
    from pytest_qaccuracy.cli import main

    pair = detector["pair"]
    args = ["compare", str(pair.fp32_path), str(pair.quantized_path), "--data", str(detector["data"])]
    assert main([*args, "--metrics", "sqnr"]) == 0
    out = capsys.readouterr().out.splitlines()
    section = out[out.index("warnings (2):") + 1 :]  # every warning on the command line, wrapped at 100
    section = section[: section.index("")]
    lines = [line for line in section if not line.startswith("      ")]  # continuation lines apart
    stem = pair.quantized_path.stem
    assert lines[0].startswith(f"  {stem}: output0 channels 4..9 (axis 1) span < 1 step (scale ")
    assert len(lines) == 2 and lines[1].startswith(f"  {stem}: cat channels 4..9 (axis 1)")  # the Concat too
    assert max(len(line) for line in section) <= 100
