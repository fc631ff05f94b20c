"""Units of the recipe search's pieces, each against values worked out by hand: the cost model's work
per node and its weights, the recipe's arguments and the aims' parsing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.analysis.recipe.cost import CostModel, node_work, parse_weights
from pytest_qaccuracy.analysis.recipe.space import Recipe
from pytest_qaccuracy.errors import InputError


def _init(name: str, shape: tuple[int, ...]):
    return numpy_helper.from_array(np.zeros(shape, np.float32), name)


def _work_model():
    """Every product op the cost model reads a reduction length from, and ops it counts by elements."""
    nodes = [
        # (1, 3, 8, 8) -> (1, 4, 8, 8), weight (4, 3, 3, 3): 27 products per output element
        helper.make_node("Conv", ["x", "wc"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        # grouped transposed conv: weight (4, 2, 3, 3), group 2, strides 2 -> (1, 4, 17, 17);
        # C/group * kh * kw / strides = 4/2 * 9 / 4 = 4.5 products per output element
        helper.make_node("ConvTranspose", ["c", "wt"], ["t0"], name="deconv", group=2, strides=[2, 2]),
        helper.make_node("Slice", ["t0", "starts", "ends"], ["t"], name="crop"),  # (1, 4, 16, 16)
        # no group, no strides: weight (4, 3, 2, 2) -> (1, 3, 9, 9); 4 * 4 products per output element
        helper.make_node("ConvTranspose", ["c", "wp"], ["tp"], name="deconv_plain"),
        helper.make_node("Relu", ["t"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flat"),  # (1, 1024)
        # Gemm with transB: weight (5, 1024), K = 1024
        helper.make_node("Gemm", ["f", "wg"], ["g"], name="gemm_t", transB=1),
        # Gemm with transB written as 0: weight (5, 6), K = 5
        helper.make_node("Gemm", ["g", "wg2"], ["g2"], name="gemm", transB=0),
        # MatMul with a 3-D weight (2, 3, 7) on a (2, 1, 3) input: K = 3 (the weight's second last)
        helper.make_node("Reshape", ["g2", "shape"], ["m_in"], name="reshape"),
        helper.make_node("MatMul", ["m_in", "wm"], ["y"], name="matmul"),
        helper.make_node("Identity", ["y"], ["z"]),  # unnamed: no entry
        # two inputs but not a product: elements only, whatever the second input's shape
        helper.make_node("Add", ["x", "bias"], ["x_plus"], name="add"),
        # an output without a known shape counts as one element
        helper.make_node("Relu", ["unknown"], ["u"], name="relu_unknown"),
    ]
    graph = helper.make_graph(
        nodes,
        "work",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8]),
            helper.make_tensor_value_info("unknown", TensorProto.FLOAT, None),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("z", "x_plus", "u", "tp")],
        [
            _init("wc", (4, 3, 3, 3)),
            _init("wt", (4, 2, 3, 3)),
            _init("wp", (4, 3, 2, 2)),
            numpy_helper.from_array(np.array([0, 0, 0, 0], np.int64), "starts"),
            numpy_helper.from_array(np.array([1, 4, 16, 16], np.int64), "ends"),
            _init("wg", (5, 1024)),
            _init("wg2", (5, 6)),
            _init("wm", (2, 3, 7)),
            _init("bias", (8,)),
            numpy_helper.from_array(np.array([2, 1, 3], np.int64), "shape"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_node_work_is_macs_for_products_and_elements_for_the_rest():
    work = node_work(_work_model())
    assert work == {
        "conv": 4 * 8 * 8 * 27,  # the batch dimension N is unknown: it counts as 1
        "deconv": 4 * 17 * 17 * 4.5,
        "crop": 4 * 16 * 16,
        "deconv_plain": 3 * 9 * 9 * 16,
        "relu": 4 * 16 * 16,
        "flat": 1024,
        "gemm_t": 5 * 1024,
        "gemm": 6 * 5,
        "reshape": 2 * 1 * 3,
        "matmul": 2 * 1 * 7 * 3,
        "add": 3 * 8 * 8,
        "relu_unknown": 1,
    }


def test_node_work_without_a_known_weight_shape_counts_elements():
    """A MatMul of two activations (no initializer, no inferred shape) and a one-input Conv-like
    node count their output elements only."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
        "act",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
    )
    assert node_work(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])) == {"mm": 12.0}


def test_node_work_of_a_one_dimensional_matmul_weight_is_its_length():
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"], name="mm")],
        "vec",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [_init("w", (5,))],
    )
    assert node_work(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])) == {"mm": 15.0}


def test_cost_model_weighs_each_precision_and_relates_to_the_whole_model_in_float():
    cost = CostModel({"a": 10.0, "b": 30.0, "c": 60.0}, int16=0.5, float=2.0)
    assert cost.total == 100.0
    assert cost.node("a", "int8") == 0.0
    assert cost.node("a", "int16") == 5.0
    assert cost.node("b", "float") == 60.0
    assert cost.node("unknown", "float") == 2.0  # a node without work counts as one operation
    recipe = Recipe(int16=frozenset({"a"}), float=frozenset({"b", "c"}))
    assert cost.absolute(recipe) == 5.0 + 60.0 + 120.0
    assert cost.relative(recipe) == pytest.approx(185.0 / 200.0)
    assert cost.relative(Recipe()) == 0.0


