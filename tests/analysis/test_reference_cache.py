"""The fp32 values a comparison keeps for the sensitivity analysis, under a memory budget.

An analysis given a :class:`ReferenceCache` reads the fp32 model's values from it: kept batches as
kept, the others computed exactly as the comparison computed them. The reports must be equal to the
last bit whether everything fitted, nothing fitted, or only some records were kept; the kept bytes
never exceed the budget shared by all caches; and an analysis whose batches were all kept never runs
the fp32 model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from pytest_qaccuracy.analysis.compare import compare
from pytest_qaccuracy.analysis.experiments import ExperimentRunner
from pytest_qaccuracy.analysis.reference_cache import ReferenceBudget, ReferenceCache
from pytest_qaccuracy.analysis.sensitivity_report import analyse_pair
from pytest_qaccuracy.data import bind_dataset, load_dataset
from pytest_qaccuracy.data.binding import Batch
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.runtime import RuntimeOptions

EXAMPLES = Path(__file__).resolve().parents[2] / "example_suites"
BROKEN = ModelPair(EXAMPLES / "models" / "digits_cnn.onnx", EXAMPLES / "models" / "digits_cnn.broken.onnx")
DATA = EXAMPLES / "data" / "digits_test.npz"
OPTIONS = RuntimeOptions(batch_size=8)
LOGITS_BYTES = 8 * 10 * 4  # one batch of the digits model's output: 8 records x 10 float32


def _filled(pair: ModelPair, data, names, budget=None, records=None, backend="integer") -> ReferenceCache:
    """A cache filled by a comparison; by default the quantized model on the integer backend, so that
    the pass runs the fp32 model on its own session (on onnxruntime it runs in the merged graph)."""
    cache = ReferenceCache(names, budget, records)
    compare(pair, data, "cosine", OPTIONS, backend=backend, reference=cache)
    return cache


def _no_fp32_runs(monkeypatch) -> None:
    def refuse(self):
        raise AssertionError("the analysis ran the fp32 model")

    monkeypatch.setattr(ExperimentRunner, "fp32_runner", property(refuse))


@pytest.mark.parametrize("backend", ["integer", "onnxruntime"])
@pytest.mark.parametrize("mode", ["single", "leave-one-out"])
def test_kept_and_recomputed_references_give_the_same_report(monkeypatch, mode: str, backend: str) -> None:
    """On onnxruntime the comparison runs the merged graph of both models: its fp32 outputs are kept
    too, and equal what the whole-tensor pass's fp32 session computes again."""
    kept = _filled(BROKEN, DATA, ["logits"], backend=backend)
    none = _filled(BROKEN, DATA, ["logits"], budget=0, backend=backend)
    assert kept.held_batches == 38 and kept.nbytes == 37 * LOGITS_BYTES + 4 * 10 * 4  # 300 records
    assert none.overflowed and none.held_batches == 0 and none.nbytes == 0
    recomputed = analyse_pair(BROKEN, DATA, "cosine", mode, "cosine>=0.999", options=OPTIONS, reference=none)
    with monkeypatch.context() as patch:
        _no_fp32_runs(patch)
        reused = analyse_pair(BROKEN, DATA, "cosine", mode, "cosine>=0.999", options=OPTIONS, reference=kept)
    assert reused.to_dict() == recomputed.to_dict()
    assert kept.recomputed == 0 and none.recomputed == 2 * 38  # the ranking's pass and the sweep's
    assert reused.sensitivity.ranked()[0].node == "conv1"  # the broken node, as without a cache


def test_records_limit_keeps_the_first_batches_only() -> None:
    part = _filled(BROKEN, DATA, ["logits"], records=20)  # batches 0-7 and 8-15; 16-23 crosses 20
    assert part.held_batches == 2 and part.nbytes == 2 * LOGITS_BYTES
    none = _filled(BROKEN, DATA, ["logits"], budget=0)
    reused = analyse_pair(BROKEN, DATA, "cosine", options=OPTIONS, records=20, reference=part)
    recomputed = analyse_pair(BROKEN, DATA, "cosine", options=OPTIONS, records=20, reference=none)
    assert reused.to_dict() == recomputed.to_dict() and reused.sensitivity.records == 20
    assert part.recomputed == 1  # the ranking's batch 16-19 (no target: no sweep)


