"""The recipe search on small real models: verified by onnxruntime, optimal where brute force can
tell, its arguments reproducible by a plain ``quantize_static`` call, bad input refused."""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import replace
from pathlib import Path

import modelzoo
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper, version_converter

from pytest_qaccuracy.analysis.recipe import Budget, Recipe, parse_checks, python_snippet, search_recipe
from pytest_qaccuracy.analysis.recipe.cost import CostModel, node_work
from pytest_qaccuracy.analysis.recipe.search import GLOBAL_CHOICES, cost_ordered
from pytest_qaccuracy.errors import InputError
from tests.ort_features import needs_cache

pytestmark = needs_cache

#: the chain's nodes and their work per record: MatMul MACs (16x32, 32x24, 24x10), Sigmoid elements
WORK = {"mm1": 16 * 32, "sig": 32, "mm2": 32 * 24, "mm3": 24 * 10}


def chain(path: Path) -> Path:
    """x[N,16] -> MatMul -> Sigmoid -> MatMul -> MatMul: four candidate nodes, outlier weights."""
    rng = np.random.default_rng(7)
    weights = {"w1": (16, 32), "w2": (32, 24), "w3": (24, 10)}
    inits = []
    for name, shape in weights.items():
        w = rng.standard_normal(shape).astype(np.float32) * 0.4
        w.flat[rng.integers(0, w.size, 3)] *= 12.0  # a few outliers stretch a per-tensor scale
        inits.append(numpy_helper.from_array(w, name))
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
        helper.make_node("Sigmoid", ["h1"], ["s1"], name="sig"),
        helper.make_node("MatMul", ["s1", "w2"], ["h2"], name="mm2"),
        helper.make_node("MatMul", ["h2", "w3"], ["y"], name="mm3"),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def records(count: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((count, 1, 16)).astype(np.float32)
    x[:, :, 3] *= 6.0  # one wide input channel
    return x


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("recipe")
    calib, held = records(16, 1), records(12, 2)
    return {
        "fp32": chain(root / "chain.onnx"),
        "calib": modelzoo.write_h5(root / "calib.h5", calib),
        "eval": modelzoo.write_h5(root / "eval.h5", held),
        "calib_array": calib,
        "eval_array": held,
        "root": root,
    }


def _sqnr(ref: np.ndarray, test: np.ndarray) -> float:
    noise = float(np.sum((ref.astype(np.float64) - test) ** 2))
    return np.inf if noise == 0 else 10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / noise)


