"""Shared fixtures: small real models, quantized by onnxruntime, built once per session."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests import the model builders as `modelzoo`

import modelzoo

pytest_plugins = ["pytester"]  # tests/plugin runs real pytest sessions

# A suite started in the background of a script (`cmd &`, nohup) inherits SIGINT ignored, and so would
# every process the interrupt tests start and signal: catching it here gives the children the default.
if hasattr(signal, "SIGINT") and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

#: (format, activation type, weight type, per-channel) of each quantized variant in the zoo.
VARIANTS = {
    "qdq_u8": ("qdq", "uint8", "int8", False),
    "qdq_s8_pc": ("qdq", "int8", "int8", True),
    "qop_u8": ("qoperator", "uint8", "uint8", False),
    "qop_s8_pc": ("qoperator", "int8", "int8", True),
}


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> dict[str, Path]:
    """fp32 conv net (dynamic batch), its quantized variants, and a 12-record ONE HDF5 dataset."""
    logging.getLogger().setLevel(logging.ERROR)  # ORT's quantizer warns about pre-processing
    root = tmp_path_factory.mktemp("zoo")
    paths = {"fp32": modelzoo.conv_net(root / "net.onnx")}
    calib = modelzoo.random_inputs(8, seed=3)
    for name, (fmt, act, weight, per_channel) in VARIANTS.items():
        paths[name] = modelzoo.quantize(paths["fp32"], root / f"net.{name}.onnx", calib, fmt, act, weight, per_channel)
    paths["data"] = modelzoo.write_h5(root / "data.h5", modelzoo.random_inputs(12, seed=4))
    return paths
