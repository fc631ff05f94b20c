"""The emulated integer backend, every preset, on the QDQ and QOperator forms of every model."""

from __future__ import annotations

import json
import math

import pytest
from corpus_helpers import MODEL_NAMES, run_cli

from pytest_qaccuracy.backend.scheme import preset_names

pytestmark = pytest.mark.corpus


@pytest.mark.parametrize("variant", ["qdq_u8s8", "qop_u8s8"])
@pytest.mark.parametrize("preset", preset_names())
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_integer_backend(corpus, name, preset, variant, tmp_path, capsys):
    """The quantized model on the integer backend against fp32: outputs with finite metrics or a reason."""
    entry = corpus[name]
    out = tmp_path / "result.json"
    argv = ["compare", entry.fp32, entry.model(variant), "--data", entry.data("smoke"), "--scheme", preset]
    code, _, stderr = run_cli([*argv, "--outputs-only", "--metrics", "cosine,sqnr", "--json", out], capsys)
    assert code == 0, stderr
    assert "Traceback" not in stderr and "Warning" not in stderr, stderr
    result = json.loads(out.read_text())
    assert result["backend"] == "integer"
    for output in result["outputs"]:
        for metric, value in output["metrics"].items():
            assert (value is not None and math.isfinite(value)) or output["undefined"].get(metric), output