def _quantize_by_hand(tiny, precisions: dict[str, str], out: Path) -> Path:
    """onnxruntime's quantize_static, called directly as a user would (MinMax on the calibration set)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    tensors = {"mm1": ["x", "h1"], "sig": ["h1", "s1"], "mm2": ["s1", "h2"], "mm3": ["h2", "y"]}
    wide = sorted({t for n, p in precisions.items() if p == "int16" for t in tensors[n]})
    quantize_static(
        str(tiny["fp32"]),
        str(out),
        modelzoo.ArrayReader("x", tiny["calib_array"]),
        quant_format=QuantFormat.QDQ,
        nodes_to_exclude=[n for n, p in precisions.items() if p == "float"],
        extra_options={"TensorQuantOverrides": {t: [{"quant_type": QuantType.QUInt16}] for t in wide}},
    )
    return out


def _held_out_sqnr(tiny, model: Path) -> float:
    x = tiny["eval_array"][:, 0]
    ref = ort.InferenceSession(str(tiny["fp32"])).run(None, {"x": x})[0]
    test = ort.InferenceSession(str(model)).run(None, {"x": x})[0]
    return _sqnr(ref, test)


def test_node_work_counts_macs_and_elements(tiny):
    work = node_work(onnx.load(str(tiny["fp32"])))
    assert work == pytest.approx(WORK)


def test_cost_order_is_nondecreasing_and_complete():
    cost = CostModel(WORK, int16=0.5, float=1.0)
    nodes = list(WORK)
    seen = list(cost_ordered(nodes, ["int8", "int16", "float"], cost))
    totals = [sum(cost.node(n, p) for n, p in zip(nodes, a, strict=True)) for a in seen]
    assert len(seen) == len(set(seen)) == 3 ** len(nodes)
    assert totals == sorted(totals)


@pytest.fixture(scope="module")
def brute_force(tiny) -> dict[tuple[str, ...], float]:
    """Every assignment of int8/int16/float to the four nodes, quantized and measured independently."""
    figures = {}
    for i, levels in enumerate(itertools.product(["int8", "int16", "float"], repeat=len(WORK))):
        model = _quantize_by_hand(tiny, dict(zip(WORK, levels, strict=True)), tiny["root"] / f"bf{i}.onnx")
        figures[levels] = _held_out_sqnr(tiny, model)
    return figures


@pytest.mark.parametrize("int16", [0.5, None], ids=["int16=0.5", "default"])
def test_search_equals_brute_force_optimum(tiny, brute_force, tmp_path, int16):
    """The search's recipe is the cheapest assignment that meets the target, and its figure is the real
    one; with the default weights (16-bit costs what float does, as on onnxruntime's CPU provider) it
    never pays for a 16-bit node."""
    nodes = list(WORK)
    figures = brute_force
    base = figures[("int8",) * 4]
    # between all-int8 and the best mixed recipe (of int8 and float only with the default weights)
    finite = [v for k, v in figures.items() if np.isfinite(v) and (int16 is not None or "int16" not in k)]
    threshold = round((base + max(finite)) / 2, 3)
    weights = {"int8": 0, "int16": 1.0 if int16 is None else int16, "float": 1.0}
    cost = {k: sum(weights[p] * WORK[n] for n, p in zip(nodes, k, strict=True)) for k in figures}
    passing = [k for k, v in figures.items() if v >= threshold]
    optimum = min(cost[k] for k in passing)
    assert optimum > 0  # the target needs some node kept wide

    result = search_recipe(
        tiny["fp32"],
        tiny["calib"],
        tiny["eval"],
        parse_checks([f"sqnr>={threshold}"]),
        vary=(),
        weights=None if int16 is None else {"int16": int16},
        model_out=tmp_path / "best.onnx",
    )
    best = result.best_step
    assert result.met and result.stopped == "done"
    assert best.cost * sum(WORK.values()) == pytest.approx(optimum)
    assert best.phase == "exhaustive"
    if int16 is None:
        assert not best.recipe.int16
        assert not any("int16" in s.change for s in result.steps)
    measured = best.measured["onnxruntime"]["y"]["sqnr"]
    assert measured == pytest.approx(_held_out_sqnr(tiny, tmp_path / "best.onnx"), rel=1e-7)
    assert measured >= threshold


def test_auto_calibration_is_a_recipe_method(tiny, tmp_path):
    """``auto`` (each tensor's range chosen by its measured effect) as a recipe's method: the search's
    ranges are auto's own, and its figure is the written model's, run by onnxruntime."""
    from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges

    result = search_recipe(
        tiny["fp32"],
        tiny["calib"],
        tiny["eval"],
        parse_checks(["sqnr>=500"]),
        start=Recipe(method="auto"),
        methods=["auto"],
        vary=(),
        budget=Budget(experiments=1),
        model_out=tmp_path / "auto.onnx",
    )
    (step,) = result.steps
    assert step.recipe.method == "auto" and step.skipped is None and not step.estimated
    expected = compute_ranges(str(tiny["fp32"]), tiny["calib"], CalibrationOptions(method="auto")).ranges
    assert result.ranges is not None and set(result.ranges) == set(expected)
    for name, (lo, hi) in expected.items():
        assert result.ranges[name] == pytest.approx((lo, hi), rel=0, abs=0)
    measured = step.measured["onnxruntime"]["y"]["sqnr"]
    assert measured == pytest.approx(_held_out_sqnr(tiny, tmp_path / "auto.onnx"), rel=1e-7)


def test_arguments_reproduce_the_model(tiny, tmp_path):
    """The JSON arguments, turned into enums and handed to quantize_static, write the same model."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from pytest_qaccuracy.report.recipe_tables import verdict_lines, write_recipe

    start = Recipe(per_channel=True, reduce_range=True)
    result = search_recipe(
        tiny["fp32"],
        tiny["calib"],
        tiny["eval"],
        parse_checks(["sqnr>=500"]),
        start=start,
        vary=(),
        budget=Budget(experiments=3),
        model_out=tmp_path / "out" / "chain.recipe.onnx",
    )
    assert not result.met and result.stopped == "budget" and len(result.steps) == 3
    out = tmp_path / "out"
    write_recipe(result, out, tiny["fp32"], tiny["calib"])
    document = json.loads((out / "chain.recipe.json").read_text())
    args = document["quantize_static"]
    args["quant_format"] = getattr(QuantFormat, args["quant_format"])
    args["activation_type"] = getattr(QuantType, args["activation_type"])
    args["weight_type"] = getattr(QuantType, args["weight_type"])
    args["calibrate_method"] = getattr(CalibrationMethod, args["calibrate_method"])
    assert document["convert_opset"] is None  # opset 17: quantized as it is
    assert not any("convert_opset" in line for line in verdict_lines(result))
    for entries in args["extra_options"]["TensorQuantOverrides"].values():
        entries[0]["quant_type"] = getattr(QuantType, entries[0]["quant_type"])
    quantize_static(str(tiny["fp32"]), str(tmp_path / "mine.onnx"), None, **args)
    ours, mine = onnx.load(str(out / "chain.recipe.onnx")), onnx.load(str(tmp_path / "mine.onnx"))
    assert ours.graph.SerializeToString() == mine.graph.SerializeToString()
    assert document["best"] == result.best and document["met"] is False


def conv12(path: Path) -> Path:
    """x[N,3,6,6] -> Conv -> Relu -> Conv, opset 12 (DequantizeLinear has no axis before 13)."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w1"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32) * 0.1, "b1"),
        numpy_helper.from_array(rng.standard_normal((2, 4, 1, 1)).astype(np.float32) * 0.5, "w2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2"),
    ]
    graph = helper.make_graph(
        nodes,
        "conv12",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 6, 6])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)]), str(path))
    return path


def _run_script(script: Path, cwd: Path) -> None:
    """Run a written recipe.py as a user would: its own process, another working folder."""
    import subprocess
    import sys

    cwd.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_opset12_per_channel_recipe_converts_first(tmp_path):
    """An opset-12 model with per-channel weights is converted to opset 13 before quantize_static: the
    JSON says so (convert_opset) and recipe.py does it, so that both rewrite the verified model; the
    arguments alone, on the opset-12 file, give a model onnxruntime refuses."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from pytest_qaccuracy.analysis.recipe.search import RecipeResult
    from pytest_qaccuracy.plugin.properties import recipe_properties
    from pytest_qaccuracy.report.recipe_tables import verdict_lines, write_recipe
    from pytest_qaccuracy.report.sensitivity_summary import recipe_brief

    rng = np.random.default_rng(5)
    fp32 = conv12(tmp_path / "conv12.onnx")
    calib = modelzoo.write_h5(tmp_path / "calib.h5", rng.standard_normal((8, 1, 3, 6, 6)).astype(np.float32))
    held = modelzoo.write_h5(tmp_path / "eval.h5", rng.standard_normal((4, 1, 3, 6, 6)).astype(np.float32))
    out = tmp_path / "out"
    result = search_recipe(
        fp32,
        calib,
        held,
        parse_checks(["sqnr>=500"]),
        start=Recipe(per_channel=True),
        vary=(),
        budget=Budget(experiments=1),
        model_out=out / "conv12.recipe.onnx",
    )
    write_recipe(result, out, fp32, calib)
    document = json.loads((out / "conv12.recipe.json").read_text())
    assert document["convert_opset"] == 13 and document["quantize_static"]["per_channel"] is True
    # said wherever the arguments go: the verdict, summary.json, JUnit properties
    assert any("convert_opset=13" in line for line in verdict_lines(result))
    assert recipe_brief({"recipe": result.to_dict()})["convert_opset"] == 13
    props = dict(recipe_properties([{"id": "p", "sensitivity": {"recipe": result.to_dict()}}]))
    assert props["qaccuracy.recipe.p.convert_opset"] == "13"
    assert RecipeResult.from_dict(result.to_dict()).convert_opset == 13
    ours = onnx.load(str(out / "conv12.recipe.onnx"))
    ort.InferenceSession(str(out / "conv12.recipe.onnx"))  # the verified model loads
    assert any(n.op_type == "DequantizeLinear" and any(a.name == "axis" for a in n.attribute) for n in ours.graph.node)
    # the JSON: convert as it says, then quantize_static with its arguments
    args = document["quantize_static"]
    args["quant_format"] = getattr(QuantFormat, args["quant_format"])
    args["activation_type"] = getattr(QuantType, args["activation_type"])
    args["weight_type"] = getattr(QuantType, args["weight_type"])
    args["calibrate_method"] = getattr(CalibrationMethod, args["calibrate_method"])
    converted = version_converter.convert_version(onnx.load(str(fp32)), document["convert_opset"])
    onnx.save(converted, str(tmp_path / "conv13.onnx"))
    quantize_static(str(tmp_path / "conv13.onnx"), str(tmp_path / "mine.onnx"), None, **args)
    mine = onnx.load(str(tmp_path / "mine.onnx"))
    assert ours.graph.SerializeToString() == mine.graph.SerializeToString()
    # without the conversion, the same arguments write a model onnxruntime refuses
    quantize_static(str(fp32), str(tmp_path / "unconverted.onnx"), None, **args)
    with pytest.raises(Exception, match="Unrecognized attribute: axis"):
        ort.InferenceSession(str(tmp_path / "unconverted.onnx"))
    # the script, run as it is from another folder, rewrites the verified model in place
    verified = (out / "conv12.recipe.onnx").read_bytes()
    (out / "conv12.recipe.onnx").unlink()
    _run_script(out / "conv12.recipe.py", tmp_path / "elsewhere")
    again = onnx.load(str(out / "conv12.recipe.onnx"))
    ort.InferenceSession(str(out / "conv12.recipe.onnx"))
    assert again.graph.SerializeToString() == onnx.load_from_string(verified).graph.SerializeToString()
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == []  # no stray files where it ran


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (["cosine>=1.5"], "no model can meet it"),
        (["mse<=-1"], "no model can meet it"),
        (["accuracy>=0.9"], "accuracy"),
        (["cosine>>0.9"], "expected METRIC>=VALUE"),
        (["sqnr>=inf"], "expected a finite bound, got inf"),
        ([], "at least one target"),
    ],
)
def test_impossible_or_malformed_targets(texts, message):
    with pytest.raises(InputError, match=message):
        parse_checks(texts)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("cosine>=0.9999999", "cosine >= 0.9999999"),  # %g would print 1: a bound no model meets
        ("sqnr>=20", "sqnr >= 20"),
        ("sqnr>=20.5", "sqnr >= 20.5"),
        ("mse<=1e-4", "mse <= 0.0001"),
        ("mse<=1.5e-12", "mse <= 1.5e-12"),
        ("max_top1_drop<=0.005", "max_top1_drop <= 0.005"),
    ],
)
def test_a_bound_is_shown_as_it_reads_back(text, shown):
    (check,) = parse_checks([text])
    assert str(check) == shown
    assert float(shown.split()[-1]) == check.value