def test_cost_model_with_free_wide_precisions_and_no_work():
    free = CostModel({"a": 4.0}, int16=0.0, float=0.0)
    assert free.relative(Recipe(float=frozenset({"a"}))) == 0.0  # no division by zero
    empty = CostModel({})
    assert empty.total == 1.0
    assert empty.relative(Recipe(float=frozenset({"x"}))) == 1.0


@pytest.mark.parametrize(("int16", "float_"), [(-0.1, 1.0), (1.5, 1.0)])
def test_cost_model_refuses_weights_out_of_order(int16, float_):
    with pytest.raises(InputError, match=rf"0 <= int16 <= float, got int16={int16}, float={float_}"):
        CostModel({}, int16=int16, float=float_)


def test_cost_model_takes_equal_weights_and_zero():
    assert CostModel({}, int16=1.0, float=1.0).int16 == 1.0
    assert CostModel({}, int16=0.0, float=0.5).float == 0.5


def test_parse_weights():
    assert parse_weights("int16=0.5, float=2") == {"int16": 0.5, "float": 2.0}
    assert parse_weights(" int16 = 0.25 ,,") == {"int16": 0.25}
    assert parse_weights("") == {}
    with pytest.raises(InputError, match=r"cost weight 'int4=1': expected int16=W or float=W"):
        parse_weights("int16=1,int4=1")
    with pytest.raises(InputError, match=r"cost weight 'float=x': 'x' is not a number"):
        parse_weights("float=x")
    with pytest.raises(InputError, match=r"cost weight 'float==1': '=1' is not a number"):
        parse_weights("float==1")


def _outcome(kind: str, check: str, metric: str, op: str, threshold: float, value: float | None, **fields):
    from dataclasses import replace

    from pytest_qaccuracy.analysis.checks import compared

    scope = "task" if kind == "task" else "output"
    return replace(compared(kind, check, scope, "output 'y'", metric, op, threshold, value, "ini"), **fields)


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (_outcome("tolerance", "max_lsb", "lsb", "<=", 0.0, 2.0, output="y"), ("lsb", 0.0, False, "tensor", 1)),
        (
            _outcome("tolerance", "min_top1_agreement", "top-1 agreement", ">=", 0.0, -1.0, k=1),
            ("min_top1_agreement", 0.0, True, "topk", 1),
        ),
        (
            _outcome("tolerance", "max_top1_drop", "top-2 accuracy drop", "<=", 0.0, 0.5, k=2),
            ("max_top2_drop", 0.0, False, "topk", 2),
        ),
        (_outcome("task", "max_drop:cer", "cer drop", "<=", 0.0, 0.1), ("max_drop:cer", 0.0, False, "task", 1)),
    ],
)
def test_a_zero_bound_stays_zero(outcome, expected):
    """``threshold or 0.0`` reads a bound of 0 as 0, not as a missing one."""
    from pytest_qaccuracy.analysis.recipe.aims import aim

    found = aim(outcome)
    assert (found.metric, found.value, found.higher_is_better, found.kind, found.k) == expected


def test_allclose_with_atol_alone_has_rtol_zero():
    from pytest_qaccuracy.analysis.recipe.aims import aim
    from pytest_qaccuracy.analysis.recipe.checks import Check

    outcome = _outcome("tolerance", "atol", "absolute", "<=", 0.0, 0.5, params={"atol": 0.25})
    assert aim(outcome) == Check("allclose", 0.0, False, "allclose", 1.0, rtol=0.0, atol=0.25)


def test_a_tolerance_the_search_does_not_know_is_skipped_with_its_name():
    from pytest_qaccuracy.analysis.recipe.aims import aim, recipe_checks

    outcome = _outcome("tolerance", "max_entropy", "entropy", "<=", 1.0, 2.0)
    assert aim(outcome) == "the search does not measure max_entropy"
    assert recipe_checks([outcome]) == ([], ["max_entropy: the search does not measure max_entropy"])


def test_a_task_check_that_measured_nothing_is_skipped():
    from pytest_qaccuracy.analysis.recipe.aims import aim

    assert aim(_outcome("task", "max_drop:cer", "cer drop", "<=", 0.01, None)) == "it measured nothing"


def test_recipe_checks_aims_a_views_check_at_its_view():
    from pytest_qaccuracy.analysis.recipe.aims import recipe_checks
    from pytest_qaccuracy.analysis.recipe.checks import Check

    rule = _outcome("rule", "head mse<4", "mse", "<", 4.0, 9.0, output="head")
    checks, skipped = recipe_checks([rule], {"head": "y[:, :2]"})
    assert checks == [Check("mse", 4.0, False, strict=True, output="head", view="y[:, :2]")] and skipped == []


