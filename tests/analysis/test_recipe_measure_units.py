"""How the recipe search judges a measured model (``analysis/recipe/measure.py``), piece by piece:
the margin of each check against its bound (worked by hand), the deployment targets, the values the
output folds give top-k, allclose and task checks, and the evaluator's choices of what to measure."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_qaccuracy.analysis.recipe import measure as measure_module
from pytest_qaccuracy.analysis.recipe.checks import Check, parse_checks
from pytest_qaccuracy.analysis.recipe.measure import TASK, check_targets, check_values, judge
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.runtime import RuntimeOptions

SUITE = Path(__file__).resolve().parents[2] / "example_suites"
FP32 = SUITE / "models" / "digits_cnn.onnx"
QDQ = SUITE / "models" / "digits_cnn.qdq.onnx"
TEST = SUITE / "data" / "digits_test.npz"


def test_a_margin_is_the_gap_over_the_bound():
    (cosine,) = parse_checks(["cosine>=0.5"])
    verdict = judge({"t": {"y": {"cosine": 0.75}}}, [cosine])
    assert verdict.passed and verdict.margin == 0.5  # (0.75 - 0.5) / 0.5
    (mse,) = parse_checks(["mse<=2"])
    verdict = judge({"t": {"y": {"mse": 3.0}}}, [mse])
    assert not verdict.passed and verdict.margin == -0.5  # (2 - 3) / 2
    assert judge({"t": {"y": {"mse": 1.5}}}, [mse]).margin == 0.25


def test_a_bound_near_zero_is_floored_by_the_checks_scale():
    check = Check("mse", 0.0, False, scale=0.25)
    assert judge({"t": {"y": {"mse": 0.5}}}, [check]).margin == -2.0  # (0 - 0.5) / 0.25
    assert judge({"t": {"y": {"mse": -1.0}}}, [Check("mse", -0.5, False, scale=0.25)]).margin == 1.0


def test_the_margin_is_capped():
    (sqnr,) = parse_checks(["sqnr>=1e-9"])
    verdict = judge({"t": {"y": {"sqnr": math.inf}}}, [sqnr])
    assert verdict.passed and verdict.margin == 1e6


def test_the_worst_check_target_and_output_decide():
    checks = parse_checks(["cosine>=0.5", "mse<=2"])
    measured = {
        "a": {"y": {"cosine": 1.0, "mse": 1.0}, "z": {"cosine": 0.6, "mse": 0.5}},
        "b": {"y": {"cosine": 0.9, "mse": 1.9}},
    }
    verdict = judge(measured, checks)
    assert verdict.passed and verdict.margin == pytest.approx(0.05)  # b's mse: (2 - 1.9) / 2
    assert verdict.measured is measured
    measured["b"]["y"]["cosine"] = 0.25
    assert judge(measured, checks).margin == -0.5


@pytest.mark.parametrize("value", [None, math.nan])
def test_an_undefined_value_fails(value):
    (cosine,) = parse_checks(["cosine>=0.5"])
    verdict = judge({"t": {"y": {"cosine": value}, "z": {"cosine": 0.9}}}, [cosine])
    assert not verdict.passed and verdict.margin == -math.inf


def test_no_target_or_no_value_fails():
    (cosine,) = parse_checks(["cosine>=0.5"])
    assert judge({}, [cosine]).margin == -math.inf and not judge({}, [cosine]).passed
    assert judge({"t": {"y": {"mse": 1.0}}}, [cosine]).margin == -math.inf
    assert judge({"t": {"y": {"cosine": 0.9}}}, []).margin == -math.inf  # nothing checked: not met


def test_a_strict_bound_is_just_missed_at_the_bound():
    (strict,) = parse_checks(["cosine>0.5"])
    at = judge({"t": {"y": {"cosine": 0.5}}}, [strict])
    assert not at.passed and -1e-11 < at.margin < 0
    assert judge({"t": {"y": {"cosine": 0.75}}}, [strict]).margin == 0.5
    assert judge({"t": {"y": {"cosine": 0.25}}}, [strict]).margin == -0.5
    (loose,) = parse_checks(["cosine>=0.5"])
    assert judge({"t": {"y": {"cosine": 0.5}}}, [loose]).margin == 0.0


def test_check_values_of_one_output_or_every_output():
    per = {"y": {"cosine": 0.9}, "z": {"cosine": 0.8, "mse": 1.0}, "w": {}}
    (cosine,) = parse_checks(["cosine>=0.5"])
    assert check_values(cosine, per) == [0.9, 0.8]
    assert check_values(Check("cosine", 0.5, True, output="z"), per) == [0.8]
    assert check_values(Check("cosine", 0.5, True, output="w"), per) == []


def test_targets_are_this_host_and_the_presets():
    assert check_targets(["onnxruntime", "onnxruntime-avx2", "onnxruntime"]) == ("onnxruntime", "onnxruntime-avx2")
    with pytest.raises(InputError) as info:
        check_targets(["onnxruntime", "avx3"])
    assert str(info.value).startswith("unknown deployment target 'avx3'; expected one of onnxruntime, ")
    assert "onnxruntime-vnni" in str(info.value)
    with pytest.raises(InputError, match=r"^give at least one deployment target$"):
        check_targets([])


def _stats(**fields):
    return SimpleNamespace(**{"relative": {}, "topk": {}, "task": {}, **fields})


def test_folded_values_reach_their_checks():
    checks = parse_checks(["rtol<=0.01", "atol<=0.001", "max_top1_drop<=0.01", "min_top5_agreement>=0.9"])
    stats = _stats(
        relative={"y": SimpleNamespace(violations=3, elements=12), "other": SimpleNamespace(violations=1, elements=1)},
        topk={
            "y": {"k": {"1": {"accuracy_drop": 0.02, "agreement": 0.5}, "5": {"accuracy_drop": 0.0, "agreement": 0.95}}}
        },
    )
    out = {"y": {"cosine": 0.9}}
    measure_module._fold_values(out, stats, checks)
    allclose = next(c for c in checks if c.kind == "allclose")
    assert out["y"][allclose.metric] == 0.25  # 3 of 12 elements outside the bounds
    assert out["y"]["max_top1_drop"] == 0.02 and out["y"]["min_top5_agreement"] == 0.95
    assert out["y"]["cosine"] == 0.9 and "other" not in out


def test_no_elements_counts_no_violations():
    (allclose,) = parse_checks(["rtol<=0.01"])
    out = {"y": {}}
    measure_module._fold_values(out, _stats(relative={"y": SimpleNamespace(violations=0, elements=0)}), [allclose])
    assert out["y"][allclose.metric] == 0.0


def test_task_values_are_the_quantized_ones_or_their_drop():
    checks = parse_checks(["min:accuracy>=0.9", "max_drop:accuracy<=0.01", "max:cer<=0.1"])
    task = {"accuracy": SimpleNamespace(quantized=0.93, drop=0.02), "cer": SimpleNamespace(quantized=math.nan, drop=0)}
    out = {}
    measure_module._fold_values(out, _stats(task=task), checks)
    assert out == {TASK: {"min:accuracy": 0.93, "max_drop:accuracy": 0.02, "max:cer": None}}
    out = {}
    measure_module._fold_values(out, _stats(task={}), checks[:1])
    assert out == {TASK: {"min:accuracy": None}}


def test_finite_keeps_infinity_and_drops_nan():
    assert measure_module._finite(math.inf) == math.inf and measure_module._finite(None) is None
    assert measure_module._finite(math.nan) is None and measure_module._finite(2) == 2.0
    assert isinstance(measure_module._finite(2), float)


def test_the_evaluator_folds_only_what_the_checks_need():
    """Tensor checks alone need no output folds; top-k, allclose and task checks do, with their k,
    bounds and tasks; the quantized output's step only for lsb and clipped."""
    evaluator = measure_module.Evaluator(FP32, TEST, parse_checks(["cosine>=0.99"]), ["onnxruntime"], RuntimeOptions())
    names = [(o, o) for o in evaluator.outputs]
    assert evaluator._output_measure(names) is None
    assert evaluator._steps(SimpleNamespace(), names) == {}
    checks = parse_checks(["min_top3_agreement>=0.9", "max_top1_drop<=0.1", "rtol<=0.01", "atol<=0.5", "lsb<=4"])
    evaluator = measure_module.Evaluator(FP32, TEST, checks, ["onnxruntime"], RuntimeOptions())
    folds = evaluator._output_measure(names)
    assert tuple(folds.ks) == (1, 3) and folds.rtol == 0.01 and folds.atol == 0.5 and not folds.tasks
    assert evaluator.metrics == ["lsb"]
    found = {o: object() for o in evaluator.outputs}

    class Matcher:
        def resolve(self, name, follow_quantize):
            assert follow_quantize is False
            return None, None, found[name]

    assert evaluator._steps(SimpleNamespace(matcher=Matcher()), names) == found


