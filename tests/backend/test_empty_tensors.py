"""Empty tensors through the integer kernels, against onnxruntime.

Models with dynamic shapes meet empty tensors at run time (a detector's boxes after a threshold, a
batch of none): onnxruntime returns an empty output of the right shape, or refuses the input, and
the emulation must do the same, never fail inside numpy. Each case runs one node on every preset
whose kernel it reaches; onnxruntime's answer is this host's (an empty output does not depend on the
CPU family).
"""

from __future__ import annotations

import numpy as np
import pytest
from backend_models import MS, assert_same, node_model, ort_run, random_q

from pytest_qaccuracy.backend import IntegerSession
from pytest_qaccuracy.backend.interpreter import KernelError

f32 = np.float32
PRESETS = ["onnxruntime-vnni", "onnxruntime-avx2", "onnxruntime-arm64-neon", "tflite"]
Q = {"ys": f32(0.05), "yz": np.uint8(120)}  # the output's scale and zero point


def _binary(op: str, a: tuple[int, ...], b: tuple[int, ...]):
    inputs = [("a", np.uint8, a), ("as", None, None), ("az", None, None), ("b", np.uint8, b)]
    inits = {"as": f32(0.02), "az": np.uint8(100), "bs": f32(0.03), "bz": np.uint8(7), **Q}
    order = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
    model = node_model(op, [i for i in inputs if i[1] is not None], inits, np.uint8, domain=MS, input_order=order)
    return model, ["a", "b"]


def _unary(op: str, shape: tuple[int, ...], **attrs: object):
    inits = {"xs": f32(0.05), "xz": np.uint8(100), **Q}
    if op == "QLinearSoftmax":
        inits["ys"], inits["yz"] = f32(1 / 256), np.uint8(0)
    model = node_model(op, [("x", np.uint8, shape)], inits, np.uint8, domain=MS, **attrs)
    return model, ["x"]


def _concat(*shapes: tuple[int, ...]):
    inputs, inits, order = [], dict(Q), ["ys", "yz"]
    for i, shape in enumerate(shapes):
        inputs.append((f"x{i}", np.uint8, shape))
        inits[f"s{i}"], inits[f"z{i}"] = f32(0.03 + 0.01 * i), np.uint8(90 + i)
        order += [f"x{i}", f"s{i}", f"z{i}"]
    model = node_model("QLinearConcat", inputs, inits, np.uint8, domain=MS, input_order=order, axis=1)
    return model, [name for name, _, _ in inputs]


def _resize(shape: tuple[int, ...]):
    scales = {"scales": np.array([1, 1, 2, 2], f32)}
    model = node_model(
        "Resize", [("x", np.uint8, shape)], scales, np.uint8, input_order=["x", "", "scales"], mode="nearest"
    )
    return model, ["x"]


CASES = {
    "add, empty rows broadcast against a row": lambda: _binary("QLinearAdd", (0, 3), (3,)),
    "add, an empty operand against a larger one": lambda: _binary("QLinearAdd", (2, 0, 3), (1, 3)),
    "mul, empty rows broadcast against a row": lambda: _binary("QLinearMul", (0, 3), (3,)),
    "mul, a single value against empty rows": lambda: _binary("QLinearMul", (1,), (4, 0)),
    "softmax, rows of no value": lambda: _unary("QLinearSoftmax", (2, 0), axis=-1, opset=13),
    "softmax, no row": lambda: _unary("QLinearSoftmax", (0, 5), axis=-1, opset=13),
    "softmax, opset 1, rows of no value": lambda: _unary("QLinearSoftmax", (3, 0), axis=1, opset=1),
    "sigmoid, no row": lambda: _unary("QLinearSigmoid", (0, 4)),
    "global average pool, no record": lambda: _unary("QLinearGlobalAveragePool", (0, 3, 2, 2), channels_last=0),
    "concat, every input empty": lambda: _concat((0, 3), (0, 2)),
    "concat, an empty input between others": lambda: _concat((1, 3), (1, 0), (1, 2)),
    "resize, no record": lambda: _resize((0, 2, 3, 3)),
}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("case", CASES)
def test_an_empty_tensor_gives_onnxruntimes_empty_output(case: str, preset: str) -> None:
    model, names = CASES[case]()
    rng = np.random.default_rng(5)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    feeds = {name: random_q(rng, np.uint8, shapes[name]) for name in names}
    (want,) = ort_run(model, feeds)
    (got,) = IntegerSession(model, scheme=preset).run(None, feeds)
    if want is None:  # onnxruntime 1.18's QLinearSoftmax leaves an empty output unset: the input's shape
        assert got.shape == feeds["x"].shape and got.dtype == np.uint8
        return
    assert_same(got, want, case)


def test_a_global_average_over_no_value_is_refused_like_onnxruntime() -> None:
    model, _ = _unary("QLinearGlobalAveragePool", (1, 3, 0, 4), channels_last=0)
    x = np.zeros((1, 3, 0, 4), np.uint8)
    with pytest.raises(Exception, match="out of computation range"):
        ort_run(model, {"x": x})
    with pytest.raises(KernelError, match=r"no value to average over its spatial axes \[2, 3\]"):
        IntegerSession(model).run(None, {"x": x})