def test_budget_is_shared_and_released() -> None:
    budget = ReferenceBudget(40 * LOGITS_BYTES)  # more than one pass of 38 batches, less than two
    first = _filled(BROKEN, DATA, ["logits"], budget)
    second = _filled(BROKEN, DATA, ["logits"], budget)
    assert first.held_batches == 38 and not first.overflowed
    assert second.overflowed and second.held_batches == 0  # dropped what it held past the budget
    assert budget.used == first.nbytes <= budget.limit
    first.release()
    assert budget.used == 0 and first.held_batches == 0
    third = _filled(BROKEN, DATA, ["logits"], budget)
    assert third.held_batches == 38 and budget.used == third.nbytes


def test_kept_values_are_the_comparisons_fp32_outputs() -> None:
    cache = _filled(BROKEN, DATA, ["logits"])
    with np.load(DATA) as archive:
        records = [{"x": archive["x"][i : i + 1]} for i in range(8, 16)]
    fresh = cache.values(Batch(8, records[:3]))  # not a kept batch: computed as the comparison computes it
    kept = cache.values(Batch(8, records))
    assert kept["logits"].shape == (8, 10) and set(kept) == {"logits"}
    assert set(fresh) >= {"logits", "relu1"}  # the comparison's fp32 run: outputs and matched layers
    session = onnxruntime.InferenceSession(str(BROKEN.fp32_path), providers=["CPUExecutionProvider"])
    alone = session.run(["logits"], {"x": np.concatenate([r["x"] for r in records])})[0]
    np.testing.assert_allclose(kept["logits"], alone, rtol=1e-5, atol=1e-5)  # the fp32 model's outputs
    np.testing.assert_allclose(fresh["logits"], alone[:3], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["qdq_u8", "qdq_s8_pc", "qop_u8", "qop_s8_pc"])
def test_merged_graph_outputs_equal_the_recomputed_ones(zoo, variant: str) -> None:
    pair = ModelPair(zoo["fp32"], zoo[variant])
    outputs = [f for f, _ in pair.output_pairs()]
    kept, none = ReferenceCache(outputs), ReferenceCache(outputs, budget=0)
    assert compare(pair, zoo["data"], "cosine", OPTIONS, reference=kept).reduction.startswith("onnxruntime")
    compare(pair, zoo["data"], "cosine", OPTIONS, reference=none)
    assert kept.held_batches == 2  # 12 records: 0-7 and 8-11
    with load_dataset(zoo["data"]) as dataset:
        for batch in bind_dataset(dataset, pair.inputs).iter_batches(8):
            held, fresh = kept.values(batch), none.values(batch)
            assert all(np.array_equal(held[o], fresh[o]) for o in outputs)  # to the last bit
    assert kept.recomputed == 0 and none.recomputed == 2


def test_a_layer_target_reads_the_kept_activation(zoo, monkeypatch) -> None:
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    layers = [m.fp32 for m in pair.matching.matches]
    assert "pool1" in layers
    kept, none = _filled(pair, zoo["data"], layers), _filled(pair, zoo["data"], layers, budget=0)
    recomputed = analyse_pair(pair, zoo["data"], "cosine", outputs=["pool1"], options=OPTIONS, reference=none)
    with monkeypatch.context() as patch:
        _no_fp32_runs(patch)
        reused = analyse_pair(pair, zoo["data"], "cosine", outputs=["pool1"], options=OPTIONS, reference=kept)
    assert reused.to_dict() == recomputed.to_dict() and reused.sensitivity.measured_at == ["pool1"]
    assert kept.recomputed == 0 and none.recomputed > 0


def test_a_cache_without_the_measured_tensor_is_not_used(zoo) -> None:
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    outputs = _filled(pair, zoo["data"], [f for f, _ in pair.output_pairs()])
    assert not outputs.covers(["pool1"])
    alone = analyse_pair(pair, zoo["data"], "cosine", outputs=["pool1"], options=OPTIONS, cumulative=False)
    given = analyse_pair(
        pair, zoo["data"], "cosine", outputs=["pool1"], options=OPTIONS, reference=outputs, cumulative=False
    )
    assert given.to_dict() == alone.to_dict()  # the analysis ran its own fp32 model, as without a cache
