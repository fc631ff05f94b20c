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
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from onnxruntime.quantization import QuantType

from pytest_qaccuracy.analysis.recipe import Recipe, search_recipe
from pytest_qaccuracy.analysis.recipe.build import RecipeBuilder
from pytest_qaccuracy.backend import IntegerSession
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.runtime import RuntimeOptions
from tests.analysis.test_recipe_joint import _net, _records, _sqnr
from tests.ort_features import OLD_ORT, needs_cache

#: The CPU the search and the figures below are measured on: an AVX2 x86 CPU, whose u8 x s8 pair sums
#: saturate, through the integer backend's emulation (bit-exact with onnxruntime there), so that every
#: host measures the same figures. A mixed granularity beats both global ones here because per-channel
#: scales make ``w2``'s int8 values large enough to saturate; with exact sums (VNNI) per channel wins
#: everywhere and there is nothing to flip.
TARGET = "onnxruntime-avx2"
#: between this net's figures on :data:`TARGET` (the brute force's nearest 1.3 dB away): per tensor
#: 21.87 dB and per channel 21.40 dB with every node in int8, ``w1`` per channel and ``w2`` per tensor
#: 25.60 dB
THRESHOLD = 24.3


@pytest.fixture(scope="module")
def net(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("weights")
    calib, held = _records(16, 3), _records(12, 4)
    return {
        "root": root,
        "fp32": _net(root / "joint.onnx", seed=2, wide=15.0, outliers=10.0),
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


def _search(net, vary: tuple[str, ...], **kwargs):
    """The search from onnxruntime's MinMax recipe towards :data:`THRESHOLD` on :data:`TARGET`."""
    checks = [f"sqnr>={THRESHOLD}"]
    start = Recipe(method="ort-minmax")
    return search_recipe(net["fp32"], net["calib"], net["eval"], checks, [TARGET], start=start, vary=vary, **kwargs)


def _by_hand(net, out: Path, per_channel: bool, overrides: dict) -> float:
    """quantize_static called directly (onnxruntime's MinMax calibrator), SQNR on the held-out records
    as :data:`TARGET` computes them."""
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
    return _sqnr(ref, IntegerSession(str(out), scheme=TARGET).run(None, {"x": x})[0])


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

    result = _search(net, ("node_weights",), model_out=tmp_path / "best.onnx")
    best = result.best_step
    assert result.met and best.cost == 0 and best.phase == "weights"
    assert best.recipe.flipped == {"mmA"} and not best.recipe.float and not best.recipe.int16
    overrides = result.arguments["extra_options"]["TensorQuantOverrides"]
    assert overrides["w1"][0]["axis"] == 1  # per channel, with any 7-bit or type move the step also kept
    for kind, nodes in (("7-bit", best.recipe.narrowed), ("uint8", best.recipe.retyped)):
        shown = f"{kind} weights (TensorQuantOverrides): {sorted(nodes)!r}"
        assert any(shown in line for line in verdict_lines(result)) == bool(nodes)
    if best.recipe.narrowed or best.recipe.retyped:  # the figure of the override the recipe writes
        as_python = {
            name: [{k: QuantType[v] if k == "quant_type" else v for k, v in entries[0].items()}]
            for name, entries in overrides.items()
        }
        mixed = _by_hand(net, tmp_path / "kept.onnx", False, as_python)
    else:
        assert overrides == {"w1": [{"axis": 1}]}
    assert best.measured[TARGET]["y"]["sqnr"] == pytest.approx(mixed, rel=1e-6)
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
    result = _search(net, ())
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


# --- per-node 7-bit weights (narrowed) and weight type (retyped) -------------------------------------------


def _weight_forms(path: Path) -> dict[str, tuple[str, bool, int]]:
    """Weight initializer -> (its quantized dtype, whether it is 7-bit, its scale count), read from the
    model file: 7-bit when every channel's quantized values span at most 128 steps."""
    model = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0].startswith("w"):
            q, scale = inits[node.input[0]].astype(int), inits[node.input[1]]
            axis = next((a.i for a in node.attribute if a.name == "axis"), None)
            flat = q.reshape(1, -1) if axis is None else np.moveaxis(q, axis, 0).reshape(q.shape[axis], -1)
            seven = bool(np.all(flat.max(axis=1) - flat.min(axis=1) <= 128))
            assert inits[node.input[2]].dtype == q.dtype or inits[node.input[2]].dtype == inits[node.input[0]].dtype
            found[node.input[0].removesuffix("_quantized")] = (str(inits[node.input[0]].dtype), seven, scale.size)
    return found


MOVES = [
    (Recipe(narrowed=frozenset({"mmA"})), {"w1": ("int8", True, 1), "w2": ("int8", False, 1)}),
    (Recipe(retyped=frozenset({"mmA"})), {"w1": ("uint8", False, 1), "w2": ("int8", False, 1)}),
    (
        Recipe(flipped=frozenset({"mmA"}), narrowed=frozenset({"mmA"}), retyped=frozenset({"mmA"})),
        {"w1": ("uint8", True, 32), "w2": ("int8", False, 1)},
    ),
    (
        Recipe(per_channel=True, reduce_range=True, narrowed=frozenset({"mmB"})),
        {"w1": ("int8", True, 32), "w2": ("int8", False, 8)},
    ),
    (
        Recipe(per_channel=True, weight_type="uint8", retyped=frozenset({"mmB"}), narrowed=frozenset({"mmB"})),
        {"w1": ("uint8", False, 32), "w2": ("int8", True, 8)},
    ),
]


@pytest.mark.parametrize(("recipe", "expected"), MOVES)
def test_written_model_has_each_weights_range_and_type(net, tmp_path, recipe, expected):
    """What quantize_static wrote: the narrowed node's weight 7-bit, the retyped one of the other type,
    with the granularity the node has (one override entry combines them); onnxruntime 1.18 refuses."""
    builder = RecipeBuilder(net["fp32"], net["calib"], RuntimeOptions())
    if OLD_ORT:
        with pytest.raises(InputError, match=r"newer than 1\.18"):
            builder.write(recipe, tmp_path / "m.onnx")
        return
    assert _weight_forms(builder.write(recipe, tmp_path / "m.onnx")) == expected


@pytest.mark.skipif(OLD_ORT, reason="onnxruntime 1.18 refuses per-node weight types and 7-bit weights")
@pytest.mark.parametrize(("recipe", "expected"), MOVES)
def test_edited_model_has_the_weights_onnxruntime_writes(net, tmp_path, recipe, expected):
    """The weights step's estimate (the base model edited) holds the very weights, scales and zero
    points quantize_static writes for the per-node moves."""
    from pytest_qaccuracy.analysis.recipe.edit import GlobalEdits

    builder = RecipeBuilder(net["fp32"], net["calib"], RuntimeOptions())
    base = Recipe(recipe.method, recipe.per_channel, recipe.reduce_range, recipe.activation_type, recipe.weight_type)
    ranges = builder.ranges(base).ranges
    edits = GlobalEdits(onnx.load(str(builder.write(base, tmp_path / "base.onnx"))), base, builder.model, ranges)
    edited = edits.model(recipe, ranges)
    written = onnx.load(str(builder.write(recipe, tmp_path / "m.onnx")))

    def weights(model):
        return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name.startswith("w")}

    ours, theirs = weights(edited), weights(written)
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert ours[name].dtype == value.dtype, name
        np.testing.assert_array_equal(ours[name], value, err_msg=name)


