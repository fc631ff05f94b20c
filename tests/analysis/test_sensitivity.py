"""Node sensitivity, partial models, work reuse, sweeps and exclusion lists on real onnxruntime runs."""

from __future__ import annotations

import logging

import numpy as np
import onnxruntime as ort
import pytest

from pytest_qaccuracy.analysis.compare import compare
from pytest_qaccuracy.analysis.experiments import Experiment, ExperimentRunner
from pytest_qaccuracy.analysis.partial import QdqGraph
from pytest_qaccuracy.analysis.sensitivity import SensitivityResult, node_sensitivity, open_session, sensitivity_in
from pytest_qaccuracy.analysis.sweep import Target, sweep_in
from pytest_qaccuracy.errors import InputError, ModelError
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.report.sensitivity_tables import sensitivity_table, sweep_table
from pytest_qaccuracy.runtime import RuntimeOptions

NODES = ["conv1", "conv2", "add1", "cat1", "pool1", "conv3", "sig1", "gap", "flat", "gemm", "matmul"]


def _run(model, x):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.fixture(scope="module")
def pair(zoo) -> ModelPair:
    return ModelPair(zoo["fp32"], zoo["qdq_u8"])


def test_quantized_nodes_and_their_edges(pair):
    qg = QdqGraph(pair.quantized, pair.fp32)
    assert [n.name for n in qg.nodes] == NODES
    conv1 = qg.node("conv1")
    assert len(conv1.weights) == 2 and len(conv1.inputs) == 1  # weight + bias, input x
    assert len(conv1.outputs) == 3  # relu1 feeds conv2, add1 and cat1 through its pair
    assert qg.node("matmul").outputs == {(-1, 0)}  # the graph output comes out of a DequantizeLinear
    assert not qg.unremovable


@pytest.mark.parametrize("variant", ["qdq_u8", "qdq_s8_pc"])
def test_no_edges_is_the_fp32_model_and_all_edges_the_quantized_model(zoo, variant):
    """Removing every pair restores the folded Relu and the fp32 weights; keeping all changes nothing."""
    pair = ModelPair(zoo["fp32"], zoo[variant])
    qg = QdqGraph(pair.quantized, pair.fp32)
    x = np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(qg.build(frozenset()), x), _run(pair.fp32, x), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(_run(qg.build(qg.all_edges), x), _run(pair.quantized, x))
    # one node's pairs only: differs from both
    single = _run(qg.build(qg.node("conv3").edges()), x)
    assert not np.array_equal(single, _run(pair.fp32, x))


@pytest.mark.parametrize("mode", ["single", "leave-one-out"])
@pytest.mark.parametrize("granularity", ["node", "weight", "activation"])
def test_reuse_gives_the_naive_results(pair, zoo, mode, granularity):
    options = RuntimeOptions(batch_size=5, threads=2)  # reuse runs two experiment sessions side by side
    fast = node_sensitivity(pair, zoo["data"], mode, granularity, "cosine,mse,sqnr", options=options)
    slow = node_sensitivity(pair, zoo["data"], mode, granularity, "cosine,mse,sqnr", options=options, strategy="naive")
    assert [n.node for n in fast.nodes] == [n.node for n in slow.nodes]
    for a, b in zip(fast.nodes, slow.nodes, strict=True):
        for metric in ("cosine", "mse", "sqnr"):
            assert a.metrics[metric] == pytest.approx(b.metrics[metric], rel=1e-9, abs=1e-12), (a.node, metric)
    assert fast.baseline == pytest.approx(slow.baseline)


