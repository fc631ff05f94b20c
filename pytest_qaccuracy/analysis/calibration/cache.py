"""Quantized models calibrated once and kept by content: a test session calibrates a pair's model,
and the next session with the same inputs reuses it.

The key is the sha256 of everything the model is made from: the fp32 model's bytes, the dataset's
bytes (every file of a ``.npy`` folder, by relative path), the calibration options, the nodes kept
in float, and the versions of this package, onnxruntime, onnx and numpy (a new quantizer may write
another model). The model and the calibration result (``<key>.json``, as ``--json`` writes it) are
written atomically, so two processes calibrating the same model at once (pytest-xdist workers) both
leave a whole file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from pytest_qaccuracy.analysis.calibration.calibrator import calibrate
from pytest_qaccuracy.analysis.calibration.options import CalibrationOptions
from pytest_qaccuracy.atomic import atomic_write_json
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.runtime import RuntimeOptions

CHUNK = 1 << 20


def _digest_file(digest: hashlib._Hash, path: Path) -> None:
    with path.open("rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)


#: bumped whenever a method's answer changes (2: auto's ort-percentile became onnxruntime's exact
#: percentile histogram; 3: auto replaces min/max only with a choice better on most records), so that
#: a cache written by an older release is not taken for this one's
ALGORITHM = 3


def content_key(fp32: Path, data: Path, calibration: CalibrationOptions, nodes_to_exclude: Sequence[str] = ()) -> str:
    """The sha256 (hex) of the inputs of a calibrated model (module docstring)."""
    from importlib.metadata import version

    import numpy
    import onnx
    import onnxruntime

    digest = hashlib.sha256()
    for path in (fp32, data):
        if not path.exists():
            raise InputError(f"{path}: not found")
    _digest_file(digest, fp32)
    files = sorted(p for p in data.rglob("*") if p.is_file()) if data.is_dir() else [data]
    for path in files:
        digest.update(str(path.relative_to(data) if data.is_dir() else path.name).encode())
        _digest_file(digest, path)
    versions = [version("pytest-qaccuracy"), onnxruntime.__version__, onnx.__version__, numpy.__version__]
    settings = [dataclasses.asdict(calibration), list(nodes_to_exclude), versions, ALGORITHM]
    digest.update(json.dumps(settings).encode())  # plain JSON values in a fixed order
    return digest.hexdigest()


def calibrated_model(
    fp32: str | os.PathLike[str],
    data: str | os.PathLike[str],
    folder: str | os.PathLike[str],
    calibration: CalibrationOptions | None = None,
    options: RuntimeOptions | None = None,
    nodes_to_exclude: Sequence[str] = (),
) -> tuple[Path, bool]:
    """The QDQ model calibrated from ``fp32`` on ``data``, kept in ``folder`` under its content key,
    and whether it was made now (False: an earlier run's file was reused)."""
    calibration = calibration or CalibrationOptions()
    fp32, data, folder = Path(fp32), Path(data), Path(folder)
    key = content_key(fp32, data, calibration, nodes_to_exclude)
    model = folder / f"{fp32.stem}.{calibration.method}.{key[:16]}.onnx"
    if model.is_file():
        return model, False
    folder.mkdir(parents=True, exist_ok=True)
    result = calibrate(fp32, data, model, calibration, options, nodes_to_exclude or None)
    atomic_write_json(model.with_suffix(".json"), result.to_dict())
    return model, True