def test_why_onnxruntime_118_is_refused(net, tmp_path):
    """The measured reason of the refusal: onnxruntime 1.18 writes a per-tensor MatMul weight uint8 with
    int8 weights asked (newer onnxruntime: int8), so a per-node type there would not be what it says."""
    out = RecipeBuilder(net["fp32"], net["calib"], RuntimeOptions()).write(Recipe(), tmp_path / "m.onnx")
    assert _weight_forms(out)["w1"][0] == ("uint8" if OLD_ORT else "int8")


def test_refusal_names_each_reason():
    from pytest_qaccuracy.analysis.recipe.space import refusal

    assert refusal(Recipe(narrowed=frozenset({"a"})), "1.32.0") is None
    assert "newer than 1.18" in refusal(Recipe(retyped=frozenset({"a"})), "1.18.0")
    assert "newer than 1.18" in refusal(Recipe(narrowed=frozenset({"a"})), "1.18.1")
    assert refusal(Recipe(narrowed=frozenset({"a"}), float=frozenset({"a"})), "1.18.0") is None
    # int8 activations: a node's weight retyped to uint8 is a pair onnxruntime refuses
    assert "refuses int8 activations with uint8" in refusal(
        Recipe(activation_type="int8", retyped=frozenset({"a"})), "1.32.0"
    )
    assert refusal(Recipe(activation_type="int8", weight_type="int8"), "1.18.0") is None


