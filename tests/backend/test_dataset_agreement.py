"""``dataset_agreement``: the agreement check streamed over a dataset, and re-judging it with another N."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pytest_qaccuracy.backend.agreement import check_agreement, dataset_agreement

EXAMPLES = Path(__file__).resolve().parents[2] / "example_suites"
QDQ = EXAMPLES / "models" / "digits_cnn.qdq.onnx"
DATA = EXAMPLES / "data" / "digits_test.npz"


def test_streamed_batches_equal_one_run_on_all_records() -> None:
    streamed = dataset_agreement(QDQ, DATA, scheme="power2", max_steps=0, batch_size=7)
    with np.load(DATA) as archive:
        feeds = {"x": archive["x"]}
    whole = check_agreement(QDQ, feeds, scheme="power2", max_steps=0)
    assert streamed == whole
    assert streamed.records == 300 and streamed.model == "digits_cnn.qdq.onnx"
    assert streamed.first_divergence == "relu1_QuantizeLinear_Output"
    # the 8-bit tensors, then the float output (its DequantizeLinear's steps: the logits' 43)
    assert [t.max_steps for t in streamed.tensors] == [0, 9, 9, 3, 3, 3, 43, 43]
    assert streamed.tensors[-1].tensor == "logits" and streamed.tensors[-1].unit == "steps"


def test_with_max_steps_rejudges_without_running() -> None:
    result = dataset_agreement(QDQ, DATA, scheme="power2")
    assert result.with_max_steps(9).first_divergence == "logits_QuantizeLinear_Output"
    assert not result.with_max_steps(42).ok
    assert result.with_max_steps(43).ok and result.with_max_steps(43).max_steps_allowed == 43
    assert result.with_max_steps(43).tensors == result.tensors
    assert dataset_agreement(QDQ, DATA).ok  # the onnxruntime preset is bit-exact on the digits model