def test_precision_and_with_precision_move_a_node_between_the_sets():
    recipe = Recipe(int16=frozenset({"a"}), float=frozenset({"b"}))
    assert [recipe.precision(n) for n in ("a", "b", "c")] == ["int16", "float", "int8"]
    assert recipe.with_precision("c", "int16").int16 == {"a", "c"}
    assert recipe.with_precision("c", "float").float == {"b", "c"}
    moved = recipe.with_precision("a", "float")
    assert (moved.int16, moved.float) == (frozenset(), frozenset({"a", "b"}))
    back = recipe.with_precision("b", "int8")
    assert (back.int16, back.float) == (frozenset({"a"}), frozenset())


def test_changes_from_names_every_difference():
    base = Recipe()
    other = Recipe(
        method="kl",
        per_channel=True,
        reduce_range=True,
        activation_type="int8",
        weight_type="uint8",
        int16=frozenset({"i1", "i2"}),
        float=frozenset({"f1", "f2", "f3", "f4", "f5"}),
    )
    assert other.changes_from(base) == (
        "method=kl, per_channel=True, reduce_range=True, activation_type=int8, weight_type=uint8, "
        "int16 +i1,i2, float +f1,f2,f3 (+2 more)"
    )
    assert base.changes_from(other) == (
        "method=minmax, per_channel=False, reduce_range=False, activation_type=uint8, weight_type=int8, "
        "int16 -i1,i2, float -f1,f2,f3 (+2 more)"
    )
    four = Recipe(float=frozenset("abcd"))
    assert four.changes_from(Recipe(float=frozenset("a"))) == "float +b,c,d"
    assert Recipe(float=frozenset("abcde")).changes_from(Recipe(float=frozenset("a"))) == "float +b,c,d (+1 more)"
    assert base.changes_from(Recipe()) == "(same)"


def test_refusal_reads_the_version_at_minor_precision():
    from pytest_qaccuracy.analysis.recipe.space import OLD_ORT_PER_NODE, refusal

    narrowed = Recipe(narrowed=frozenset({"a"}))
    assert refusal(narrowed, "1.18.9") == OLD_ORT_PER_NODE.format(version="1.18.9")
    assert refusal(narrowed, "1.19.0") is None
    assert refusal(narrowed, "1.17") == OLD_ORT_PER_NODE.format(version="1.17")
    # a retyped weight of an int8-activation recipe would be uint8: refused on every version
    retyped = Recipe(activation_type="int8", weight_type="int8", retyped=frozenset({"a"}))
    assert refusal(retyped, "1.32.0") == "onnxruntime's quantize_static refuses int8 activations with uint8 weights"


def _run_snippet(text: str, tmp_path, monkeypatch) -> list[tuple[tuple, dict]]:
    """Run a recipe script in this process, with onnxruntime's quantize_static recording its call and
    our data reader recording what it was given."""
    import runpy

    import onnxruntime.quantization as quantization

    from pytest_qaccuracy.analysis.calibration import reader

    calls: list[tuple[tuple, dict]] = []

    class Reader:
        def __init__(self, data, model):
            self.given, self.range = (data, model), None

        def set_range(self, start, stop):
            self.range = (start, stop)

    def quantize_static(*args, **kwargs):
        model = Path(args[0])
        snapshot = model.read_bytes() if model.is_file() else None  # the model as it was at the call
        calls.append((args, {**kwargs, "model bytes": snapshot} if snapshot is not None else kwargs))

    monkeypatch.setattr(quantization, "quantize_static", quantize_static)
    monkeypatch.setattr(reader, "DatasetReader", Reader)
    script = tmp_path / "recipe.py"
    script.write_text(text)
    runpy.run_path(str(script))
    return calls


def test_python_snippet_calls_quantize_static_with_the_recipes_arguments(tmp_path, monkeypatch):
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

    from pytest_qaccuracy.analysis.recipe.space import python_snippet

    recipe = Recipe(int16=frozenset({"n"}), float=frozenset({"f"}), flipped=frozenset({"m"}), narrowed=frozenset({"m"}))
    arguments = recipe.arguments({"n": ["t_in", "t_out"]}, "ranges.cache", {"m": ("w", 1)})
    arguments["extra_options"]["ActivationSymmetric"] = True
    arguments["extra_options"]["WeightSymmetric"] = False
    text = python_snippet(arguments, "/models/fp32.onnx", "out.onnx", "/data/calib.npz")
    ((args, kwargs),) = _run_snippet(text, tmp_path, monkeypatch)
    assert args == ("/models/fp32.onnx", str(tmp_path / "out.onnx"), None)
    assert kwargs == {
        "quant_format": QuantFormat.QDQ,
        "per_channel": False,
        "reduce_range": False,
        "activation_type": QuantType.QUInt8,
        "weight_type": QuantType.QInt8,
        "nodes_to_exclude": ["f"],
        "extra_options": {
            "ActivationSymmetric": True,
            "WeightSymmetric": False,
            "TensorQuantOverrides": {
                "t_in": [{"quant_type": QuantType.QUInt16}],
                "t_out": [{"quant_type": QuantType.QUInt16}],
                "w": [{"axis": 1, "reduce_range": True}],
            },
        },
        "calibrate_method": CalibrationMethod.MinMax,
        "calibration_cache_path": str(tmp_path / "ranges.cache"),
    }