def test_moves_round_trip_and_read_older_documents():
    recipe = Recipe(per_channel=True, flipped=frozenset({"b"}), narrowed=frozenset({"a", "b"}), retyped={"c"})
    recipe = Recipe.from_dict(recipe.to_dict())  # sets to frozensets
    assert Recipe.from_dict(json.loads(json.dumps(recipe.to_dict()))) == recipe
    older = {k: v for k, v in recipe.to_dict().items() if k not in ("narrowed", "retyped")}
    assert Recipe.from_dict(older) == Recipe(per_channel=True, flipped=frozenset({"b"}))
    assert recipe.with_nodes({"b": "float"}).narrowed == {"a"} and recipe.with_nodes({"c": "float"}).retyped == set()
    assert Recipe().with_move("narrowed", "a").changes_from(Recipe()) == "7-bit weight +a"
    assert Recipe(reduce_range=True).with_move("narrowed", "a").changes_from(Recipe(reduce_range=True)) == (
        "8-bit weight +a"
    )
    assert Recipe().changes_from(Recipe().with_move("retyped", "a")) == "uint8 weight -a"
    assert Recipe(weight_type="uint8").with_move("retyped", "a").changes_from(Recipe(weight_type="uint8")) == (
        "int8 weight +a"
    )
    weights = {"a": ("wa", 1), "b": ("wb", 0), "c": ("wc", 1)}
    assert recipe.overrides({}, weights) == {
        "wa": [{"axis": 1, "reduce_range": True}],  # per channel kept: an entry without axis is per tensor
        "wb": [{"quant_type": "QInt8", "reduce_range": True}],  # flipped to per tensor, and 7-bit
        "wc": [{"axis": 1, "quant_type": "QUInt8"}],
    }


@pytest.mark.skipif(OLD_ORT, reason="onnxruntime 1.18 refuses per-node weight types and 7-bit weights")
def test_script_writes_the_narrowed_and_retyped_weights(net, tmp_path):
    """The pasted script writes the graph the search's builder wrote, every per-node move included."""
    import runpy

    from pytest_qaccuracy.analysis.recipe import python_snippet

    recipe = Recipe(
        method="ort-minmax", flipped=frozenset({"mmA"}), narrowed=frozenset({"mmA", "mmB"}), retyped=frozenset({"mmB"})
    )
    builder = RecipeBuilder(net["fp32"], net["calib"], RuntimeOptions())
    ours = builder.write(recipe, tmp_path / "ours.onnx")
    arguments = json.loads(json.dumps(recipe.arguments(builder.reads, None, builder.weights)))
    assert arguments["extra_options"]["TensorQuantOverrides"] == {
        "w1": [{"axis": 1, "reduce_range": True}],
        "w2": [{"quant_type": "QUInt8", "reduce_range": True}],
    }
    script = tmp_path / "recipe.py"
    script.write_text(python_snippet(arguments, str(net["fp32"]), "script.onnx", str(net["calib"])))
    runpy.run_path(str(script), run_name="__main__")
    again = onnx.load(str(tmp_path / "script.onnx"))
    assert again.graph.SerializeToString() == onnx.load(str(ours)).graph.SerializeToString()
    assert _weight_forms(ours) == {"w1": ("int8", True, 32), "w2": ("uint8", True, 1)}


@needs_cache
def test_weights_step_estimates_each_move_kind(net, tmp_path):
    """The weights step estimates every candidate's 7-bit and retyped weight (on 1.18: a note with the
    reason instead), and an estimate is the figure of the model quantize_static writes for it (the
    edit holds the same weights; the activations are the start's)."""
    from pytest_qaccuracy.report.recipe_tables import steps_table

    notes: list[str] = []
    result = search_recipe(
        net["fp32"],
        net["calib"],
        net["eval"],
        ["sqnr>=200"],  # out of reach: every step runs
        start=Recipe(method="ort-minmax"),
        vary=("node_weights",),
        on_note=notes.append,
    )
    rows = {s.change: s for s in result.steps if s.phase == "weights" and s.estimated}
    if OLD_ORT:
        assert not any(s.recipe.narrowed or s.recipe.retyped for s in result.steps)
        assert sum("newer than 1.18" in n for n in notes) == 2
        return
    table = steps_table(result)
    assert "7-bit weight +mmB" in table and "uint8 weight +mmB" in table
    for kind, override in (("7-bit", {"reduce_range": True}), ("uint8", {"quant_type": QuantType.QUInt8})):
        step = next(s for change, s in rows.items() if change.startswith(f"{kind} weight +mmB"))
        assert step.skipped is None
        entry = {**override, "quant_type": override.get("quant_type", QuantType.QInt8)}
        overrides = {"w2": [entry]}
        if step.recipe.flipped or step.recipe.narrowed - {"mmB"} or step.recipe.retyped - {"mmB"}:
            continue  # moves kept before it: the hand-made figure would need them too
        expected = _by_hand(net, tmp_path / f"{kind}.onnx", False, overrides)
        assert step.measured["onnxruntime"]["y"]["sqnr"] == pytest.approx(expected, rel=1e-6)
