"""Per-node weight granularity: a node's weight per channel or per tensor against the global
``per_channel``, as a ``TensorQuantOverrides`` entry onnxruntime's QDQ quantizer honours (1.18 on),
searched at cost 0 before any node pays, and reproduced by the recipe's arguments and script."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import modelzoo
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from onnxruntime.quantization import calibrate as ort_calibrate

from pytest_qaccuracy.analysis.recipe import Recipe, search_recipe
from pytest_qaccuracy.analysis.recipe.build import RecipeBuilder
from pytest_qaccuracy.runtime import RuntimeOptions
from tests.analysis.test_recipe_joint import THRESHOLD, _net, _records, _sqnr

needs_cache = pytest.mark.skipif(
    not hasattr(ort_calibrate, "save_tensors_data"),
    reason=f"onnxruntime {ort.__version__} has no calibration cache: the recipe search refuses it",
)


@pytest.fixture(scope="module")
def net(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("weights")
    calib, held = _records(16, 3), _records(12, 4)
    return {
        "root": root,
        "fp32": _net(root / "joint.onnx"),
        "calib": modelzoo.write_h5(root / "calib.h5", calib),
        "eval": modelzoo.write_h5(root / "eval.h5", held),
        "calib_array": calib,
        "eval_array": held,
    }


def _weight_scales(path: Path) -> dict[str, tuple[int, int | None]]:
    """Weight initializer -> (its DequantizeLinear scale's size, that node's axis attribute)."""
    model = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0].startswith("w"):
            axis = next((a.i for a in node.attribute if a.name == "axis"), None)
            found[node.input[0].removesuffix("_quantized")] = (inits[node.input[1]].size, axis)
    return found


@pytest.mark.parametrize(
    ("recipe", "expected"),
    [
        (Recipe(flipped=frozenset({"mmA"})), {"w1": (32, 1), "w2": (1, None)}),
        (Recipe(per_channel=True, flipped=frozenset({"mmA"})), {"w1": (1, None), "w2": (8, 1)}),
        (Recipe(per_channel=True), {"w1": (32, 1), "w2": (8, 1)}),
        (Recipe(flipped=frozenset({"mmA"}), float=frozenset({"mmA"})), {"w2": (1, None)}),
    ],
)
def test_written_model_has_each_weights_granularity(net, tmp_path, recipe, expected):
    """What onnxruntime's quantize_static wrote (on every supported onnxruntime, 1.18 included): one
    scale per output channel (MatMul: axis 1) for a per-channel weight, one for a per-tensor one."""
    out = RecipeBuilder(net["fp32"], net["calib"], RuntimeOptions()).write(recipe, tmp_path / "m.onnx")
    assert _weight_scales(out) == expected


def test_recipe_round_trips_and_reads_older_documents():
    recipe = Recipe(per_channel=True, float=frozenset({"a"}), flipped=frozenset({"b"}))
    assert Recipe.from_dict(json.loads(json.dumps(recipe.to_dict()))) == recipe
    older = {k: v for k, v in recipe.to_dict().items() if k != "flipped"}  # written before the field
    assert Recipe.from_dict(older).flipped == frozenset()
    assert recipe.with_flip("b").flipped == frozenset()
    assert Recipe(flipped=frozenset({"b"})).with_nodes({"b": "float"}).flipped == frozenset()
    assert Recipe().with_flip("b").changes_from(Recipe()) == "per-channel weight +b"
    assert Recipe(per_channel=True).changes_from(Recipe(per_channel=True).with_flip("b")) == "per-tensor weight -b"


def _by_hand(net, out: Path, per_channel: bool, overrides: dict) -> float:
    """quantize_static called directly (onnxruntime's MinMax calibrator), SQNR on the held-out records."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_static

    root = logging.getLogger()
    level, root.level = root.level, logging.ERROR
    try:
        quantize_static(
            str(net["fp32"]),
            str(out),
            modelzoo.ArrayReader("x", net["calib_array"]),
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"TensorQuantOverrides": overrides},
        )
    finally:
        root.setLevel(level)
    x = net["eval_array"][:, 0]
    ref = ort.InferenceSession(str(net["fp32"])).run(None, {"x": x})[0]
    return _sqnr(ref, ort.InferenceSession(str(out)).run(None, {"x": x})[0])