def test_python_snippet_with_onnxruntimes_calibrator_reads_the_records(tmp_path, monkeypatch):
    from onnxruntime.quantization import CalibrationMethod

    from pytest_qaccuracy.analysis.recipe.space import python_snippet

    arguments = Recipe(method="ort-percentile").arguments({}, None)
    out = str(tmp_path / "abs" / "out.onnx")
    text = python_snippet(arguments, "m.onnx", out, "calib.h5", records=6)
    ((args, kwargs),) = _run_snippet(text, tmp_path, monkeypatch)
    model, written, reader = args
    assert (model, written, reader.given, reader.range) == ("m.onnx", out, ("calib.h5", "m.onnx"), (0, 6))
    assert kwargs["calibrate_method"] == CalibrationMethod.Percentile
    assert "calibration_cache_path" not in kwargs
    assert kwargs["extra_options"] == {"TensorQuantOverrides": {}}
    # all the records: no range set
    ((args, _),) = _run_snippet(python_snippet(arguments, "m.onnx", out, "calib.h5"), tmp_path, monkeypatch)
    assert args[2].range is None


def test_python_snippet_converts_the_opset_first(tmp_path, monkeypatch):
    from pytest_qaccuracy.analysis.recipe.space import python_snippet

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    fp32 = tmp_path / "fp32.onnx"
    import onnx

    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]), str(fp32))
    text = python_snippet(Recipe().arguments({}, "c.cache"), str(fp32), "o.onnx", "d.npz", convert_opset=13)
    (((model, _, _), kwargs),) = _run_snippet(text, tmp_path, monkeypatch)
    assert Path(model).name == "opset13.fp32.onnx"
    converted = onnx.load_from_string(kwargs["model bytes"])
    assert [(o.domain, o.version) for o in converted.opset_import] == [("", 13)]
    assert not Path(model).exists()  # the temporary folder is gone after the call


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cosine>=0.99", ("cosine", 0.99, True, "tensor", 1e-12, 1, False)),
        (" mse <= 1e-4 ", ("mse", 1e-4, False, "tensor", 1e-12, 1, False)),
        ("sqnr>20", ("sqnr", 20.0, True, "tensor", 1e-12, 1, True)),
        ("mse<0.5", ("mse", 0.5, False, "tensor", 1e-12, 1, True)),
        ("cosine=-1", ("cosine", -1.0, True, "tensor", 1e-12, 1, False)),
        ("max_top5_drop<=0.01", ("max_top5_drop", 0.01, False, "topk", 0.01, 5, False)),
        ("max_top1_drop<=-1", ("max_top1_drop", -1.0, False, "topk", 0.01, 1, False)),
        ("min_top12_agreement>=1", ("min_top12_agreement", 1.0, True, "topk", 0.01, 12, False)),
        ("min_top1_agreement>0", ("min_top1_agreement", 0.0, True, "topk", 0.01, 1, True)),
        ("max_drop:cer<=0.01", ("max_drop:cer", 0.01, False, "task", 0.01, 1, False)),
        ("min:exact_match>=0.9", ("min:exact_match", 0.9, True, "task", 0.01, 1, False)),
        ("max:cer<0.05", ("max:cer", 0.05, False, "task", 0.01, 1, True)),
    ],
)
def test_parse_check_reads_each_kind(text, expected):
    from pytest_qaccuracy.analysis.recipe.checks import parse_check

    c = parse_check(text)
    assert (c.metric, c.value, c.higher_is_better, c.kind, c.scale, c.k, c.strict) == expected


def test_parse_check_allclose_bounds_are_never_strict():
    from pytest_qaccuracy.analysis.recipe.checks import Check, parse_check

    assert parse_check("rtol<0.01") == Check("allclose", 0.0, False, "allclose", 1.0, rtol=0.01)
    assert parse_check("atol<=0") == Check("allclose", 0.0, False, "allclose", 1.0, atol=0.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cosine", "target 'cosine': expected METRIC>=VALUE or METRIC<=VALUE, e.g. cosine>=0.99"),
        ("", "target '': expected METRIC>=VALUE"),
        ("Cosine>=0.9", "target 'Cosine>=0.9': expected METRIC>=VALUE"),
        ("mse>=1", "target 'mse>=1': mse is better when lower; write mse<="),
        ("cosine<=0.5", "target 'cosine<=0.5': cosine is better when higher; write cosine>="),
        ("max_top1_drop>0", "target 'max_top1_drop>0': max_top1_drop is better when lower; write max_top1_drop<="),
        ("cosine>=1.5", "target 'cosine>=1.5': no model can meet it (cosine lies in [-1, 1])"),
        ("cosine>=-1.5", "(cosine lies in [-1, 1])"),
        ("sqnr>=inf", "target 'sqnr>=inf': expected a finite bound, got inf"),
        ("mse<=-0.1", "(mse lies in [0, inf])"),
        ("rtol<=-0.1", "(rtol lies in [0, inf])"),
        ("max_top0_drop<=0.1", "target 'max_top0_drop<=0.1': k must be >= 1"),
        ("max_top1_drop<=1.5", "(max_top1_drop lies in [-1, 1])"),
        ("max_top1_drop<=-1.5", "(max_top1_drop lies in [-1, 1])"),
        ("min_top1_agreement>=-0.1", "(min_top1_agreement lies in [0, 1])"),
        ("min_top1_agreement>=1.1", "(min_top1_agreement lies in [0, 1])"),
    ],
)
def test_parse_check_refusals_name_the_target(text, message):
    from pytest_qaccuracy.analysis.recipe.checks import parse_check

    with pytest.raises(InputError) as info:
        parse_check(text)
    assert message in str(info.value)


