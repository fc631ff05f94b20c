"""``qaccuracy recipe`` on an onnxruntime whose quantizer takes no calibration cache (1.18): one line,
exit 2, nothing written (the rest of the recipe tests need the cache and skip there)."""

from __future__ import annotations

import numpy as np
import pytest
from onnxruntime.quantization import calibrate as ort_calibrate

from pytest_qaccuracy.cli import main
from tests.modelzoo import mlp


def test_recipe_refuses_an_onnxruntime_without_calibration_caches(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delattr(ort_calibrate, "save_tensors_data", raising=False)  # as onnxruntime 1.18 has it
    rng = np.random.default_rng(0)
    fp32 = mlp(tmp_path / "m.onnx", rng.standard_normal((8, 8)).astype(np.float32), np.eye(8, 4, dtype=np.float32))
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((6, 1, 8)).astype(np.float32))
    out = tmp_path / "out"
    args = ["recipe", str(fp32), "--data", str(tmp_path / "d.npz"), "--eval", str(tmp_path / "d.npz")]
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main([*args, "--target", "cosine>=0.99", "--out-dir", str(out)]))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the recipe search writes every recipe through onnxruntime's calibration cache")
    assert err.strip().endswith("lacks: upgrade onnxruntime to 1.27 or newer")
    assert err.strip().count("\n") == 0 and not out.exists()
