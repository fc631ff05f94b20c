"""Which integer arithmetic this machine's onnxruntime uses: the ``onnxruntime`` preset, resolved.

onnxruntime's u8 x s8 kernels sum exactly in int32 on x86 CPUs with VNNI or AMX (and on ARM64, whose
other differences no preset emulates yet: docs/cpus.md), but
add neighbouring products with int16 saturation on x86 CPUs with only AVX2 or AVX512 (``pairs.py``).
The CPU flags alone do not say which kernel a given onnxruntime build dispatches to, so a probe asks
onnxruntime itself: a one-node MatMulInteger whose first pair of products, ``255 * 127 * 2 = 64770``,
fits an int32 but not an int16. The answer (``64770`` or ``32767``) names the preset. It runs once per
process (about 10 ms). ``QACCURACY_HOST_PRESET=onnxruntime-avx2`` (or ``-vnni``) overrides it, e.g.
to check on one machine what ``onnxruntime`` will mean on another.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from pytest_qaccuracy.errors import InputError, QAccuracyError

ENV_OVERRIDE = "QACCURACY_HOST_PRESET"
HOST_PRESETS = ("onnxruntime-avx2", "onnxruntime-vnni")
#: the probe's result per preset: the saturated pair, or the exact sum
_PROBE_RESULTS = {32767: "onnxruntime-avx2", 2 * 255 * 127: "onnxruntime-vnni"}
_K = 64  # a real GEMM's depth: the tiny case goes through the same packed kernel


@functools.cache
def host_preset() -> str:
    """``onnxruntime-avx2`` or ``onnxruntime-vnni``: the preset that matches this machine's onnxruntime.

    Raises:
        InputError: ``QACCURACY_HOST_PRESET`` names no host preset.
        QAccuracyError: onnxruntime answered the probe with a value that matches neither preset.
    """
    override = os.environ.get(ENV_OVERRIDE, "").strip()
    if override:
        if override not in HOST_PRESETS:
            raise InputError(f"{ENV_OVERRIDE}={override!r}: expected one of {', '.join(HOST_PRESETS)}")
        return override
    value = probe()
    try:
        return _PROBE_RESULTS[value]
    except KeyError:
        raise QAccuracyError(
            f"onnxruntime's u8 x s8 MatMulInteger gave {value} for 255*127 + 255*127 (expected 64770 with exact "
            f"int32 sums or 32767 with int16 pair saturation): set {ENV_OVERRIDE} to the preset this machine needs"
        ) from None


def probe() -> int:
    """The first output of onnxruntime's MatMulInteger on ``a = 255...``, ``b[0:2] = 127``, ``b[2:] = 0``."""
    from onnx import TensorProto, helper, numpy_helper

    from pytest_qaccuracy.ort_session import make_session

    b = np.zeros((_K, 1), np.int8)
    b[:2] = 127
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "qaccuracy_probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, _K])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
        [numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # every onnxruntime the package supports reads it
    session = make_session(model, providers=("CPUExecutionProvider",), threads=1, optimization="all")
    (y,) = session.run(None, {"a": np.full((1, _K), 255, np.uint8)})
    return int(y.reshape(-1)[0])