def test_an_unknown_check_lists_what_the_search_measures():
    from pytest_qaccuracy.analysis.recipe.checks import parse_check
    from pytest_qaccuracy.metrics import available_metrics

    with pytest.raises(InputError) as info:
        parse_check("nope>=1")
    assert str(info.value) == (
        f"target 'nope>=1': unknown check 'nope'; expected a metric ({', '.join(available_metrics())}), rtol, atol, "
        "max_top<k>_drop, min_top<k>_agreement or a task value (min:, max:, max_drop:<value>)"
    )


def test_check_met_op_and_text():
    from pytest_qaccuracy.analysis.recipe.checks import Check

    ge, le = Check("cosine", 0.5, True), Check("mse", 0.5, False)
    gt, lt = Check("cosine", 0.5, True, strict=True), Check("mse", 0.5, False, strict=True)
    assert [ge.met(v) for v in (0.4, 0.5, 0.6, None)] == [False, True, True, False]
    assert [le.met(v) for v in (0.4, 0.5, 0.6, None)] == [True, True, False, False]
    assert [gt.met(v) for v in (0.4, 0.5, 0.6, None)] == [False, False, True, False]
    assert [lt.met(v) for v in (0.4, 0.5, 0.6, None)] == [True, False, False, False]
    assert [c.op for c in (ge, le, gt, lt)] == [">=", "<=", ">", "<"]
    assert str(Check("cosine", 0.9999999, True)) == "cosine >= 0.9999999"
    assert str(Check("sqnr", 20.0, True, output="y")) == "sqnr >= 20 on 'y'"
    assert str(Check("allclose", 0.0, False, "allclose", rtol=0.01, atol=2.0)) == "allclose <= 0 (rtol=0.01, atol=2)"
    assert Check("max_drop:cer", 0.1, False, "task").task_value == "cer"
    assert Check("max_drop:cer", 0.1, False).task_value is None  # a tensor check names no task value


def test_parse_checks_folds_rtol_and_atol_and_passes_checks_and_targets_through():
    from pytest_qaccuracy.analysis.recipe.checks import Check, parse_checks
    from pytest_qaccuracy.analysis.sweep import Target

    given = Check("sqnr", 10.0, True)
    checks = parse_checks(["rtol<=0.01", given, "atol<=0.5", "rtol<=0.02", Target("mse", 0.25)])
    assert checks == [
        given,
        Check("mse", 0.25, False),
        Check("allclose", 0.0, False, "allclose", 1.0, rtol=0.02, atol=0.5),
    ]
    assert parse_checks(["atol<=0.5"]) == [Check("allclose", 0.0, False, "allclose", 1.0, atol=0.5)]
    # two allclose bounds make one check; one alone keeps its place
    assert parse_checks(["rtol<=0.01", "atol<=0.5"]) == [
        Check("allclose", 0.0, False, "allclose", 1.0, rtol=0.01, atol=0.5)
    ]
    assert parse_checks(["rtol<=0.1", "sqnr>=1"]) == [
        Check("allclose", 0.0, False, "allclose", 1.0, rtol=0.1),
        Check("sqnr", 1.0, True),
    ]
    assert parse_checks([Target("cosine", 0.5)]) == [Check("cosine", 0.5, True)]
    with pytest.raises(InputError) as info:
        parse_checks([])
    assert str(info.value) == "give at least one target, e.g. cosine>=0.99"


def test_with_nodes_keeps_exactly_the_given_wide_nodes_and_drops_float_nodes_moves():
    recipe = Recipe(
        int16=frozenset({"old"}), flipped=frozenset({"a", "f"}), narrowed=frozenset({"f"}), retyped=frozenset({"f"})
    )
    moved = recipe.with_nodes({"a": "int16", "b": "int8", "f": "float"})
    assert (moved.int16, moved.float) == (frozenset({"a"}), frozenset({"f"}))
    assert (moved.flipped, moved.narrowed, moved.retyped) == (frozenset({"a"}), frozenset(), frozenset())


def test_overrides_of_wide_nodes_without_tensors_and_weights_without_an_entry():
    recipe = Recipe(int16=frozenset({"n", "quiet"}), narrowed=frozenset({"a_first", "b_second"}))
    table = recipe.overrides({"n": ["t"]}, {"b_second": ("w", 0)})
    assert table == {"t": [{"quant_type": "QUInt16"}], "w": [{"quant_type": "QInt8", "reduce_range": True}]}


