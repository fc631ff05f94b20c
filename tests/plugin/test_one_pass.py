"""A pair check runs each model once for the comparison and the output statistics."""

from __future__ import annotations

import json

import pytest

from pytest_qaccuracy.analysis import compare as compare_module
from pytest_qaccuracy.analysis import outputs as outputs_module
from pytest_qaccuracy.analysis.outputs import measure_outputs
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.runtime import RuntimeOptions

from .conftest import EXAMPLES, PAIRS_MODULE


def test_one_comparison_pass_per_pair_and_the_same_figures(digits: pytest.Pytester, monkeypatch) -> None:
    calls: list[str] = []
    real_compare = compare_module.compare

    def counted(pair, *args, **kwargs):
        calls.append(pair.quantized_path.name)
        assert kwargs.get("measure") is not None  # the statistics fold into this pass
        return real_compare(pair, *args, **kwargs)

    def no_second_pass(*args, **kwargs):
        raise AssertionError("measure_outputs ran: the models ran twice")

    monkeypatch.setattr(compare_module, "compare", counted)
    monkeypatch.setattr(outputs_module, "measure_outputs", no_second_pass)
    digits.makepyfile(test_pairs=PAIRS_MODULE)
    result = digits.runpytest("--qaccuracy-artifacts-dir=out", "--qaccuracy-sensitivity=off", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    assert sorted(calls) == ["digits_cnn.broken.onnx", "digits_cnn.qdq.onnx"]
    summary = json.loads((digits.path / "out" / "summary.json").read_text())
    data = EXAMPLES / "data" / "digits_test.npz"
    assert len(summary["pairs"]) == 2
    for entry in summary["pairs"]:  # the figures a separate pass gives, to the last bit
        pair = ModelPair(EXAMPLES / "models" / "digits_cnn.onnx", EXAMPLES / "models" / f"{entry['id']}.onnx")
        alone = measure_outputs(pair, data, [1], options=RuntimeOptions(batch_size=8))
        assert entry["topk"] == alone.to_dict()["topk"]
