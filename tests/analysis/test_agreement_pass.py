"""The agreement gate folded into the comparison's pass equals the gate's own pass.

``compare(..., agreement=AgreementPass(checker))`` feeds every batch to the gate while comparing;
``dataset_agreement`` measures the gate in a pass of its own. The two :class:`AgreementResult` must be
equal field by field (per tensor: elements, mismatches, max steps), passing and failing schemes alike,
and the comparison must be, to the last bit, the one ``compare`` gives without a gate. Which run is
shared is pinned too: the quantized side of the merged graph or the quantized model's session on u8
models, the emulation on the integer backend; where nothing can be shared (int8 activations, another
scheme) the gate declines and its result is None.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_qaccuracy.analysis.agreement_pass import AgreementPass
from pytest_qaccuracy.analysis.compare import compare
from pytest_qaccuracy.backend.agreement import AgreementChecker, dataset_agreement
from pytest_qaccuracy.errors import UnsupportedOpError
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.runtime import RuntimeOptions

EXAMPLES = Path(__file__).resolve().parents[2] / "example_suites"
FP32 = EXAMPLES / "models" / "digits_cnn.onnx"
DATA = EXAMPLES / "data" / "digits_test.npz"


def _folded(
    pair: ModelPair, data, gate_scheme: str, backend: str = "onnxruntime", scheme: str | None = None, layers=True
):
    """(gate in the pass, gate alone, comparison with the gate, comparison without, how the gate ran)."""
    options = RuntimeOptions(batch_size=7)
    gate = AgreementPass(AgreementChecker(pair.quantized_path, scheme=gate_scheme))
    kwargs = {"backend": backend, "scheme": scheme, "layers": layers}
    folded = compare(pair, data, "cosine,sqnr,lsb", options, agreement=gate, **kwargs)
    plain = compare(pair, data, "cosine,sqnr,lsb", options, **kwargs)
    alone = dataset_agreement(pair.quantized_path, data, scheme=gate_scheme, batch_size=7)
    return gate.result(), alone, folded.to_dict(), plain.to_dict(), gate.mode


@pytest.mark.parametrize("model", ["digits_cnn.qdq.onnx", "digits_cnn.qoperator.onnx"])
@pytest.mark.parametrize(("layers", "path"), [(True, "merged"), (False, "shared")])
def test_digits_gate_in_the_comparison_pass(model: str, layers: bool, path: str) -> None:
    """u8 activations: the comparison's onnxruntime run serves the gate, on the merged graph of both
    models (layers compared) or on the quantized model's own session (outputs only, no merged graph)."""
    pair = ModelPair(FP32, EXAMPLES / "models" / model)
    passing, alone, folded, plain, mode = _folded(pair, DATA, "onnxruntime", layers=layers)
    assert mode == path and folded["reduction"].startswith("onnxruntime" if layers else "numpy")
    assert passing == alone and passing.ok and passing.records == 300
    assert folded == plain
    failing, alone, folded, plain, _ = _folded(pair, DATA, "power2", layers=layers)
    assert failing == alone and not failing.ok
    assert failing.first_divergence == alone.first_divergence is not None
    assert folded == plain


def test_digits_failing_gate_values() -> None:
    """The QDQ model's power2 figures, as the gate's own pass documents them (tests/backend)."""
    pair = ModelPair(FP32, EXAMPLES / "models" / "digits_cnn.qdq.onnx")
    failing, *_ = _folded(pair, DATA, "power2")
    assert failing.first_divergence == "relu1_QuantizeLinear_Output"
    assert [t.max_steps for t in failing.tensors] == [0, 9, 9, 3, 3, 3, 43, 43]  # the last: the float output


@pytest.mark.parametrize(("backend", "scheme"), [("integer", "onnxruntime"), ("integer", "tflite")])
def test_integer_backend_shares_the_emulation(backend: str, scheme: str) -> None:
    pair = ModelPair(FP32, EXAMPLES / "models" / "digits_cnn.qdq.onnx")
    measured, alone, folded, plain, mode = _folded(pair, DATA, scheme, backend, scheme)
    assert mode == "emulation shared"
    assert measured == alone and measured.ok == (scheme == "onnxruntime")
    assert folded == plain


def test_integer_backend_other_scheme_declines() -> None:
    """Sharing no run, the gate is left to a pass of its own; the comparison is the plain one."""
    pair = ModelPair(FP32, EXAMPLES / "models" / "digits_cnn.qdq.onnx")
    measured, _, folded, plain, mode = _folded(pair, DATA, "power2", "integer", "tflite")
    assert measured is None and mode is None
    assert folded == plain


@pytest.mark.parametrize("variant", ["qdq_u8", "qdq_s8_pc", "qop_u8", "qop_s8_pc"])
def test_zoo_variants(zoo, variant: str) -> None:
    pair = ModelPair(zoo["fp32"], zoo[variant])
    measured, alone, folded, plain, mode = _folded(pair, zoo["data"], "onnxruntime")
    assert folded == plain
    if variant.endswith("s8_pc"):  # int8 activations: the gate's session fuses int8 QDQ groups, the
        assert measured is None and mode is None  # comparison's does not: nothing shared, declined
        return
    assert mode == "merged" and measured == alone and measured.records == 12
    failing, alone, folded, plain, _ = _folded(pair, zoo["data"], "power2")
    assert failing == alone and folded == plain


@pytest.mark.parametrize("layers", [True, False])
def test_gate_error_leaves_the_comparison_and_no_result(monkeypatch, layers: bool) -> None:
    pair = ModelPair(FP32, EXAMPLES / "models" / "digits_cnn.qdq.onnx")
    checker = AgreementChecker(pair.quantized_path)

    def unsupported(*args, **kwargs):
        raise UnsupportedOpError("no kernel for Foo")

    monkeypatch.setattr(checker, "emulate", unsupported)
    gate = AgreementPass(checker)
    options = RuntimeOptions(batch_size=7)
    folded = compare(pair, DATA, "cosine", options, agreement=gate, layers=layers)
    assert gate.result() is None and isinstance(gate.error, UnsupportedOpError)
    assert folded.to_dict() == compare(pair, DATA, "cosine", options, layers=layers).to_dict()
