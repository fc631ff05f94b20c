"""The recipe search's model writer (``analysis/recipe/build.py``), piece by piece: the order of the
calibration methods, what a recipe is expected to cost before it is written (in extrema passes), the
statistics passes it folds, the ranges estimated from them against each method's own calibration,
and onnxruntime's calibrators as the search runs them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges
from pytest_qaccuracy.analysis.calibration.calibrator import CalibrationResult
from pytest_qaccuracy.analysis.recipe import build
from pytest_qaccuracy.analysis.recipe.space import Recipe
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.runtime import RuntimeOptions
from tests.ort_features import needs_cache

SUITE = Path(__file__).resolve().parents[2] / "example_suites"
FP32 = SUITE / "models" / "digits_cnn.onnx"
CALIB = SUITE / "data" / "digits_calib.npz"


def test_methods_without_a_histogram_come_first_then_by_their_passes():
    assert build.method_rank("minmax") == (0, 0.0)
    assert build.method_rank("ort-minmax") == (0, 0.0)  # estimated as minmax
    assert build.method_rank("mse") == (1, 2.0)
    assert build.method_rank("kl") == (1, 3.5)
    assert build.method_rank("ort-percentile") == (1, 2.5)
    order = build.default_methods()
    assert "auto" not in order and order.index("ort-minmax") < order.index("mse") < order.index("ort-percentile")
    assert order.index("ort-percentile") < order.index("kl")


def test_an_unknown_method_names_the_known_ones():
    assert build.check_method("kl") == "kl"
    with pytest.raises(InputError) as info:
        build.check_method("entropy")
    assert str(info.value) == (
        f"unknown calibration method 'entropy'; expected one of {', '.join(build.method_names())}"
    )


def _builder(pass_seconds: float = 2.0, folded=(), ranges=()) -> build.RecipeBuilder:
    builder = build.RecipeBuilder.__new__(build.RecipeBuilder)
    builder.pass_seconds, builder.folded = pass_seconds, list(folded)
    builder._ranges = {key: None for key in ranges}
    return builder


def test_a_recipe_costs_its_histogram_pass_until_folded():
    builder = _builder(2.0)
    assert builder.needs(Recipe(method="mse")) == "mse"
    assert builder.expected_seconds(Recipe(method="mse")) == 4.0  # 2 extrema passes of 2 s
    assert builder.expected_seconds(Recipe(method="kl")) == 7.0
    assert builder.needs(Recipe(method="ort-minmax")) is None
    assert builder.expected_seconds(Recipe(method="minmax")) == 0.0
    folded = _builder(2.0, folded=["mse"])
    assert folded.needs(Recipe(method="mse")) is None and folded.expected_seconds(Recipe(method="mse")) == 0.0
    assert folded.needs(Recipe(method="kl")) == "kl"


def test_onnxruntimes_calibrators_cost_their_passes_once():
    builder = _builder(2.0, ranges=[("ort-minmax", "")])
    assert builder.write_seconds(Recipe(method="ort-entropy")) == 18.0  # 9 passes
    assert builder.write_seconds(Recipe(method="ort-percentile")) == 18.0
    assert builder.write_seconds(Recipe(method="ort-minmax")) == 0.0  # its ranges exist
    assert _builder(0.5).write_seconds(Recipe(method="ort-minmax")) == 1.0
    assert builder.write_seconds(Recipe(method="kl")) == 0.0  # ours: from the shared statistics


def test_statistics_fold_each_histogram_once_and_time_the_extrema_pass(monkeypatch):
    builder = build.RecipeBuilder(FP32, CALIB, RuntimeOptions())
    stats = builder.statistics()
    assert stats["records"] == 100 and builder.pass_seconds > 0 and builder.folded == []
    assert builder.statistics() is stats
    names = stats["names"]
    assert set(stats["observed"]) == set(names)
    builder.statistics("mse")
    assert builder.folded == ["mse"] and all(builder._histograms[n].mse is not None for n in names)
    assert all(builder._histograms[n].kl is None for n in names)
    builder.statistics("kl")
    assert builder.folded == ["mse", "kl"] and all(builder._histograms[n].kl is not None for n in names)
    assert all(builder._histograms[n].mse is not None for n in names)  # kept
    seconds = builder.pass_seconds

    def no_pass(*args, **kwargs):
        raise AssertionError("folded already")

    from pytest_qaccuracy.analysis.calibration import auto

    monkeypatch.setattr(auto, "histogram_pass", no_pass)
    monkeypatch.setattr(auto, "extrema_pass", no_pass)
    assert builder.statistics("mse") is stats and builder.statistics("kl") is stats
    assert builder.pass_seconds == seconds


@pytest.mark.parametrize("method", ["minmax", "percentile", "moving-average", "mse", "kl"])
def test_estimated_ranges_are_the_methods_own(method):
    """Our methods' ranges from the shared statistics equal that method's own calibration."""
    builder = build.RecipeBuilder(FP32, CALIB, RuntimeOptions())
    recipe = Recipe(method=method)
    estimated = builder.estimated_ranges(recipe)
    own = compute_ranges(str(FP32), str(CALIB), CalibrationOptions(method=method), RuntimeOptions()).ranges
    assert estimated.keys() == own.keys()
    for name, (lo, hi) in own.items():
        assert estimated[name] == pytest.approx((lo, hi), rel=1e-6, abs=1e-7), name
    assert builder.estimated_ranges(recipe) is estimated  # cached


def test_mse_ranges_depend_on_the_activation_type_the_others_do_not():
    builder = build.RecipeBuilder(FP32, CALIB, RuntimeOptions())
    u8 = builder.estimated_ranges(Recipe(method="mse", activation_type="uint8"))
    s8 = builder.estimated_ranges(Recipe(method="mse", activation_type="int8"))
    assert u8 is not s8
    assert builder.estimated_ranges(Recipe(method="kl", activation_type="int8")) is builder.estimated_ranges(
        Recipe(method="kl", activation_type="uint8")
    )
    assert set(builder._estimated) == {("mse", "uint8"), ("mse", "int8"), ("kl", "")}


def test_onnxruntimes_minmax_is_estimated_as_ours():
    builder = build.RecipeBuilder(FP32, CALIB, RuntimeOptions())
    assert builder.estimated_ranges(Recipe(method="ort-minmax")) == builder.estimated_ranges(Recipe(method="minmax"))


@needs_cache
def test_a_method_without_an_estimate_uses_its_real_ranges(monkeypatch):
    builder = build.RecipeBuilder(FP32, CALIB, RuntimeOptions())
    real = CalibrationResult("ort-percentile", 3, {"t": (-1.0, 2.0)}, {})
    asked = []
    monkeypatch.setattr(build, "ort_ranges", lambda fp32, data, method: asked.append(method) or real)
    monkeypatch.setattr(build, "ESTIMATED_AS", {"ort-entropy": "ort-entropy"})  # no estimate of it
    estimated = builder.estimated_ranges(Recipe(method="ort-entropy"))
    assert estimated == {"t": (-1.0, 2.0)} and estimated is not real.ranges and asked == ["Entropy"]


@needs_cache
def test_onnxruntimes_minmax_calibrator_gives_the_observed_extrema(tmp_path):
    found = build.ort_ranges(FP32, str(CALIB), "MinMax")
    assert found.method == "ort-minmax" and found.records == 100
    ours = compute_ranges(str(FP32), str(CALIB), CalibrationOptions(method="minmax"), RuntimeOptions()).ranges
    shared = set(found.ranges) & set(ours)
    assert shared
    for name in shared:
        assert found.ranges[name] == pytest.approx(ours[name], rel=1e-6, abs=1e-7), name
    assert all(isinstance(v, float) for pair in found.ranges.values() for v in pair)


@needs_cache
def test_a_failing_calibrator_is_one_error_naming_the_model(monkeypatch):
    from onnxruntime.quantization import calibrate

    class Failing:
        def collect_data(self, reader):
            print("Number of tensors : 9")
            print("   ")
            print("Computing histograms")

        def compute_data(self):
            raise ValueError("Too many bins for data range")

    monkeypatch.setattr(calibrate, "create_calibrator", lambda *args, **kwargs: Failing())
    with pytest.raises(InputError) as info:
        build.ort_ranges(FP32, str(CALIB), "Entropy")
    assert str(info.value) == (
        f"{FP32}: onnxruntime's Entropy calibrator failed (Too many bins for data range); it printed: "
        "Number of tensors : 9; Computing histograms"
    )


@needs_cache
def test_the_cache_file_holds_the_ranges_as_float32(tmp_path):
    result = CalibrationResult("kl", 4, {"a": (-1.0, 0.1), "b": (0.0, 3.0)}, {})
    path = build.write_cache(result, tmp_path / "ranges.json")
    assert path == tmp_path / "ranges.json" and list(tmp_path.iterdir()) == [path]
    data = json.loads(path.read_text())
    assert data["data"] == {
        "a": {"lowest": -1.0, "highest": float(np.float32(0.1)), "CLS": "TensorData"},
        "b": {"lowest": 0.0, "highest": 3.0, "CLS": "TensorData"},
    }
    assert data["calibration_method"]["value"] == "CalibrationMethod.MinMax"


def test_ranges_are_kept_per_method_and_mses_activation_type():
    builder = build.RecipeBuilder(FP32, CALIB, RuntimeOptions())
    kl = builder.ranges(Recipe(method="kl", activation_type="int8"))
    assert kl.method == "kl" and kl.records == 100
    assert kl.observed is builder.statistics()["observed"] and kl.ranges == builder.estimated_ranges(
        Recipe(method="kl")
    )
    assert builder.ranges(Recipe(method="kl")) is kl
    mse = builder.ranges(Recipe(method="mse", activation_type="int8"))
    assert builder.ranges(Recipe(method="mse")) is not mse
    assert set(builder._ranges) == {("kl", ""), ("mse", "int8"), ("mse", "uint8")}
    assert builder.folded == ["kl", "mse"]  # each method's histogram kind, folded when first used
    assert 0 < builder.pass_seconds < 60


def _graph(nodes, inits, name="g"):
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()],
    )
    return helper.make_model(graph)


def test_activation_tensors_leave_out_constants_and_unnamed_nodes():
    from onnx import helper

    nodes = [
        helper.make_node("Constant", [], ["c"], name="const", value_float=2.0),
        helper.make_node("Mul", ["x", "c"], ["m"], name="mul"),
        helper.make_node("Add", ["m", "b"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r"]),  # no name: no entry
        helper.make_node("Dropout", ["r"], ["y", ""], name="drop"),
    ]
    found = build.activation_tensors(_graph(nodes, {"b": [1.0]}))
    assert found == {"const": [], "mul": ["x", "m"], "add": ["m", "a"], "drop": ["r", "y"]}


def test_weight_tensors_are_a_nodes_own_initializer_weights():
    from onnx import helper

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv"),
        helper.make_node("ConvTranspose", ["c1", "w2"], ["c2"], name="deconv"),
        helper.make_node("Gemm", ["c2", "w3"], ["g1"], name="gemm_t", transB=1),
        helper.make_node("Gemm", ["g1", "w4"], ["g2"], name="gemm"),
        helper.make_node("MatMul", ["g2", "shared"], ["m1"], name="shared1"),  # a weight two nodes read
        helper.make_node("MatMul", ["m1", "shared"], ["m2"], name="shared2"),
        helper.make_node("MatMul", ["m2", "m1"], ["m3"], name="act"),  # no initializer
        helper.make_node("MatMul", ["m3", "w5"], ["m4"]),  # no name
        helper.make_node("Add", ["m4", "w6"], ["m5"], name="add"),  # not a weight op
        helper.make_node("MatMul", ["m5", "w7"], ["y"], name="matmul"),
    ]
    inits = {
        "w1": np.ones((2, 1, 1, 1)),
        "w2": np.ones((2, 2, 1, 1)),
        "w3": np.ones((2, 2)),
        "w4": np.ones((2, 2)),
        "shared": np.ones((2, 2)),
        "w5": np.ones((2, 2)),
        "w6": np.ones(2),
        "w7": np.ones((2, 3, 4)),
    }
    found = build.weight_tensors(_graph(nodes, inits))
    assert found == {
        "conv": ("w1", 0),
        "deconv": ("w2", 1),
        "gemm_t": ("w3", 0),
        "gemm": ("w4", 1),
        "matmul": ("w7", 2),
    }
    one_input = [helper.make_node("MatMul", ["x"], ["y"], name="broken")]  # fewer than two inputs
    assert build.weight_tensors(_graph(one_input, {})) == {}


@pytest.mark.skipif(
    tuple(int(p) for p in ort.__version__.split(".")[:2]) <= (1, 18),
    reason="onnxruntime 1.18 refuses every per-node move",
)
def test_a_per_node_weight_type_onnxruntime_refuses_is_one_error(tmp_path):
    builder = build.RecipeBuilder(FP32, CALIB, RuntimeOptions())
    recipe = Recipe(activation_type="int8", weight_type="int8", retyped=frozenset({"fc"}))
    with pytest.raises(InputError) as info:
        builder.write(recipe, tmp_path / "m.onnx")
    assert str(info.value) == (
        f"recipe {recipe.changes_from(Recipe())}: onnxruntime's quantize_static refuses int8 activations with uint8 "
        "weights"
    )
    assert not (tmp_path / "m.onnx").exists()
    excused = Recipe(activation_type="int8", weight_type="int8", retyped=frozenset({"fc"}), float=frozenset({"fc"}))
    assert builder.write(excused, tmp_path / "float.onnx").exists()  # the node in float: nothing to refuse


@needs_cache
@pytest.mark.parametrize(("method", "name"), [("Percentile", "ort-percentile"), ("Entropy", "ort-entropy")])
def test_onnxruntimes_calibrators_run_as_named_and_leave_no_file(tmp_path, monkeypatch, method, name):
    from onnxruntime.quantization import CalibrationMethod, create_calibrator

    from pytest_qaccuracy.analysis.calibration.reader import DatasetReader

    monkeypatch.chdir(tmp_path)
    found = build.ort_ranges(FP32, str(CALIB), method)
    assert found.method == name and found.observed == {} and list(tmp_path.iterdir()) == []
    calibrator = create_calibrator(
        str(FP32), augmented_model_path=str(tmp_path / "aug.onnx"), calibrate_method=getattr(CalibrationMethod, method)
    )
    calibrator.collect_data(DatasetReader(str(CALIB), str(FP32)))
    want = {
        n: (float(np.min(t.range_value[0])), float(np.max(t.range_value[1])))
        for n, t in calibrator.compute_data().data.items()
    }
    assert found.ranges == want


@needs_cache
def test_a_silent_failing_calibrator_says_only_why(monkeypatch):
    from onnxruntime.quantization import calibrate

    class Failing:
        def collect_data(self, reader):
            for line in ("one", "two", "three", "four", "five"):
                print(line)

        def compute_data(self):
            raise KeyError("no data")

    monkeypatch.setattr(calibrate, "create_calibrator", lambda *args, **kwargs: Failing())
    with pytest.raises(InputError) as info:
        build.ort_ranges(FP32, str(CALIB), "MinMax")
    assert str(info.value).endswith("failed ('no data'); it printed: two; three; four; five")

    class Silent(Failing):
        def collect_data(self, reader):
            pass

    monkeypatch.setattr(calibrate, "create_calibrator", lambda *args, **kwargs: Silent())
    with pytest.raises(InputError) as info:
        build.ort_ranges(FP32, str(CALIB), "MinMax")
    assert str(info.value) == f"{FP32}: onnxruntime's MinMax calibrator failed ('no data')"