def test_quantized_input_is_refused(tiny, zoo):
    with pytest.raises(InputError, match="already quantized"):
        search_recipe(zoo["qdq_u8"], tiny["calib"], tiny["eval"], parse_checks(["cosine>=0.99"]))
    with pytest.raises(InputError, match="qoperator model is already quantized"):
        search_recipe(zoo["qop_u8"], tiny["calib"], tiny["eval"], parse_checks(["cosine>=0.99"]))


def test_refused_recipe_is_a_listed_skip(tiny, monkeypatch):
    """A recipe whose model cannot be written is a step with its reason, and the search goes on."""
    from pytest_qaccuracy.analysis.recipe import build

    real = build.RecipeBuilder.write

    def write(self, recipe, out):
        if recipe != Recipe():  # only the starting recipe can be written
            raise InputError("onnxruntime could not quantize the model (refused for the test)")
        return real(self, recipe, out)

    monkeypatch.setattr(build.RecipeBuilder, "write", write)
    result = search_recipe(
        tiny["fp32"],
        tiny["calib"],
        tiny["eval"],
        parse_checks(["sqnr>=500"]),
        methods=["minmax"],
        budget=Budget(experiments=4),
    )
    skipped = [s for s in result.steps if s.skipped and not s.estimated]
    assert skipped and all("refused for the test" in s.skipped for s in skipped)
    # an estimate is skipped only for a pair of types onnxruntime refuses (int8 activations, uint8 weights)
    refused = [s for s in result.steps if s.skipped and s.estimated]
    assert all((s.recipe.activation_type, s.recipe.weight_type) == ("int8", "uint8") for s in refused)
    assert result.best_step.index == 0 and result.best_step.skipped is None


