"""The recipe search's estimates: a QDQ model onnxruntime wrote, edited for other global choices and
other excluded nodes, against what onnxruntime's ``quantize_static`` writes for them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from pytest_qaccuracy.analysis.recipe import GlobalEdits, Recipe
from pytest_qaccuracy.analysis.recipe.build import RecipeBuilder
from pytest_qaccuracy.analysis.recipe.checks import parse_checks
from pytest_qaccuracy.analysis.recipe.estimate import Estimator
from pytest_qaccuracy.runtime import RuntimeOptions
from tests.ort_features import needs_cache

pytestmark = needs_cache

SUITE = Path(__file__).resolve().parents[2] / "example_suites"
FP32 = SUITE / "models" / "digits_cnn.onnx"
CALIB = SUITE / "data" / "digits_calib.npz"
TEST = SUITE / "data" / "digits_test.npz"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    builder = RecipeBuilder(FP32, CALIB, RuntimeOptions())
    tmp = tmp_path_factory.mktemp("recipe-edit")
    model = onnx.load(str(builder.write(Recipe(), tmp / "base.onnx")))
    return builder, model, tmp


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize(
    "change",
    [
        {"method": "percentile"},
        {"method": "kl"},
        {"per_channel": True},
        {"reduce_range": True},
        {"activation_type": "int8"},
        {"weight_type": "uint8"},
        {"per_channel": True, "weight_type": "uint8", "method": "mse"},
    ],
)
def test_edited_model_holds_the_numbers_quantize_static_writes(built, change):
    _assert_edit_is_quantize_static(built, change)


def _assert_edit_is_quantize_static(built, change) -> None:
    """The base model edited for ``change`` holds, initializer by initializer and axis by axis, what
    ``quantize_static`` writes for it."""
    builder, base_model, tmp = built
    # made in the test, not in the fixture: mutation testing maps the code a test's body runs to it
    edits = GlobalEdits(base_model, Recipe(), builder.model, builder.ranges(Recipe()).ranges)
    recipe = replace(Recipe(), **change)
    real = onnx.load(str(builder.write(recipe, tmp / "real.onnx")))  # onnxruntime's quantize_static
    edited = edits.model(recipe, builder.estimated_ranges(recipe))
    want, have = _inits(real), _inits(edited)
    assert want.keys() == have.keys()
    for name, value in want.items():
        assert have[name].dtype == value.dtype and have[name].shape == value.shape, name
        np.testing.assert_array_equal(have[name], value, err_msg=name)
    axes = {n.name: [a.i for a in n.attribute if a.name == "axis"] for n in real.graph.node}
    assert axes == {n.name: [a.i for a in n.attribute if a.name == "axis"] for n in edited.graph.node}


@pytest.mark.parametrize(("excluded", "steps"), [(["conv1", "pool1"], 0), (["fc"], 0), (["conv2"], 1)])
def test_excluded_nodes_are_estimated_as_quantize_static_excludes_them(built, excluded, steps):
    """The estimator's edit of the base model runs the same numbers as quantize_static's model with
    ``nodes_to_exclude``: onnxruntime keeps a tensor quantized for every reader while a node asks for it.
    A Conv whose Relu the quantizer folded into its output pair (conv2) is estimated a step or two off
    on a third of the logits (an estimate's known error, docs/recipe.md)."""
    builder, _, tmp = built
    base = tmp / "base.onnx"
    real = builder.write(Recipe(float=frozenset(excluded)), tmp / "excluded.onnx")
    with Estimator(FP32, base, TEST, parse_checks(["cosine>=0.99"]), RuntimeOptions(), 4, lambda _: None) as est:
        edited = est.qgraph.build(est.enabled(excluded))
    x = np.load(TEST)["x"][:64]
    run = {}
    for name, model in (("real", str(real)), ("edited", edited.SerializeToString())):
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        run[name] = session.run(None, {"x": x})[0]
    if not steps:
        np.testing.assert_allclose(run["edited"], run["real"], rtol=0, atol=1e-5)
        return
    # conv2's folded Relu: a third of the logits a step apart, the outputs agree in what they say
    a, b = run["edited"].astype(np.float64).ravel(), run["real"].astype(np.float64).ravel()
    assert np.mean(a != b) < 0.5 and a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.999


def test_ranking_stops_between_passes_when_no_time_is_left(built):
    """With no time left after its first pass, the runner returns the sets that pass estimated (the
    ranking's nodes not estimated then rank as gaining nothing); without a limit, every set, and the
    first pass's figures are the same either way."""
    _, _, tmp = built
    base = tmp / "base.onnx"
    nodes = ["conv1", "pool1", "conv2", "pool2", "fc"]
    sets = [[n] for n in nodes] * 3  # 15 sets: more than the first pass holds
    with Estimator(FP32, base, TEST, parse_checks(["cosine>=0.99"]), RuntimeOptions(), 4, lambda _: None) as est:
        cut = est.margins(sets, "ranking", room=lambda: 0.0)
        full = est.margins(sets, "ranking")
    assert len(full) == len(sets)
    assert 0 < len(cut) < len(sets)
    assert cut == full[: len(cut)]


def _mixed(root: Path) -> tuple[Path, Path]:
    """Constants onnxruntime quantizes as activations (an Add's and a Mul's), a weight two nodes share,
    a transposed Gemm with a bias, a MatMul, and data-movement ops: the edit's other paths."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)

    def init(name, *shape, scale=0.5):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "wc", "bc"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "k_add"], ["a"], name="add"),
        helper.make_node("Mul", ["a", "k_mul"], ["m"], name="mul"),
        helper.make_node("MaxPool", ["m"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["g"], name="gemm", transB=1),
        helper.make_node("MatMul", ["g", "wm"], ["h1"], name="mm1"),
        helper.make_node("MatMul", ["g", "wm"], ["h2"], name="mm2"),
        helper.make_node("Sub", ["h1", "h2"], ["y0"], name="sub"),
        helper.make_node("Add", ["y0", "g"], ["y"], name="out"),
    ]
    graph = helper.make_graph(
        nodes,
        "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])],
        [
            init("wc", 3, 1, 3, 3),
            init("bc", 3, scale=0.1),
            init("k_add", 1, 3, 1, 1),
            numpy_helper.from_array(np.array([1.7], np.float32), "k_mul"),
            init("wg", 6, 48, scale=0.2),
            init("bg", 6, scale=0.1),
            init("wm", 6, 6),
        ],
    )
    model = root / "mixed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(model))
    data = root / "mixed.npz"
    np.savez(data, x=rng.standard_normal((16, 1, 8, 8)).astype(np.float32))
    return model, data


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recipe-edit-mixed")
    fp32, data = _mixed(tmp)
    builder = RecipeBuilder(fp32, data, RuntimeOptions())
    model = onnx.load(str(builder.write(Recipe(), tmp / "base.onnx")))
    return builder, model, tmp


@pytest.mark.parametrize(
    "change",
    [
        {"method": "percentile"},
        {"per_channel": True},
        {"reduce_range": True},
        {"activation_type": "int8"},
        {"activation_type": "int8", "method": "mse", "reduce_range": True},
        {"weight_type": "uint8"},
        {"per_channel": True, "weight_type": "uint8", "method": "kl"},
    ],
)
def test_edited_mixed_model_holds_the_numbers_quantize_static_writes(mixed, change):
    _assert_edit_is_quantize_static(mixed, change)