def test_single_node_matches_onnxruntime_quantizing_only_that_node(pair, zoo, tmp_path):
    """An independent golden: ORT's quantize_static(nodes_to_quantize=[matmul]) on the zoo's calibration data
    puts exactly matmul's pairs (its input, weight and output) into the model, with the same ranges."""
    import modelzoo

    logging.getLogger().setLevel(logging.ERROR)
    only = modelzoo.quantize(
        zoo["fp32"], tmp_path / "only.onnx", modelzoo.random_inputs(8, seed=3), nodes_to_quantize=["matmul"]
    )
    expected = compare(ModelPair(zoo["fp32"], only), zoo["data"], "cosine,mse", capture="reference", layers=False)
    result = node_sensitivity(pair, zoo["data"], "single", metrics="cosine,mse", nodes=["matmul"])
    (node,) = result.nodes
    # compare() dequantizes the output's integer tensor in numpy: agreement to float32 rounding
    assert node.metrics["mse"] == pytest.approx(expected.outputs[0].metrics["mse"], rel=1e-4)
    assert node.metrics["cosine"] == pytest.approx(expected.outputs[0].metrics["cosine"], abs=1e-9)
    assert node.metrics["mse"] > 0


def test_baseline_is_the_whole_quantized_model(pair, zoo):
    result = node_sensitivity(pair, zoo["data"], metrics="mse", nodes=["gemm"])
    whole = compare(pair, zoo["data"], "mse", capture="reference", layers=False)
    assert result.baseline["mse"] == pytest.approx(whole.outputs[0].metrics["mse"], rel=1e-4)


def test_a_damaged_node_ranks_first_in_both_modes_and_is_the_suggested_exclusion(zoo, damaged):
    pair = ModelPair(zoo["fp32"], damaged)
    session = open_session(pair, zoo["data"], "cosine,mse")
    try:
        single = sensitivity_in(session, "single")
        loo = sensitivity_in(session, "leave-one-out")
        weights = sensitivity_in(session, "single", "weight")
        activations = sensitivity_in(session, "single", "activation")
        sweep = sweep_in(session, single, max_excluded=3, target=Target("cosine", 0.999))
    finally:
        session.close()
    assert single.ranked()[0].node == "conv3" and single.ranked()[0].metrics["cosine"] < 0.99
    assert loo.ranked()[0].node == "conv3" and loo.ranked()[0].metrics["cosine"] > 0.999
    assert weights.ranked()[0].node == "conv3"
    conv3_act = next(n for n in activations.nodes if n.node == "conv3")
    assert conv3_act.metrics["cosine"] > 0.999  # its activations are fine: the damage is in the weight
    assert sweep.steps[0].metrics["cosine"] == pytest.approx(single.baseline["cosine"])
    assert sweep.steps[1].excluded == ["conv3"]
    assert sweep.suggestion == ["conv3"]
    assert sweep.nodes_to_exclude() == "nodes_to_exclude=['conv3']"
    table = sensitivity_table(single, top=3)
    assert table.splitlines()[3].split()[:3] == ["1", "conv3", "Conv"] and "8 more node(s)" in table
    assert "nodes_to_exclude=['conv3']" in sweep_table(sweep)


def test_unreachable_target_gives_no_suggestion(zoo, damaged):
    pair = ModelPair(zoo["fp32"], damaged)
    session = open_session(pair, zoo["data"], "cosine")
    try:
        ranking = sensitivity_in(session, "single", nodes=["gemm", "matmul"])  # conv3 never excluded
        sweep = sweep_in(session, ranking, target=Target("cosine", 0.999))
    finally:
        session.close()
    assert [s.k for s in sweep.steps] == [0, 1, 2]
    assert sweep.suggestion is None and "no exclusion list" in sweep.nodes_to_exclude()


def test_result_round_trips_through_json(pair, zoo):
    result = node_sensitivity(pair, zoo["data"], "leave-one-out", metrics="cosine,mse")
    again = SensitivityResult.from_dict(result.to_dict())
    assert again == result
    entry = result.to_dict()["nodes"][0]
    assert set(entry) >= {"node", "op_type", "metrics"} and set(entry["metrics"]) == {"cosine", "mse"}