def _cli(tiny, out: Path, *extra: str) -> list[str]:
    return [
        "recipe", str(tiny["fp32"]), "--data", str(tiny["calib"]), "--eval", str(tiny["eval"]),
        "--out-dir", str(out), *extra,
    ]  # fmt: skip


def test_command_is_never_silent_for_the_log_interval(tiny, tmp_path, capsys, monkeypatch):
    """A step longer than the log interval (here a slow experiment, 0.3 s against 0.1 s) still gets
    lines on stderr: the heartbeat's, between the search's own."""
    import time

    from pytest_qaccuracy.analysis.recipe.search import RecipeSearch
    from pytest_qaccuracy.cli import main
    from pytest_qaccuracy.data import progress

    real = RecipeSearch.measure

    def slow(self, recipe, phase, change):
        time.sleep(0.3)
        return real(self, recipe, phase, change)

    monkeypatch.setattr(RecipeSearch, "measure", slow)
    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.1)
    main(_cli(tiny, tmp_path / "out", "--target", "sqnr>=25", "--budget", "1"))
    err = capsys.readouterr().err.splitlines()
    assert any(line.startswith("recipe: still working (") for line in err), err
    main(_cli(tiny, tmp_path / "quiet", "--target", "sqnr>=25", "--budget", "1", "-q"))
    assert capsys.readouterr().err == ""