def test_a_target_subset_is_measured_alone():
    evaluator = measure_module.Evaluator(
        FP32, TEST, parse_checks(["cosine>=0.5"]), ["onnxruntime", "onnxruntime-avx2"], RuntimeOptions()
    )
    assert list(evaluator.measure(QDQ).measured) == ["onnxruntime", "onnxruntime-avx2"]
    verdict = evaluator.measure(QDQ, targets=["onnxruntime-vnni"])
    assert list(verdict.measured) == ["onnxruntime-vnni"] and verdict.passed


def test_one_element_counts_whole():
    (allclose,) = parse_checks(["rtol<=0.01"])
    out = {"y": {}}
    measure_module._fold_values(out, _stats(relative={"y": SimpleNamespace(violations=1, elements=1)}), [allclose])
    assert out["y"][allclose.metric] == 1.0


def test_the_folds_get_the_records_targets_and_the_models_metadata():
    (allclose,) = parse_checks(["rtol<=0.01"])
    evaluator = measure_module.Evaluator(FP32, TEST, [allclose], ["onnxruntime"], RuntimeOptions(), task_targets=(7, 8))
    assert evaluator.snapshot.stored_targets == [7, 8] and evaluator.metadata == {}
    evaluator.metadata = {"labels": "a,b"}
    names = [(o, o) for o in evaluator.outputs]
    folds = evaluator._output_measure(names)
    assert tuple(folds.ks) == (1,) and not folds.tasks
    assert folds.metadata == {"labels": "a,b"}


