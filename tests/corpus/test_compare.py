"""compare (both captures) and report on every corpus model and quantized form."""

from __future__ import annotations

import json
import math

import onnx
import pytest
from corpus_helpers import MODEL_NAMES, VARIANTS, run_cli

pytestmark = pytest.mark.corpus


def _check_metrics(where: str, item: dict) -> None:
    """Every metric is a finite number, or None with a reason."""
    for metric, value in item["metrics"].items():
        if value is None:
            assert item["undefined"].get(metric), f"{where}: {metric} is None without a reason"
        else:
            assert math.isfinite(value), f"{where}: {metric} = {value}"


def _compare(entry, variant: str, capture: str, tmp_path, capsys) -> dict:
    out = tmp_path / "result.json"
    argv = ["compare", entry.fp32, entry.model(variant), "--data", entry.data(), "--capture", capture, "--json", out]
    if capture == "deployed":
        argv += ["--out-dir", tmp_path / "artifacts"]
    code, _, stderr = run_cli(argv, capsys)
    assert code == 0, stderr
    assert "Warning" not in stderr and "Traceback" not in stderr, stderr
    return json.loads(out.read_text())


#: QOperator models hold no Q/DQ groups, so the reference capture (optimizations off) is only run on QDQ
CASES = [(v, "deployed") for v in VARIANTS] + [(v, "reference") for v in VARIANTS if v.startswith("qdq")]


@pytest.mark.parametrize(("variant", "capture"), CASES)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_compare(corpus, name, variant, capture, tmp_path, capsys):
    """Outputs in graph order with finite metrics (or a reason), layers matched; then the deployed
    comparison's artifacts (visq, DOT, comparison JSON) and an HTML report over them."""
    entry = corpus[name]
    result = _compare(entry, variant, capture, tmp_path, capsys)
    assert result["records"] == entry.info["records"]["test"]
    assert result["capture"] == capture
    graph_outputs = [o.name for o in onnx.load(str(entry.fp32), load_external_data=False).graph.output]
    assert [o["name"] for o in result["outputs"]] == graph_outputs
    for output in result["outputs"]:
        _check_metrics(f"output {output['name']}", output)
    assert result["layers"], "no layer was matched"
    for layer in result["layers"]:
        assert set(layer["metrics"]) == set(result["outputs"][0]["metrics"])
    # pre-activations folded into a QOperator kernel stay unmatched, but most tensors have a counterpart
    assert len(result["unmatched"]["fp32"]) <= len(result["layers"]), result["unmatched"]["fp32"][:10]
    if capture == "deployed":
        artifacts = tmp_path / "artifacts"
        assert list(artifacts.glob("*.visq.json")) and list(artifacts.glob("*.dot"))
        page = tmp_path / "index.html"  # compare wrote its own report.html beside the artifacts
        code, _, stderr = run_cli(["report", artifacts, "--out", page, "--title", f"corpus {name} {variant}"], capsys)
        assert code == 0, stderr
        html = page.read_text()
        assert f"corpus {name} {variant}" in html and variant in html


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_compare_on_one_record(corpus, name, variant, tmp_path, capsys):
    """The smoke data (one record, or the few a model's fixed batch takes): every layer compared, as
    a batch of one record gives tensors a model makes without a record axis (a 0-d input's Cast)."""
    entry = corpus[name]
    out = tmp_path / "result.json"
    argv = ["compare", entry.fp32, entry.model(variant), "--data", entry.data("smoke"), "--json", out]
    code, _, stderr = run_cli(argv, capsys)
    assert code == 0, stderr
    result = json.loads(out.read_text())
    assert result["layers"], "no layer was matched"
    for layer in result["layers"]:
        _check_metrics(f"layer {layer['tensor']}", layer)