def test_command_writes_a_recipe_that_passes(tiny, tmp_path, capsys, monkeypatch):
    """Relative paths on the command line: the written script still runs from any working folder."""
    from pytest_qaccuracy.cli import main

    monkeypatch.chdir(tiny["root"])
    out = tmp_path / "out"
    argv = ["recipe", "chain.onnx", "--data", "calib.h5", "--eval", "eval.h5", "--out-dir", os.path.relpath(out)]
    # the guided node phase: the exhaustive one verifies every global recipe per assignment (minutes)
    code = main([*argv, "--target", "sqnr>=25", "--targets", "onnxruntime,onnxruntime-avx2", "--exhaustive-nodes", "0"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    steps = [line for line in captured.err.splitlines() if line.startswith("recipe: step ")]
    document = json.loads((out / "chain.recipe.json").read_text())
    assert len(steps) == len(document["steps"])  # one progress line per finished step
    assert "recipe meets sqnr >= 25" in captured.out
    best = document["steps"][document["best"]]
    assert document["met"] and best["passed"]
    for target in ("onnxruntime", "onnxruntime-avx2"):
        assert best["measured"][target]["y"]["sqnr"] >= 25
    paths = {
        document["model_input"]: tiny["root"] / "chain.onnx",
        document["model_output"]: out / "chain.recipe.onnx",
        document["quantize_static"]["calibration_cache_path"]: out / "chain.ranges.json",
    }
    for written, expected in paths.items():
        assert Path(written).is_absolute() and os.path.samefile(written, expected)
    # the script runs as it is, in its own process, from neither the command's folder nor its own,
    # and rewrites the verified model (graph equal)
    verified = onnx.load(str(out / "chain.recipe.onnx"))
    (out / "chain.recipe.onnx").unlink()
    _run_script(out / "chain.recipe.py", tmp_path / "elsewhere")
    again = onnx.load(str(out / "chain.recipe.onnx"))
    assert again.graph.SerializeToString() == verified.graph.SerializeToString()


def test_command_best_effort_exits_1(tiny, tmp_path, capsys):
    from pytest_qaccuracy.cli import main

    out = tmp_path / "out"
    code = main(_cli(tiny, out, "--target", "sqnr>=500", "--budget", "2"))
    captured = capsys.readouterr()
    assert code == 1
    assert "no recipe met sqnr >= 500 within the search (budget reached (2 experiments))" in captured.out
    document = json.loads((out / "chain.recipe.json").read_text())
    verified = [s for s in document["steps"] if not s["estimated"]]
    assert document["met"] is False and document["stopped"] == "budget" and len(verified) == 2
    assert document["held_out"] is True and "held-out records" in captured.out
    assert any(s["estimated"] for s in document["steps"])  # the global phase ranks on estimates, listed
    assert (out / "chain.recipe.onnx").exists()


def test_command_interrupted_writes_best_so_far(tiny, tmp_path, capsys, monkeypatch):
    from pytest_qaccuracy.analysis.recipe.search import RecipeSearch
    from pytest_qaccuracy.cli import main

    real, calls = RecipeSearch.measure, []

    def measure(self, recipe, phase, change):
        calls.append(change)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, recipe, phase, change)

    monkeypatch.setattr(RecipeSearch, "measure", measure)
    out = tmp_path / "out"
    code = main(_cli(tiny, out, "--target", "sqnr>=500"))
    captured = capsys.readouterr()
    assert code == 130
    assert "interrupted; the best recipe so far is written" in captured.err
    document = json.loads((out / "chain.recipe.json").read_text())
    assert document["stopped"] == "interrupted" and sum(not s["estimated"] for s in document["steps"]) == 2
    assert (out / "chain.recipe.onnx").exists()


def test_command_interrupted_before_step_0_says_nothing_is_written(tiny, tmp_path, capsys, monkeypatch):
    """Ctrl-C while the starting recipe is built: no recipe measured, and stderr does not claim one is
    written; the out dir holds no recipe file (the JSON of the search, asked for, is written)."""
    from pytest_qaccuracy.analysis.recipe import build
    from pytest_qaccuracy.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(build.RecipeBuilder, "write", interrupted)
    out = tmp_path / "out"
    code = main(_cli(tiny, out, "--target", "sqnr>=25", "--json", str(tmp_path / "search.json")))
    captured = capsys.readouterr()
    assert code == 130
    assert "no recipe measured (interrupted)" in captured.out
    assert captured.err.splitlines()[-1] == "error: interrupted before a recipe was measured; no recipe written"
    assert "so far is written" not in captured.err
    assert not out.exists() or not any(out.iterdir())
    document = json.loads((tmp_path / "search.json").read_text())
    assert document["stopped"] == "interrupted" and document["best"] is None and document["steps"] == []


def test_command_quiet_drops_onnxruntime_calibrator_prints(tiny, tmp_path, capsys):
    """``-q`` with onnxruntime's own histogram calibrator (it prints "Number of tensors : ..."): nothing
    on stderr, and stdout holds the command's own lines only."""
    from pytest_qaccuracy.cli import main

    code = main(
        _cli(tiny, tmp_path / "out", "--target", "sqnr>=25", "--method", "ort-percentile", "--budget", "1", "-q")
    )
    captured = capsys.readouterr()
    assert code in (0, 1)
    assert captured.err == ""
    assert "Number of" not in captured.out and "histogram" not in captured.out


def test_ort_calibrator_failure_keeps_what_it_printed(tiny, monkeypatch):
    """A calibrator that fails: one error naming the model and method, with what it printed (the
    prints are otherwise dropped); nothing reaches the caller's stdout."""
    import contextlib
    import io

    from onnxruntime.quantization import calibrate

    from pytest_qaccuracy.analysis.recipe.build import ort_ranges

    class Failing:
        def collect_data(self, reader):
            print("Number of tensors : 9")
            raise RuntimeError("no histogram")

    monkeypatch.setattr(calibrate, "create_calibrator", lambda *args, **kwargs: Failing())
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), pytest.raises(InputError) as info:
        ort_ranges(tiny["fp32"], tiny["calib"], "Percentile")
    message = str(info.value)
    assert "\n" not in message and stdout.getvalue() == ""
    assert message == (
        f"{tiny['fp32']}: onnxruntime's Percentile calibrator failed (no histogram); it printed: Number of tensors : 9"
    )