@needs_cache
def test_search_flips_a_weight_at_no_cost_and_the_script_rewrites_it(net, tmp_path):
    """Neither global granularity meets the target with every node in int8 (measured here); one
    weight per channel and the other per tensor does: the search finds it at cost 0, its figure is
    the one a direct quantize_static call with that override gives, and recipe.py rewrites the model."""
    from pytest_qaccuracy.report.recipe_tables import steps_table, verdict_lines, write_recipe

    assert _by_hand(net, tmp_path / "pt.onnx", False, {}) < THRESHOLD
    assert _by_hand(net, tmp_path / "pc.onnx", True, {}) < THRESHOLD
    mixed = _by_hand(net, tmp_path / "mixed.onnx", False, {"w1": [{"axis": 1}]})
    assert mixed >= THRESHOLD

    result = search_recipe(
        net["fp32"],
        net["calib"],
        net["eval"],
        [f"sqnr>={THRESHOLD}"],
        start=Recipe(method="ort-minmax"),
        vary=("node_weights",),
        model_out=tmp_path / "best.onnx",
    )
    best = result.best_step
    assert result.met and best.cost == 0 and best.phase == "weights"
    assert best.recipe.flipped == {"mmA"} and not best.recipe.float and not best.recipe.int16
    assert best.measured["onnxruntime"]["y"]["sqnr"] == pytest.approx(mixed, rel=1e-6)
    assert result.arguments["extra_options"]["TensorQuantOverrides"] == {"w1": [{"axis": 1}]}
    assert "per-channel weight +mmA" in steps_table(result)
    assert any("per-channel weights (TensorQuantOverrides): ['mmA']" in line for line in verdict_lines(result))

    out = tmp_path / "out"
    write_recipe(result, out, net["fp32"], net["calib"])
    verified = onnx.load(str(out / "joint.recipe.onnx"))
    (out / "joint.recipe.onnx").unlink()
    done = subprocess.run(
        [sys.executable, str(out / "joint.recipe.py")], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    again = onnx.load(str(out / "joint.recipe.onnx"))
    assert again.graph.SerializeToString() == verified.graph.SerializeToString()
    assert _weight_scales(out / "joint.recipe.onnx") == {"w1": (32, 1), "w2": (1, None)}


@needs_cache
def test_flips_are_tried_only_when_asked(net):
    result = search_recipe(
        net["fp32"], net["calib"], net["eval"], [f"sqnr>={THRESHOLD}"], start=Recipe(method="ort-minmax"), vary=()
    )
    assert not any(s.phase == "weights" or s.recipe.flipped for s in result.steps)
    assert result.best_step.cost > 0


@needs_cache
@pytest.mark.parametrize("per_channel", [False, True])
def test_script_writes_the_flipped_granularity(net, tmp_path, per_channel):
    """The pasted script (onnxruntime's own MinMax calibrator on the records, the overrides as Python)
    writes the graph the search's builder wrote: with ``per_channel=True`` the flipped weight is per
    tensor by a ``quant_type`` entry, otherwise per channel by an ``axis`` entry."""
    import runpy

    from pytest_qaccuracy.analysis.recipe import python_snippet

    recipe = Recipe(method="ort-minmax", per_channel=per_channel, flipped=frozenset({"mmB"}))
    builder = RecipeBuilder(net["fp32"], net["calib"], RuntimeOptions())
    ours = builder.write(recipe, tmp_path / "ours.onnx")
    arguments = json.loads(json.dumps(recipe.arguments(builder.reads, None, builder.weights)))
    expected = [{"quant_type": "QInt8"}] if per_channel else [{"axis": 1}]
    assert arguments["extra_options"]["TensorQuantOverrides"] == {"w2": expected}
    script = tmp_path / "recipe.py"
    script.write_text(python_snippet(arguments, str(net["fp32"]), "script.onnx", str(net["calib"])))
    runpy.run_path(str(script), run_name="__main__")
    again = onnx.load(str(tmp_path / "script.onnx"))
    assert again.graph.SerializeToString() == onnx.load(str(ours)).graph.SerializeToString()
    assert _weight_scales(ours)["w2"] == ((1, None) if per_channel else (8, 1))