def test_packed_sessions_handle_many_experiments(pair, zoo, monkeypatch):
    """Packing and memory limits change how experiments share sessions and passes, never their numbers."""
    from pytest_qaccuracy.analysis import experiments

    qg = QdqGraph(pair.quantized, pair.fp32)
    session = open_session(pair, zoo["data"], "mse")
    exps = [Experiment(n.name, n.edges()) for n in qg.nodes]
    try:
        small = session.runner.run(exps, "float")
        monkeypatch.setattr(experiments, "SESSION_NODES", 100000)
        runner = ExperimentRunner(
            session.qgraph, pair.fp32, pair.output_pairs(), session.runner.data, ["mse"], session.runner.options
        )
        big = runner.run(exps, "float")
        assert runner.sessions_built == 1 and runner.rounds == 1
        monkeypatch.setattr(experiments, "SESSION_NODES", 1)  # one experiment per pack
        monkeypatch.setattr(experiments, "SESSION_BYTES", 1)  # one pack alive at a time: a pass per pack
        runner = ExperimentRunner(
            session.qgraph, pair.fp32, pair.output_pairs(), session.runner.data, ["mse"], session.runner.options
        )
        rounds = runner.run(exps, "float")
        assert runner.rounds == runner.sessions_built == len(exps)
    finally:
        session.close()
    expected = [r["logits"]["mse"] for r in small]
    assert [r["logits"]["mse"] for r in big] == pytest.approx(expected, rel=1e-9)
    assert [r["logits"]["mse"] for r in rounds] == pytest.approx(expected, rel=1e-9)


def test_qoperator_models_are_refused_with_a_clear_message(zoo):
    pair = ModelPair(zoo["fp32"], zoo["qop_u8"])
    with pytest.raises(ModelError, match=r"needs a QDQ model .* this model is qoperator"):
        node_sensitivity(pair, zoo["data"])


def test_bad_arguments_name_what_is_wrong(pair, zoo):
    with pytest.raises(InputError, match="unknown mode 'both'"):
        node_sensitivity(pair, zoo["data"], mode="both")
    with pytest.raises(InputError, match="no quantized node 'nope'"):
        node_sensitivity(pair, zoo["data"], nodes=["nope"])
    with pytest.raises(InputError, match="cosine is better when higher"):
        Target.parse("cosine<=0.9")
    assert Target.parse("mse<=1e-4") == Target("mse", 1e-4)


def test_analyse_pair_on_the_first_records_equals_a_file_of_those_records(zoo, damaged, tmp_path):
    """``records=5`` analyses exactly the first five records: the same numbers as a file holding only them."""
    import modelzoo

    from pytest_qaccuracy.analysis.sensitivity_report import analyse_pair

    pair = ModelPair(zoo["fp32"], damaged)
    five = modelzoo.write_h5(tmp_path / "five.h5", [r for _, r in zip(range(5), _zoo_records(zoo), strict=False)])
    sample = analyse_pair(pair, zoo["data"], "cosine", records=5, cumulative=False)
    alone = analyse_pair(pair, five, "cosine", cumulative=False)
    whole = analyse_pair(pair, zoo["data"], "cosine", cumulative=False)
    assert sample.sensitivity.records == 5 and whole.sensitivity.records > 5
    assert sample.sensitivity.to_dict()["nodes"] == alone.sensitivity.to_dict()["nodes"]
    assert sample.sensitivity.to_dict()["nodes"] != whole.sensitivity.to_dict()["nodes"]


def _zoo_records(zoo):
    from pytest_qaccuracy.data import load_dataset

    with load_dataset(zoo["data"]) as ds:
        return [r["0"] for r in ds.iter_records()]


def test_analyse_pair_gives_the_summary_lines_and_files(zoo, damaged, tmp_path):
    from pytest_qaccuracy.analysis.sensitivity_report import analyse_pair
    from pytest_qaccuracy.report.sensitivity_tables import report_lines, write_report

    report = analyse_pair(ModelPair(zoo["fp32"], damaged), zoo["data"], "cosine,mse", target="cosine>=0.999")
    lines = report_lines(report, top=3)
    assert lines[3].split()[:2] == ["1", "conv3"] and lines[-1] == "target cosine >= 0.999: nodes_to_exclude=['conv3']"
    names = sorted(p.name for p in write_report(report, tmp_path))
    assert names == sorted(f"net.damaged.{k}.json" for k in ("cumulative", "cumulative.chart", "sensitivity", "sweep"))
    assert set(report.to_dict()) == {"schema_version", "stem", "sensitivity", "sweep", "cumulative"}
    qop = analyse_pair(ModelPair(zoo["fp32"], zoo["qop_u8"]), zoo["data"])
    assert qop.sensitivity is None and "needs a QDQ model" in report_lines(qop)[0]
    assert write_report(qop, tmp_path / "q") == []