def test_command_warns_when_eval_is_the_calibration_file(tiny, tmp_path, capsys):
    """``--eval`` naming the ``--data`` file (here through a symlink): one warning line on stderr, even
    with ``-q``; the verdict and the JSON say the records are not held out."""
    from pytest_qaccuracy.cli import main

    link = tmp_path / "same.h5"
    link.symlink_to(tiny["calib"])
    argv = _cli(
        tiny, tmp_path / "out", "--target", "sqnr>=25", "--budget", "1", "-q", "--json", str(tmp_path / "s.json")
    )
    argv[argv.index("--eval") + 1] = str(link)
    code = main(argv)
    captured = capsys.readouterr()
    assert code in (0, 1)
    assert captured.err.splitlines() == [
        f"warning: --eval {link} is the --data file: the evaluation records are the calibration records, not held out"
    ]
    assert "(16 records, the calibration records: not held out)" in captured.out  # 16 calibration records
    assert json.loads((tmp_path / "s.json").read_text())["held_out"] is False


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--target", "cosine>=1.5"], "no model can meet it"),
        (["--target", "bogus>=1"], "bogus"),
        (["--target", "cosine>=0.9", "--targets", "arm64"], "unknown deployment target 'arm64'"),
        (["--target", "cosine>=0.9", "--budget", "soon"], "budget 'soon'"),
        (["--target", "cosine>=0.9", "--budget", "10m,40,3"], "budget '10m,40,3': at most one number of experiments"),
        (["--target", "cosine>=0.9", "--budget", "90s,2m"], "budget '90s,2m': at most one time"),
        (["--target", "cosine>=0.9", "--methods", "magic"], "unknown calibration method 'magic'"),
        (["--target", "cosine>=0.9", "--cost", "float=x"], "cost weight"),
        (
            ["--target", "cosine>=0.9", "--activation-type", "int8", "--weight-type", "uint8"],
            "starting recipe activation_type=int8 weight_type=uint8: onnxruntime's quantize_static refuses",
        ),
    ],
)
def test_command_bad_input_is_one_error_line(tiny, tmp_path, capsys, extra, message):
    from pytest_qaccuracy.cli import main

    code = main(_cli(tiny, tmp_path / "out", *extra))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not (tmp_path / "out").exists()