def test_refusal_of_a_global_type_pair():
    from pytest_qaccuracy.analysis.recipe.space import REFUSED, refusal

    assert refusal(Recipe(activation_type="int8", weight_type="uint8"), "1.32.0") == REFUSED["int8", "uint8"]
    assert refusal(Recipe(activation_type="uint8", weight_type="uint8"), "1.32.0") is None


def test_python_snippet_without_extra_options_and_the_overrides_named_once(tmp_path, monkeypatch):
    from pytest_qaccuracy.analysis.recipe.space import python_snippet

    arguments = Recipe(int16=frozenset({"n"})).arguments({"n": ["t"]}, "c.cache")
    text = python_snippet(arguments, "m.onnx", "o.onnx", "d.npz")
    assert text.count("TensorQuantOverrides") == 1  # the call reads the table the script spells out above it
    bare = {k: v for k, v in arguments.items() if k != "extra_options"}
    ((_, kwargs),) = _run_snippet(python_snippet(bare, "m.onnx", "o.onnx", "d.npz"), tmp_path, monkeypatch)
    assert "extra_options" not in kwargs and kwargs["per_channel"] is False


@pytest.mark.parametrize(
    ("op_type", "position", "rank", "attributes", "axis"),
    [
        ("Conv", 1, 4, {}, 0),
        ("Conv", 0, 4, {}, None),
        ("Conv", 2, 1, {}, None),
        ("ConvTranspose", 1, 4, {}, 1),
        ("Gemm", 1, 2, {}, 1),
        ("Gemm", 1, 2, {"transB": 0}, 1),
        ("Gemm", 1, 2, {"transB": 1}, 0),
        ("MatMul", 1, 2, {}, 1),
        ("MatMul", 1, 3, {}, 2),
        ("Add", 1, 2, {}, None),
    ],
)
def test_weight_axis_is_the_output_channel_axis(op_type, position, rank, attributes, axis):
    from pytest_qaccuracy.analysis.recipe.edit import weight_axis

    assert weight_axis(op_type, position, rank, attributes) == axis


_ORT_BEFORE_1_19 = tuple(int(p) for p in onnxruntime.__version__.split(".")[:2]) < (1, 19)


def _ort_quantize(value, weight_type, axis, reduce_range, symmetric):
    """onnxruntime's own quantize_data, per tensor or channel by channel (as its quantizer calls it)."""
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import quantize_data

    qtype = TensorProto.INT8 if weight_type == "int8" else TensorProto.UINT8

    def one(data):  # (zero point, scale, quantized); onnxruntime < 1.20 put (rmin, rmax) first
        return quantize_data(data.reshape(-1), qtype, symmetric, reduce_range)[-3:]

    if axis is None:
        zero, scale, quantized = one(value)
        return np.asarray(quantized).reshape(value.shape), np.float32(scale), zero
    parts = [one(np.take(value, c, axis)) for c in range(value.shape[axis])]
    quantized = np.stack([np.asarray(p[2]).reshape(np.take(value, 0, axis).shape) for p in parts], axis)
    return quantized, np.array([p[1] for p in parts], np.float32), np.array([p[0] for p in parts])


@pytest.mark.parametrize("weight_type", ["int8", "uint8"])
@pytest.mark.parametrize("reduce_range", [False, True])
@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("symmetric", [None, True, False])
def test_quantize_weight_equals_onnxruntimes_quantize_data(weight_type, reduce_range, axis, symmetric):
    """Bit for bit, on channels of both signs, one positive only, one all zero and one of subnormal
    scale (their scale is 1)."""
    from pytest_qaccuracy.analysis.recipe.edit import quantize_weight

    rng = np.random.default_rng(7)
    value = rng.normal(0.0, 0.4, (4, 3, 5)).astype(np.float32)
    value[1] = np.abs(value[1]) + 0.05
    value[:, 2] = 0.0
    value[3, 0] = 0.0
    value[2, 1] = 1e-37  # a scale below float32's smallest normal: onnxruntime's scale 1, zero point 0
    ours = quantize_weight(value, weight_type, axis, reduce_range, symmetric)
    used = (weight_type == "int8" or axis is not None) if symmetric is None else symmetric
    quantized, scale, zero = _ort_quantize(value, weight_type, axis, reduce_range, used)
    assert ours[0].dtype == np.dtype(weight_type)
    ours_scale, their_scale = np.asarray(ours[1]).reshape(-1), np.asarray(scale, np.float32).reshape(-1)
    if _ORT_BEFORE_1_19:
        # onnxruntime 1.18's quantize_data differs from 1.32's in the last bits (measured: scales one
        # float32 ulp apart, up to 13 % of the weights one step apart): the estimate's bound there
        assert np.abs(ours[0].astype(np.int32) - np.asarray(quantized).astype(np.int32)).max() <= 1
        np.testing.assert_allclose(ours_scale, their_scale, rtol=2.5e-7)
    else:
        np.testing.assert_array_equal(ours[0], quantized)
        np.testing.assert_array_equal(ours_scale, their_scale)
    np.testing.assert_array_equal(np.asarray(ours[2]).reshape(-1), np.asarray(zero).reshape(-1).astype(weight_type))
    if axis is None:
        assert np.shape(ours[1]) == () and np.shape(ours[2]) == ()
    else:
        assert ours[1].shape == ours[2].shape == (value.shape[axis],)


