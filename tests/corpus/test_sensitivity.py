"""Sensitivity (single and leave-one-out, at the outputs and at a layer), cumulative error and sweeps."""

from __future__ import annotations

import json
import math

import pytest
from corpus_helpers import MODEL_NAMES, layer_of, quantized_nodes, run_cli, spread

pytestmark = pytest.mark.corpus

RECORDS = 2  # each node costs a run per record: two keep the corpus within minutes


def _sensitivity(entry, argv: list[object], tmp_path, capsys, codes=(0,)) -> dict:
    out = tmp_path / "sensitivity.json"
    base = ["sensitivity", entry.fp32, entry.model("qdq_u8s8"), "--data", entry.data(), "--records", RECORDS]
    code, _, stderr = run_cli([*base, *argv, "--json", out], capsys)
    assert code in codes, stderr
    assert "Traceback" not in stderr, stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("at", ["outputs", "layer"])
@pytest.mark.parametrize("mode", ["single", "leave-one-out"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_node_sensitivity(corpus, name, mode, at, tmp_path, capsys):
    """Four nodes spread over the graph (before the layer, when measuring at one), ranked with a metric each."""
    entry = corpus[name]
    if at == "layer":
        layer, nodes = layer_of(entry)
        extra = ["--output", layer]
    else:
        nodes, extra = spread(quantized_nodes(entry.model("qdq_u8s8")), 4), []
    result = _sensitivity(entry, ["--mode", mode, "--nodes", ",".join(nodes), *extra], tmp_path, capsys)
    sensitivity = result["sensitivity"]
    assert sensitivity["mode"] == mode and sensitivity["records"] == RECORDS
    assert sorted(n["node"] for n in sensitivity["nodes"]) == sorted(nodes)
    for node in sensitivity["nodes"]:
        value = node["metrics"]["cosine"]
        assert value is not None and math.isfinite(value), node
    if at == "layer":
        assert sensitivity["measured_at"], "the layer is not named in the result"


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_cumulative(corpus, name, tmp_path, capsys):
    """The error layer by layer: one value per quantized node on the fully quantized curve."""
    entry = corpus[name]
    cumulative = _sensitivity(entry, ["--mode", "cumulative"], tmp_path, capsys)["cumulative"]
    curve = cumulative["curves"][0]
    assert curve["label"] == "fully quantized"
    assert len(curve["values"]) == len(cumulative["nodes"]) > 0
    assert all(v is None or math.isfinite(v) for v in curve["values"])


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_sweep(corpus, name, tmp_path, capsys):
    """Keep the 0..2 worst of four nodes in float; exit 1 when no step meets the target, never an error."""
    entry = corpus[name]
    nodes = spread(quantized_nodes(entry.model("qdq_u8s8")), 4)
    argv = ["--nodes", ",".join(nodes), "--sweep", 2, "--target", "cosine>=0.9999"]
    sweep = _sensitivity(entry, argv, tmp_path, capsys, codes=(0, 1))["sweep"]
    assert [len(step["excluded"]) for step in sweep["steps"]] == [0, 1, 2]
