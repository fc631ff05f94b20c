"""A pair check runs each model once over the data, and the sensitivity analysis reuses the fp32 outputs.

Every onnxruntime session the package opens is counted by the model it runs (the fp32 model, or the
quantized one and its partial experiments) with the records fed to it. A check asking for top-k,
``rtol``/``atol``, layer rules and the agreement gate feeds each model every record exactly once. The
end-of-session sensitivity analysis of a failing pair then feeds the fp32 model nothing: its outputs
come from the comparison; with no memory for them it runs the fp32 model again, with the same figures.
"""

from __future__ import annotations

import json
from collections import Counter

import onnx
import onnxruntime
import pytest

from pytest_qaccuracy.analysis import reference_cache

from .conftest import EXAMPLES

RECORDS = 300  # records in digits_test.npz
#: The fp32 model's initializers: a session with exactly these runs the fp32 model (the sensitivity's
#: float configurations of the QDQ graph carry the same weights under other names).
FP32_WEIGHTS = {t.name for t in onnx.load(str(EXAMPLES / "models" / "digits_cnn.onnx")).graph.initializer}
#: The graph name of the merged model of a pair (``runtime/reduction_graph.merge_models``).
MERGED_GRAPH = "qaccuracy_pair"

CHECKS = """
import pytest

FP32, DATA = "models/digits_cnn.onnx", "data/digits_test.npz"
CHECKED = dict(
    fp32=FP32, data=DATA, max_top1_drop=0.005, topk=3, min_top1_agreement=0.9, rtol=0.5, atol=2.0,
    max_backend_steps=0, layers=["relu* sqnr>=10"],
)


@pytest.mark.qaccuracy(quantized="models/digits_cnn.{model}.onnx", **CHECKED)
def test_pair(qaccuracy):
    qaccuracy.check()
"""


class Runs:
    """Records fed to onnxruntime, per model kind (``fp32``, ``quantized``, ``both``: the merged graph
    of the pair, one run of each model); sessions opened, per model kind."""

    def __init__(self) -> None:
        self.records: Counter[str] = Counter()
        self.sessions: Counter[str] = Counter()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = onnxruntime.InferenceSession
        runs = self

        class Counted(real):  # type: ignore[misc, valid-type]
            def __init__(self, source, *args, **kwargs) -> None:
                model = onnx.load_from_string(source) if isinstance(source, bytes) else onnx.load(source)
                weights = {t.name for t in model.graph.initializer}
                self.kind = "fp32" if weights == FP32_WEIGHTS else "quantized"  # or a partial model made of it
                if model.graph.name == MERGED_GRAPH:
                    self.kind = "both"
                if len(model.graph.node) == 1:
                    self.kind = "node"  # a probe or a fallback of one node
                runs.sessions[self.kind] += 1
                super().__init__(source, *args, **kwargs)

            def run(self, output_names, input_feed, *args, **kwargs):
                runs.records[self.kind] += len(next(iter(input_feed.values())))
                return super().run(output_names, input_feed, *args, **kwargs)

        monkeypatch.setattr(onnxruntime, "InferenceSession", Counted)

    def fed(self, model: str) -> int:
        """Records the ``fp32`` or ``quantized`` model ran, alone or in the merged graph."""
        return self.records[model] + self.records["both"]