def _gemm_pair(x_scale: float, bias: np.ndarray, per_channel: bool = False):
    """A Gemm's fp32 model and a QDQ form of it written by hand: the input's pair with ``x_scale``
    (not what its range gives, so it keeps its scale), an int8 weight per tensor, an int32 bias."""
    import onnx

    w = np.array([[0.5, -0.25], [0.125, 1.0]], np.float32)
    fp32 = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "B"], ["y"], name="gemm")],
        "fp32",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias.astype(np.float32), "B")],
    )
    w_scale = (np.abs(w).max(axis=0) / np.float32(127)).astype(np.float32) if per_channel else np.float32(1 / 127)
    b_scale = np.float32(x_scale) * w_scale
    inits = {
        "x_scale": np.float32(x_scale),
        "x_zero_point": np.uint8(128),
        "W_quantized": np.round(w / w_scale).astype(np.int8),
        "W_scale": w_scale,
        "W_zero_point": np.zeros(2, np.int8) if per_channel else np.int8(0),
        "B_quantized": np.clip(np.round(bias / b_scale), -(2**31), 2**31 - 1).astype(np.int32),
        "B_scale": np.asarray(b_scale, np.float32),
        "B_zero_point": np.zeros(2, np.int32) if per_channel else np.int32(0),
    }
    qdq = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero_point"], ["x_q"]),
            helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero_point"], ["x_dq"]),
            helper.make_node(
                "DequantizeLinear",
                ["W_quantized", "W_scale", "W_zero_point"],
                ["W_dq"],
                **({"axis": 1} if per_channel else {}),
            ),
            helper.make_node(
                "DequantizeLinear",
                ["B_quantized", "B_scale", "B_zero_point"],
                ["B_dq"],
                **({"axis": 0} if per_channel else {}),
            ),
            helper.make_node("Gemm", ["x_dq", "W_dq", "B_dq"], ["y"], name="gemm"),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    opset = [helper.make_opsetid("", 13)]
    return onnx.helper.make_model(fp32, opset_imports=opset), onnx.helper.make_model(qdq, opset_imports=opset), w


def _inits(model) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_an_activation_pair_kept_from_the_base_moves_its_zero_point_to_the_new_type():
    """The input's scale (0.5) is not what its range gives, so the edit keeps it, and only moves the
    zero point from uint8 to int8: 128 - 128 = 0 (the scale unchanged). The bias follows its scales."""
    from pytest_qaccuracy.analysis.recipe.edit import GlobalEdits

    fp32, qdq, _ = _gemm_pair(0.5, np.array([0.3, -0.7]))
    edits = GlobalEdits(qdq, Recipe(), fp32, {"x": (-1.0, 1.0)})
    assert edits.params == {} and edits.zero_points == {"x_zero_point"}
    edited = _inits(edits.model(Recipe(activation_type="int8"), {"x": (-1.0, 1.0)}))
    assert edited["x_zero_point"].dtype == np.int8 and edited["x_zero_point"] == 0
    assert edited["x_scale"] == np.float32(0.5)
    b_scale = np.float32(0.5) * np.float32(1.0 / 127)
    np.testing.assert_array_equal(edited["B_quantized"], np.round(np.array([0.3, -0.7]) / b_scale).astype(np.int32))
    assert _inits(qdq)["x_zero_point"] == 128  # the base model is not touched


def test_a_bias_beyond_int32_is_clipped_to_its_range():
    """Per-channel weights give the bias one scale per channel (x_scale times the channel's weight
    scale); a bias too large for int32 at that scale is clipped to [-2**31, 2**31 - 1], as
    onnxruntime's quantizer clips it."""
    from pytest_qaccuracy.analysis.recipe.edit import GlobalEdits

    bias = np.array([1e12, -1e12])
    fp32, qdq, w = _gemm_pair(0.5, bias)
    edits = GlobalEdits(qdq, Recipe(), fp32, {"x": (-1.0, 1.0)})
    edited = _inits(edits.model(Recipe(per_channel=True), {"x": (-1.0, 1.0)}))
    np.testing.assert_array_equal(edited["B_quantized"], np.array([2**31 - 1, -(2**31)], np.int32))
    w_scales = np.abs(w).max(axis=0) / np.float32(127)  # Gemm's weight (K, N): channels on axis 1
    np.testing.assert_array_equal(edited["B_scale"], (np.float32(0.5) * w_scales.astype(np.float32)))
    np.testing.assert_array_equal(edited["B_zero_point"], np.zeros(2, np.int32))
    assert edited["B_zero_point"].shape == (2,)