def test_a_dataset_given_open_stays_open_one_opened_is_closed(monkeypatch, tmp_path):
    import numpy as np

    from pytest_qaccuracy.data import load_dataset
    from tests.progress_recorders import record_closes

    closed = record_closes(monkeypatch, measure_module)
    checks = parse_checks(["cosine>=0.5"])
    measure_module.Evaluator(FP32, TEST, checks, ["onnxruntime"], RuntimeOptions())
    assert closed == [TEST]
    with load_dataset(TEST) as dataset:
        evaluator = measure_module.Evaluator(FP32, dataset, checks, ["onnxruntime"], RuntimeOptions())
        assert len(list(dataset.iter_records(0, 2))) == 2  # still readable
        assert evaluator.snapshot.name == dataset.name and evaluator.records == 300
    path = tmp_path / "no_labels.npz"
    with np.load(TEST) as found:
        np.savez(path, x=found["x"][:4])
    with pytest.raises(InputError) as info:
        measure_module.Evaluator(FP32, path, parse_checks(["max_top1_drop<=0.1"]), ["onnxruntime"], RuntimeOptions())
    assert str(info.value) == f"target max_top1_drop <= 0.1: the evaluation data {path.name} has no labels"


def test_a_model_without_a_float_output_is_refused(tmp_path):
    import numpy as np
    from onnx import TensorProto, helper

    node = helper.make_node("ArgMax", ["x"], ["k"], axis=1)
    graph = helper.make_graph(
        [node],
        "argmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("k", TensorProto.INT64, [None, 1])],
    )
    model = tmp_path / "argmax.onnx"
    import onnx

    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(model))
    data = tmp_path / "x.npz"
    np.savez(data, x=np.ones((2, 4), np.float32))
    with pytest.raises(InputError) as info:
        measure_module.Evaluator(model, data, parse_checks(["cosine>=0.5"]), ["onnxruntime"], RuntimeOptions())
    assert str(info.value) == f"{model}: no float output to measure"