@pytest.mark.parametrize("model", ["qdq", "qoperator"])
def test_check_with_every_measure_runs_each_model_once(digits: pytest.Pytester, monkeypatch, model: str) -> None:
    runs = Runs()
    runs.install(monkeypatch)
    digits.makepyfile(test_checks=CHECKS.replace("{model}", model))
    result = digits.runpytest("--qaccuracy-artifacts-dir=out", "--qaccuracy-sensitivity=off", "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    # both models in the merged graph, whose quantized side also gives the gate its tensors, and each
    # model alone for its outputs (fetching inner tensors changes onnxruntime's fusions, and the checks
    # read the deployed outputs); a one-node session (this machine's preset probe, once per process)
    # runs one record at most
    alone = (runs.records["fp32"], runs.records["quantized"])
    assert (alone, runs.records["both"]) == ((RECORDS, RECORDS), RECORDS)
    assert runs.records["node"] <= 1
    entry = json.loads((digits.path / "out" / "summary.json").read_text())["pairs"][0]
    tensors = entry["agreement"]["tensors"]
    assert entry["agreement"]["records"] == RECORDS and len(tensors) == 8  # 7 8-bit tensors and the output
    assert all(t["elements"] > 0 and t["mismatches"] == 0 for t in tensors)  # this preset is bit-exact
    assert [c["check"] for c in entry["checks"]].count("max_backend_steps") == 1


FAILING = """
import pytest


@pytest.mark.qaccuracy(
    fp32="models/digits_cnn.onnx", quantized="models/digits_cnn.broken.onnx", data="data/digits_test.npz",
    max_backend_steps=0,
)
def test_broken(qaccuracy):
    qaccuracy.check()
"""


def _sensitivity(digits: pytest.Pytester, monkeypatch, budget: int | None) -> tuple[Runs, dict]:
    runs = Runs()
    runs.install(monkeypatch)
    if budget is not None:
        monkeypatch.setattr(reference_cache, "REFERENCE_BUDGET", budget)
    digits.makepyfile(test_failing=FAILING)
    out = f"out{budget}"
    result = digits.runpytest(f"--qaccuracy-artifacts-dir={out}", "--qaccuracy-sensitivity-records=0")
    result.assert_outcomes(failed=1)
    entry = json.loads((digits.path / out / "summary.json").read_text())["pairs"][0]
    files = ("sensitivity", "sweep", "cumulative")
    report = {kind: json.loads((digits.path / out / entry["artifacts"][kind]).read_text()) for kind in files}
    return runs, report


def test_sensitivity_reads_the_comparisons_fp32_outputs(digits: pytest.Pytester, monkeypatch) -> None:
    runs, kept = _sensitivity(digits, monkeypatch, None)
    reused = Counter(runs.records)  # the next session's runs are counted here too
    # the comparison's pass only: the merged graph, and each model alone for its outputs as deployed
    assert reused["both"] == RECORDS and reused["fp32"] == RECORDS
    with monkeypatch.context() as patch:
        rerun, recomputed = _sensitivity(digits, patch, 0)  # nothing fits: the analysis runs the fp32 model
    # in the comparison's merged graph and alone for its outputs, then alone for each of the ranking's
    # two chunks (under its deadline: the first node and the fully quantized model, then the other
    # five, the 1 h budget leaving room for them all) and for the sweep
    assert rerun.records["both"] == RECORDS and rerun.records["fp32"] == 4 * RECORDS
    assert rerun.records["quantized"] == reused["quantized"]
    assert kept == recomputed  # the same figures either way, to the last bit


@pytest.mark.parametrize("backend", ["onnxruntime", "integer"])
def test_kept_outputs_on_either_path(digits: pytest.Pytester, monkeypatch, backend: str) -> None:
    """Without a gate: the comparison's runs (onnxruntime: the merged graph and the fp32 model alone
    for its outputs; the integer backend: the fp32 model alone) give the outputs the analysis reads;
    it runs no fp32 model of its own."""
    runs = Runs()
    runs.install(monkeypatch)
    source = FAILING.replace("    max_backend_steps=0,\n", f'    backend="{backend}",\n')
    digits.makepyfile(test_failing=source)
    result = digits.runpytest("--qaccuracy-artifacts-dir=out", "--qaccuracy-sensitivity-records=0")
    result.assert_outcomes(failed=1)
    entry = json.loads((digits.path / "out" / "summary.json").read_text())["pairs"][0]
    comparison = json.loads((digits.path / "out" / entry["artifacts"]["comparison"]).read_text())
    assert comparison["reduction"].startswith("onnxruntime:" if backend == "onnxruntime" else "numpy:")
    assert "sensitivity" in entry["artifacts"]
    # onnxruntime: the merged graph, and the fp32 model alone for its outputs as deployed
    assert runs.fed("fp32") == (2 if backend == "onnxruntime" else 1) * RECORDS