def test_per_channel_weights_made_per_tensor_lose_their_axis():
    """The base model's per-channel weight and bias (axis 1 and 0) edited to per tensor: one scale each,
    the zero points scalars, no ``axis`` left on their DequantizeLinear nodes."""
    from pytest_qaccuracy.analysis.recipe.edit import GlobalEdits

    bias = np.array([0.3, -0.7])
    fp32, qdq, w = _gemm_pair(0.5, bias, per_channel=True)
    edits = GlobalEdits(qdq, Recipe(per_channel=True), fp32, {"x": (-1.0, 1.0)})
    edited = edits.model(Recipe(), {"x": (-1.0, 1.0)})
    values = _inits(edited)
    w_scale = np.float32(np.abs(w).max() / np.float32(127))
    assert values["W_scale"] == w_scale and values["W_zero_point"].shape == ()
    np.testing.assert_array_equal(values["W_quantized"], np.round(w / w_scale).astype(np.int8))
    b_scale = np.float32(0.5) * w_scale
    assert values["B_scale"].shape == (1,) and values["B_scale"][0] == b_scale
    assert values["B_zero_point"].shape == ()
    np.testing.assert_array_equal(values["B_quantized"], np.round(bias / np.float64(b_scale)).astype(np.int32))
    axes = {n.output[0]: [a.i for a in n.attribute if a.name == "axis"] for n in edited.graph.node}
    assert axes["W_dq"] == [] and axes["B_dq"] == []
    assert [o.version for o in edited.opset_import] == [13]


def test_pairs_weights_and_biases_the_edit_cannot_place_are_left_as_written():
    """Three things a hand-written QDQ model may hold that the edit has no rule for, each kept as the
    base wrote it: an activation pair whose scale is computed (an Identity of x_scale), a weight with
    no fp32 value of its shape (the fp32 'W' renamed), and an int32 bias whose Gemm input is not
    dequantized (no input scale to requantize it by)."""
    from pytest_qaccuracy.analysis.recipe.edit import GlobalEdits

    fp32, qdq, _ = _gemm_pair(0.5, np.array([0.3, -0.7]))
    nodes = qdq.graph.node
    nodes.insert(0, helper.make_node("Identity", ["x_scale"], ["x_scale_copy"]))
    nodes[1].input[1] = "x_scale_copy"  # the QuantizeLinear's scale is computed
    nodes[2].input[1] = "x_scale_copy"
    fp32.graph.initializer[0].name = "kernel"
    fp32.graph.node[0].input[1] = "kernel"
    edits = GlobalEdits(qdq, Recipe(), fp32, {"x": (-1.0, 1.0)})
    assert edits.zero_points == set() and edits.params == {}
    assert edits.weights == [] and [b.data for b in edits.biases] == ["B_quantized"]
    before = _inits(qdq)
    edited = _inits(edits.model(Recipe(activation_type="int8", per_channel=True), {"x": (-1.0, 1.0)}))
    assert edited.keys() == before.keys()
    for name, value in before.items():
        np.testing.assert_array_equal(edited[name], value, err_msg=name)
        assert edited[name].dtype == value.dtype, name

    # the bias alone: its Gemm reads the float input, while the weight is moved to per channel
    fp32, qdq, w = _gemm_pair(0.5, np.array([0.3, -0.7]))
    qdq.graph.node[-1].input[0] = "x"
    edits = GlobalEdits(qdq, Recipe(), fp32, {"x": (-1.0, 1.0)})
    assert [b.input_scale for b in edits.biases] == [""]
    edited = _inits(edits.model(Recipe(per_channel=True), {"x": (-1.0, 1.0)}))
    np.testing.assert_array_equal(edited["W_scale"], np.abs(w).max(axis=0) / np.float32(127))  # the weight moved
    for name in ("B_quantized", "B_scale", "B_zero_point"):  # the bias did not
        np.testing.assert_array_equal(edited[name], _inits(qdq)[name], err_msg=name)


def _opset_model(imports):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in imports])


@pytest.mark.parametrize(
    ("imports", "converted"),
    [
        ([("", 12)], True),
        ([("ai.onnx", 11)], True),
        ([("com.microsoft", 1), ("", 12)], True),
        ([("", 13)], False),
        ([("", 17)], False),
        ([("com.microsoft", 1)], False),  # no default domain: nothing to convert
    ],
)
def test_at_least_opset13_converts_older_default_domains_only(imports, converted):
    from pytest_qaccuracy.analysis.recipe.edit import _at_least_opset13

    model = _opset_model(imports)
    out = _at_least_opset13(model)
    if converted:
        assert [o.version for o in out.opset_import if o.domain in ("", "ai.onnx")] == [13]
    else:
        assert out is model


def test_weight_form_turns_each_global_choice_for_a_moved_weight():
    from pytest_qaccuracy.analysis.recipe.edit import _weight_form

    users = frozenset({"conv"})
    assert _weight_form(Recipe(), users) == (False, False, "int8")
    moved = Recipe(flipped=users, narrowed=users, retyped=users)
    assert _weight_form(moved, users) == (True, True, "uint8")
    assert _weight_form(moved, frozenset({"other"})) == (False, False, "int8")
    both = Recipe(per_channel=True, reduce_range=True, weight_type="uint8", flipped=users, retyped=users)
    assert _weight_form(both, users | {"other"}) == (False, True, "int8")


def test_zero_shift_between_the_8_bit_types():
    from pytest_qaccuracy.analysis.recipe.edit import _zero_shift

    assert (_zero_shift("uint8", "int8"), _zero_shift("int8", "uint8"), _zero_shift("int8", "int8")) == (-128, 128, 0)
