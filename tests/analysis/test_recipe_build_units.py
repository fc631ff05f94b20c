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
from onnxruntime.quantization import calibrate as ort_calibrate

from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges
from pytest_qaccuracy.analysis.calibration.calibrator import CalibrationResult
from pytest_qaccuracy.analysis.recipe import build
from pytest_qaccuracy.analysis.recipe.space import Recipe
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.runtime import RuntimeOptions

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


needs_cache = pytest.mark.skipif(
    not hasattr(ort_calibrate, "save_tensors_data"),
    reason=f"onnxruntime {ort.__version__} has no calibration cache",
)


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
