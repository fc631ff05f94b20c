"""Every calibration method, per tensor and per channel, writes a model that onnxruntime runs."""

from __future__ import annotations

import numpy as np
import pytest
from corpus_helpers import MODEL_NAMES, run_cli

pytestmark = pytest.mark.corpus

METHODS = ["minmax", "moving-average", "percentile", "kl", "mse"]


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_calibrate(corpus, name, method, per_channel, tmp_path, capsys):
    entry = corpus[name]
    out = tmp_path / f"{method}.onnx"
    argv = ["calibrate", entry.fp32, "--data", entry.data("smoke"), "--method", method, "--out", out]
    argv += ["--per-channel"] if per_channel else []
    code, stdout, stderr = run_cli(argv, capsys)
    assert code == 0, stderr
    assert "Traceback" not in stderr and "[ONNXRuntimeError]" not in stderr, stderr
    assert f"with {method}" in stdout
    # the written model loads in onnxruntime and runs on the smoke record
    import onnxruntime as ort

    from pytest_qaccuracy.data import bind_dataset, load_dataset
    from pytest_qaccuracy.model.loading import graph_inputs, load_model

    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    with load_dataset(entry.data("smoke")) as dataset:
        feeds = next(bind_dataset(dataset, graph_inputs(load_model(out))).iter_records())
    outputs = session.run(None, feeds)
    assert len(outputs) == len(session.get_outputs())
    assert all(np.isfinite(o).all() for o in outputs if o.dtype.kind == "f")
