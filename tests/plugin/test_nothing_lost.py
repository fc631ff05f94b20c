"""Issue 18 in pytest: what a session prints about hostile or mismatched models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

HOSTILE = {"logits": "logits\x1b[2J", "relu2": "relu2\x1b]0;pwned\x07"}

MODULE = """
import pytest


@pytest.mark.qaccuracy(fp32="models/a.onnx", quantized="models/a.qdq.onnx", data="data/digits_test.npz")
def test_pair(qaccuracy):
    qaccuracy.check(min_cosine=0.9)
"""


def _rename(source, target, renames: dict[str, str]) -> None:
    model = onnx.load(str(source))
    graph = model.graph
    for node in graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    for value in [*graph.output, *graph.value_info]:
        value.name = renames.get(value.name, value.name)
    onnx.save(model, str(target))


def test_control_characters_in_tensor_names_are_escaped_in_the_summary(digits: pytest.Pytester) -> None:
    models = digits.path / "models"
    _rename(models / "digits_cnn.onnx", models / "a.onnx", HOSTILE)
    _rename(models / "digits_cnn.qdq.onnx", models / "a.qdq.onnx", HOSTILE)
    digits.makepyfile(test_hostile=MODULE)
    result = digits.runpytest()
    result.assert_outcomes(passed=1)
    text = result.stdout.str()
    assert "\x1b" not in text and "\x07" not in text
    assert "output 'logits\\x1b[2J'" in text
    summary = (digits.path / ".qaccuracy" / "summary.json").read_text()
    assert "logits\\u001b[2J" in summary  # JSON keeps the name exact


def _unrelated(fp32, target) -> None:
    """A model with ``fp32``'s input and output but nothing else in common: pool, flatten, Gemm."""
    source = onnx.load(str(fp32)).graph
    channels = source.input[0].type.tensor_type.shape.dim[1].dim_value
    classes = source.output[0].type.tensor_type.shape.dim[1].dim_value
    weights = np.random.default_rng(0).standard_normal((classes, channels)).astype(np.float32)
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("GlobalAveragePool", [source.input[0].name], ["p"]),
            onnx.helper.make_node("Flatten", ["p"], ["f"], axis=1),
            onnx.helper.make_node("Gemm", ["f", "w"], [source.output[0].name], transB=1),
        ],
        "unrelated",
        [source.input[0]],
        [source.output[0]],
        [onnx.numpy_helper.from_array(weights, "w")],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(target))


def test_a_quantized_model_not_derived_from_the_fp32_one_is_flagged_in_the_summary(digits: pytest.Pytester) -> None:
    models = digits.path / "models"
    (models / "a.onnx").write_bytes((models / "digits_cnn.onnx").read_bytes())
    _unrelated(models / "a.onnx", models / "a.qdq.onnx")
    digits.makepyfile(test_unrelated=MODULE)
    result = digits.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["a.qdq: FAILED *", "  warning: only 1 of 8 layers matched: are these the same model?"])