def test_a_model_with_a_fixed_batch_of_one(zoo, tmp_path):
    """Weights' DequantizeLinear outputs have no record axis: they are recomputed, never sliced from the cache."""
    import modelzoo

    logging.getLogger().setLevel(logging.ERROR)
    fp32 = modelzoo.conv_net(tmp_path / "one.onnx", batch=1)
    quant = modelzoo.quantize(fp32, tmp_path / "one.qdq.onnx", modelzoo.random_inputs(4))
    pair = ModelPair(fp32, quant)
    options = RuntimeOptions(batch_size=3)
    fast = node_sensitivity(pair, zoo["data"], "leave-one-out", metrics="mse", options=options)
    slow = node_sensitivity(pair, zoo["data"], "leave-one-out", metrics="mse", options=options, strategy="naive")
    assert [n.metrics["mse"] for n in fast.nodes] == pytest.approx([n.metrics["mse"] for n in slow.nodes], rel=1e-9)


RSS_SCRIPT = """
import resource, sys, logging
sys.path.insert(0, sys.argv[1])
logging.disable(logging.WARNING)
from pytest_qaccuracy.analysis.sensitivity import node_sensitivity
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.runtime import RuntimeOptions
pair = ModelPair(sys.argv[2], sys.argv[3])
node_sensitivity(pair, sys.argv[4], "leave-one-out", metrics="cosine", options=RuntimeOptions(batch_size=4))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_sensitivity_memory_is_flat_in_the_number_of_records(tmp_path):
    """16 vs 400 records of 3x64x64: peak RSS must not follow (the data alone grows by 19 MB)."""
    import subprocess
    import sys
    from pathlib import Path

    import h5py
    import modelzoo

    logging.getLogger().setLevel(logging.ERROR)
    rng = np.random.default_rng(0)
    fp32 = modelzoo.conv_net(tmp_path / "big.onnx", size=64)
    calib = rng.standard_normal((4, 1, 3, 64, 64)).astype(np.float32)
    quant = modelzoo.quantize(fp32, tmp_path / "big.qdq.onnx", calib)
    peak = {}
    for count in (16, 400):
        data = tmp_path / f"d{count}.h5"
        with h5py.File(data, "w") as f:
            for i in range(count):
                f.create_dataset(f"value/{i}/0", data=rng.standard_normal((3, 64, 64)).astype(np.float32))
        root = Path(__file__).resolve().parents[2]
        args = [sys.executable, "-c", RSS_SCRIPT, str(root), str(fp32), str(quant), str(data)]
        out = subprocess.run(args, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        peak[count] = int(out.stdout.strip().splitlines()[-1])
    grown_mb = (peak[400] - peak[16]) / 1024
    assert grown_mb < 8, f"peak RSS grew by {grown_mb:.1f} MB from 16 to 400 records"


def test_open_session_samples_records_and_closes_only_what_it_opened(zoo, monkeypatch):
    import pytest_qaccuracy.analysis.sensitivity as sensitivity
    from pytest_qaccuracy.errors import DataError

    closed: list[str] = []
    real = sensitivity.load_dataset

    def spy(path):
        dataset = real(path)
        close = dataset.close
        dataset.close = lambda: closed.append(dataset.name) or close()
        return dataset

    monkeypatch.setattr(sensitivity, "load_dataset", spy)
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    with pytest.raises(DataError, match="a sample needs at least 1 record, got 0"):
        sensitivity.open_session(pair, zoo["data"], records=0)
    assert closed == ["data.h5"]  # opened here, closed on the error path
    with sensitivity.open_session(pair, zoo["data"], records=5) as session:
        assert session.records == 5
    assert closed == ["data.h5", "data.h5"]
