"""The output statistics folded into the comparison pass equal their own pass.

``compare(..., measure=OutputMeasure(...))`` runs each model once for the comparison and for the
top-k counts and element checks; ``measure_outputs`` runs them again on their own. Every figure must
be identical (exact equality of the ``to_dict()`` documents, floats included) on the zoo's QDQ and
QOperator variants, the integer backend, the digits models with labels, a classifier with several
outputs (labels, probabilities, a sequence) and a detector head with output slices.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pytest_qaccuracy.analysis.compare import compare
from pytest_qaccuracy.analysis.outputs import OutputMeasure, measure_outputs
from pytest_qaccuracy.analysis.slices import check_slices
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.runtime import RuntimeOptions
from pytest_qaccuracy.tolerances import check_tolerance
from tests.modelzoo import quantize
from tests.output_models import FEATURES
from tests.output_models import classifier as classifier_model
from tests.output_models import detector as detector_model

EXAMPLES = Path(__file__).resolve().parents[2] / "example_suites"
SETTINGS = [
    {"ks": (1,), "rtol": None, "atol": None},
    {"ks": (1, 3), "rtol": 0.1, "atol": 0.05},
    {"ks": (1, 5), "rtol": 0.0, "atol": 0.5},
]


def _same(pair: ModelPair, data, settings: dict, **kwargs) -> None:
    """One pass and two passes give the same statistics; the comparison is unchanged by the fold."""
    options = kwargs.pop("options", RuntimeOptions(batch_size=5))
    backend, scheme = kwargs.pop("backend", "onnxruntime"), kwargs.pop("scheme", None)
    slices, scores, labels = kwargs.pop("slices", ()), kwargs.pop("scores", None), kwargs.pop("labels", None)
    measure = OutputMeasure(settings["ks"], labels, settings["rtol"], settings["atol"], scores, slices)
    folded = compare(pair, data, "cosine,sqnr", options, backend=backend, scheme=scheme, slices=slices, measure=measure)
    alone = measure_outputs(
        pair, data, settings["ks"], labels, settings["rtol"], settings["atol"], options, backend, scheme, scores, slices
    )
    assert measure.result().to_dict() == alone.to_dict()
    plain = compare(pair, data, "cosine,sqnr", options, backend=backend, scheme=scheme, slices=slices)
    assert folded.to_dict() == plain.to_dict()


@pytest.mark.parametrize("variant", ["qdq_u8", "qdq_s8_pc", "qop_u8", "qop_s8_pc"])
@pytest.mark.parametrize("settings", SETTINGS)
def test_zoo_variants(zoo, variant: str, settings: dict) -> None:
    _same(ModelPair(zoo["fp32"], zoo[variant]), zoo["data"], settings)


@pytest.mark.parametrize("scheme", ["onnxruntime", "glow"])
def test_integer_backend(zoo, scheme: str) -> None:
    _same(ModelPair(zoo["fp32"], zoo["qdq_u8"]), zoo["data"], SETTINGS[1], backend="integer", scheme=scheme)


@pytest.mark.parametrize("quantized", ["digits_cnn.qdq.onnx", "digits_cnn.broken.onnx", "digits_cnn.qoperator.onnx"])
@pytest.mark.parametrize("settings", SETTINGS)
def test_digits_with_labels(quantized: str, settings: dict) -> None:
    pair = ModelPair(EXAMPLES / "models" / "digits_cnn.onnx", EXAMPLES / "models" / quantized)
    _same(pair, EXAMPLES / "data" / "digits_test.npz", settings, options=RuntimeOptions(batch_size=32))


def test_integer_output_codes(tmp_path) -> None:
    """A quantized model whose output is uint8 codes: both paths dequantize them alike."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(EXAMPLES / "models" / "digits_cnn.qdq.onnx"))
    del model.graph.node[-1]
    model.graph.output[0].CopyFrom(
        helper.make_tensor_value_info("logits_QuantizeLinear_Output", TensorProto.UINT8, ["N", 10])
    )
    onnx.save(model, str(tmp_path / "codes.onnx"))
    pair = ModelPair(EXAMPLES / "models" / "digits_cnn.onnx", tmp_path / "codes.onnx")
    _same(pair, EXAMPLES / "data" / "digits_test.npz", SETTINGS[2])


@pytest.mark.parametrize("scores", [None, "label", "steps", "probabilities"])
def test_classifier_outputs(tmp_path, scores: str | None) -> None:
    fp32 = classifier_model(tmp_path / "clf.onnx")
    records = np.random.default_rng(8).standard_normal((24, 1, FEATURES)).astype(np.float32)
    qdq = quantize(fp32, tmp_path / "clf.qdq.onnx", records * 3.0)
    labels = np.random.default_rng(9).integers(0, 5, 24)
    np.savez(tmp_path / "data.npz", x=records[:, 0])
    _same(ModelPair(fp32, qdq), tmp_path / "data.npz", SETTINGS[1], scores=scores, labels=labels)


def test_detector_slices(tmp_path) -> None:
    fp32 = detector_model(tmp_path / "det.onnx")
    records = np.random.default_rng(1).standard_normal((6, 1, 3, 8, 8)).astype(np.float32)
    qdq = quantize(fp32, tmp_path / "det.qdq.onnx", records)
    np.savez(tmp_path / "det.npz", x=records[:, 0])
    slices = list(check_slices({"boxes": "output0[:, 0:4]", "scores": "output0[:, 4:]"}, check_tolerance).values())
    _same(ModelPair(fp32, qdq), tmp_path / "det.npz", SETTINGS[1], slices=slices)
    _same(ModelPair(fp32, qdq), tmp_path / "det.npz", SETTINGS[2], slices=slices, scores="scores")
