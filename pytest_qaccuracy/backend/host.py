"""Which integer arithmetic this machine's onnxruntime uses: the ``onnxruntime`` preset, resolved.

onnxruntime's u8 x s8 kernels sum exactly in int32 on x86 CPUs with VNNI or AMX, but
add neighbouring products with int16 saturation on x86 CPUs with only AVX2 or AVX512 (``pairs.py``).
On ARM64 (``platform.machine()`` ``aarch64``/``arm64``) a second probe tells the kernels with the
dot-product instructions from the plain NEON ones: a one-node s8 x s8 MatMulInteger of sixteen
``(-128) * (-128)`` products, ``262144`` exactly, ``-262144`` where the NEON kernel's int16 pairs wrap
(``neon_pairs.py``).
The CPU flags alone do not say which kernel a given onnxruntime build dispatches to, so a probe asks
onnxruntime itself: a one-node MatMulInteger whose first pair of products, ``255 * 127 * 2 = 64770``,
fits an int32 but not an int16. The answer (``64770`` or ``32767``) names the preset. It runs once per
process (about 10 ms). ``QACCURACY_HOST_PRESET=onnxruntime-avx2`` (or ``-vnni``) overrides it, e.g.
to check on one machine what ``onnxruntime`` will mean on another.
"""

from __future__ import annotations

import functools
import os
import platform

import numpy as np

from pytest_qaccuracy.errors import InputError, QAccuracyError
from pytest_qaccuracy.presets import HOST_FAMILIES

ENV_OVERRIDE = "QACCURACY_HOST_PRESET"
#: the probe's result per preset: the saturated pair, or the exact sum
_PROBE_RESULTS = {32767: "onnxruntime-avx2", 2 * 255 * 127: "onnxruntime-vnni"}
#: the ARM64 probe's result per preset: exact, or eight int16 pairs of 32768 wrapped to -32768
_ARM_PROBE_RESULTS = {16 * 128 * 128: "onnxruntime-arm64", -16 * 128 * 128: "onnxruntime-arm64-neon"}
_ARM_MACHINES = ("aarch64", "arm64")
_K = 64  # a real GEMM's depth: the tiny case goes through the same packed kernel


def is_arm64() -> bool:
    """This machine (the Python process) runs ARM64 code."""
    return platform.machine().lower() in _ARM_MACHINES


@functools.cache
def host_preset() -> str:
    """The preset that matches this machine's onnxruntime: ``onnxruntime-avx2`` or ``onnxruntime-vnni`` on
    x86, ``onnxruntime-arm64`` or ``onnxruntime-arm64-neon`` on ARM64.

    Raises:
        InputError: ``QACCURACY_HOST_PRESET`` names no host preset.
        QAccuracyError: onnxruntime answered the probe with a value that matches neither preset.
    """
    override = os.environ.get(ENV_OVERRIDE, "").strip()
    if override:
        if override not in HOST_FAMILIES:
            raise InputError(f"{ENV_OVERRIDE}={override!r}: expected one of {', '.join(HOST_FAMILIES)}")
        return override
    if is_arm64():
        value = arm64_probe()
        try:
            return _ARM_PROBE_RESULTS[value]
        except KeyError:
            raise QAccuracyError(
                f"onnxruntime's s8 x s8 MatMulInteger gave {value} for sixteen (-128)*(-128) (expected 262144 with "
                f"exact sums or -262144 with wrapped int16 pairs): set {ENV_OVERRIDE} to the preset this machine needs"
            ) from None
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
    b = np.zeros((_K, 1), np.int8)
    b[:2] = 127
    return _matmul_integer(np.full((1, _K), 255, np.uint8), b)


def arm64_probe() -> int:
    """onnxruntime's s8 x s8 MatMulInteger of ``a = b = -128`` over a depth of 16 (one NEON block)."""
    return _matmul_integer(np.full((1, 16), -128, np.int8), np.full((16, 1), -128, np.int8))


def _matmul_integer(a: np.ndarray, b: np.ndarray) -> int:
    """The first output of a one-node MatMulInteger with constant ``b``, run by this machine's onnxruntime."""
    from onnx import helper, numpy_helper

    from pytest_qaccuracy.ort_session import make_session

    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "qaccuracy_probe",
        [helper.make_tensor_value_info("a", helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(np.int32)), [a.shape[0], 1])],
        [numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # every onnxruntime the package supports reads it
    session = make_session(model, providers=("CPUExecutionProvider",), threads=1, optimization="all")
    (y,) = session.run(None, {"a": a})
    return int(y.reshape(-1)[0])
