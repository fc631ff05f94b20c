"""Issue 18 in pytest: what a session prints about hostile or mismatched models."""

from __future__ import annotations

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