def test_command_refuses_a_quantized_model(tiny, zoo, tmp_path, capsys):
    from pytest_qaccuracy.cli import main

    argv = _cli(tiny, tmp_path / "out", "--target", "cosine>=0.9")
    argv[1] = str(zoo["qdq_u8"])
    assert main(argv) == 2
    assert "already quantized; the recipe search needs the fp32 model" in capsys.readouterr().err


def _scaled_chain(path: Path) -> Path:
    """x[N,16] -> Mul by a constant -> MatMul: the constant is quantized as an activation (per tensor,
    the activation type), the MatMul's weight as a weight; the constant's DequantizeLinear comes first."""
    rng = np.random.default_rng(3)
    scale = numpy_helper.from_array(rng.uniform(0.5, 2.0, 16).astype(np.float32), "c")
    weight = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "c"], ["m"], name="mul"),
            helper.make_node("MatMul", ["m", "w"], ["y"], name="mm"),
        ],
        "scaled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [scale, weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize(
    ("activation", "weight", "per_channel"),
    [("uint8", "int8", True), ("int8", "int8", True), ("uint8", "uint8", False)],
)
def test_starting_recipe_reads_the_weights_not_other_constants(tmp_path, activation, weight, per_channel):
    """The pair's own choices, as quantize_static was called: a constant of a Mul (quantized per tensor
    with the activation type) says nothing about the weights' type or per-channel scales."""
    from pytest_qaccuracy.analysis.recipe.pair import starting_recipe

    quantized = modelzoo.quantize(
        _scaled_chain(tmp_path / "scaled.onnx"),
        tmp_path / "scaled.qdq.onnx",
        records(8, 4),
        activation=activation,
        weight=weight,
        per_channel=per_channel,
    )
    view = onnx.load(str(quantized))
    dq = [n for n in view.graph.node if n.op_type == "DequantizeLinear"]
    assert any(n.input[0].startswith("c") for n in dq)  # the Mul's constant is quantized too
    found = starting_recipe(quantized)
    assert (found.activation_type, found.weight_type, found.per_channel) == (activation, weight, per_channel)


def test_global_phase_estimates_each_recipe_once(tiny):
    """Coordinate descent over the global choices: every global recipe estimated at most once, and a
    method estimated with another's ranges (onnxruntime's MinMax calibrator: ours) reuses that row."""
    result = search_recipe(
        tiny["fp32"],
        tiny["calib"],
        tiny["eval"],
        parse_checks(["sqnr>=500"]),  # out of reach: the global phase runs to its end
        methods=["minmax", "ort-minmax", "percentile"],
        budget=Budget(experiments=2),
        vary=GLOBAL_CHOICES,  # the global phase's estimates only (not the node phase's weight flips)
    )
    rows = [s for s in result.steps if s.estimated]
    assert {s.phase for s in rows} == {"global"}
    assert len({s.recipe for s in rows}) == len(rows)
    reused = [s for s in rows if s.recipe.method == "ort-minmax"]
    assert reused
    for row in reused:
        twin = next(s for s in [result.steps[0], *rows] if s.recipe == replace(row.recipe, method="minmax"))
        assert row.change.endswith(f"(estimated as step {twin.index})") and row.seconds == 0
        assert row.margin == twin.margin  # step 0 too: its only target is this host


def test_script_of_an_ort_recipe_reads_the_calibration_head(tiny, tmp_path):
    """An ``ort-*`` recipe's script calibrates with onnxruntime on the first ``records`` of the data,
    as the pytest analysis calibrates on the first half of a pair's data: its model is the one
    quantize_static writes from those records by hand, not from all of them."""
    import runpy

    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    arguments = Recipe(method="ort-minmax").arguments({}, None)
    assert "calibration_cache_path" not in arguments
    (tmp_path / "recipe.py").write_text(
        python_snippet(arguments, str(tiny["fp32"]), "ours.onnx", str(tiny["calib"]), records=4)
    )
    runpy.run_path(str(tmp_path / "recipe.py"), run_name="__main__")
    ours = onnx.load(str(tmp_path / "ours.onnx"))

    def by_hand(calibration: np.ndarray, name: str) -> onnx.ModelProto:
        reader = modelzoo.ArrayReader("x", calibration)
        types = {"activation_type": QuantType.QUInt8, "weight_type": QuantType.QInt8}  # the recipe's
        quantize_static(str(tiny["fp32"]), str(tmp_path / name), reader, quant_format=QuantFormat.QDQ, **types)
        return onnx.load(str(tmp_path / name))

    head, whole = by_hand(tiny["calib_array"][:4], "head.onnx"), by_hand(tiny["calib_array"], "whole.onnx")
    assert ours.graph.SerializeToString() == head.graph.SerializeToString()
    assert ours.graph.SerializeToString() != whole.graph.SerializeToString()


def test_node_estimates_run_on_the_first_evaluation_records(tiny, monkeypatch):
    """``estimate_records``: the node phase's estimates read the first N *evaluation* records (as the
    answer is measured), never the calibration records."""
    from pytest_qaccuracy.analysis.recipe import estimate as estimate_module

    real, seen = estimate_module.open_session, []

    def spy(pair, data, *args, records=None, **kwargs):
        seen.append((os.fspath(data) if isinstance(data, (str, os.PathLike)) else data, records))
        return real(pair, data, *args, records=records, **kwargs)

    monkeypatch.setattr(estimate_module, "open_session", spy)
    search_recipe(
        tiny["fp32"],
        tiny["calib"],
        tiny["eval"],
        parse_checks(["sqnr>=500"]),
        methods=["minmax"],
        budget=Budget(experiments=2),
        estimate_records=3,
        exhaustive_nodes=0,  # the guided node phase: the one that estimates
        vary=(),
    )
    assert seen and all(entry == (os.fspath(tiny["eval"]), 3) for entry in seen), seen
