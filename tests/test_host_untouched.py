"""A polite library: importing the plugin and running a pair leave the host process as it was.

Checked in a fresh interpreter that runs the example suite's integer-backend pair in process: glibc's
heap parameters (``mallopt`` has no getter, so by what they do, plus every ``mallopt`` lookup through
ctypes), the BLAS thread pools (threadpoolctl), the signal handlers and the environment.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("threadpoolctl", reason="test extra: threadpoolctl reads the BLAS thread pools")

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc" and hasattr(ctypes.CDLL(None), "mallinfo2")
SUITE = Path(__file__).resolve().parents[1] / "example_suites"

#: runs in a fresh interpreter; prints one JSON line of what it saw before and after
SCRIPT = textwrap.dedent(
    """
    import ctypes, json, os, signal, sys

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost")]

    libc.mallinfo2.restype = MallInfo2

    def heap_growth():
        # 64 KB blocks always come from the main heap (below glibc's smallest mmap threshold): how much
        # does the heap grow when it must? glibc's own top pad: 128 KB; the tuned one: 64 MB
        blocks, start = [], libc.mallinfo2().arena
        try:
            while libc.mallinfo2().arena == start and len(blocks) < 4096:
                blocks.append(libc.malloc(65536))
            return libc.mallinfo2().arena - start
        finally:
            for block in blocks:
                libc.free(block)

    lookups = []
    for method in ("__getattr__", "__getitem__"):
        def spy(self, name, _real=getattr(ctypes.CDLL, method)):
            if name == "mallopt":
                lookups.append(name)
            return _real(self, name)
        setattr(ctypes.CDLL, method, spy)

    import numpy, threadpoolctl
    threadpoolctl.threadpool_limits(2)  # not 1: a pool left held at one thread must show
    def pools():
        return sorted((p["internal_api"], p["filepath"], p["num_threads"]) for p in threadpoolctl.threadpool_info())
    def handlers():
        return {s.name: repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)}

    before = {"heap growth": heap_growth(), "pools": pools(), "signals": handlers(), "env": dict(os.environ)}
    import pytest, pytest_qaccuracy.plugin
    os.chdir(sys.argv[1])
    code = pytest.main(["-q", "-p", "no:cacheprovider", "qaccuracy_digits.toml", "-k", "digits_qdq_w8"])
    # the digits net is too small to be split between threads: one convolution that is, on two threads
    from onnx import TensorProto, helper
    from pytest_qaccuracy.backend import IntegerSession
    rng = numpy.random.default_rng(0)
    scalars = {"xs": 0.02, "xz": 128, "ws": 0.01, "wz": 0, "ys": 0.05, "yz": 128}
    inits = [helper.make_tensor(n, TensorProto.UINT8 if n.endswith("z") else TensorProto.FLOAT, [], [v])
             for n, v in scalars.items()]
    inits[3] = helper.make_tensor("wz", TensorProto.INT8, [], [0])
    inits.append(helper.make_tensor("w", TensorProto.INT8, [32, 32, 3, 3], rng.integers(-127, 128, 9216)))
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], pads=[1] * 4)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.UINT8, None)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.integers(0, 256, (16, 32, 64, 64), dtype=numpy.uint8)
    IntegerSession(model, "onnxruntime-avx2", threads=2).run(None, {"x": x})
    after = {"heap growth": heap_growth(), "pools": pools(), "signals": handlers(), "env": dict(os.environ)}
    print(json.dumps({"exit": int(code), "lookups": lookups, "before": before, "after": after}))
    """
)


def _run(env_heap: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "QACCURACY_", "PYTEST_"))}
    if env_heap is not None:
        env["QACCURACY_HEAP"] = env_heap
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(SUITE)], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not GLIBC, reason="glibc 2.33+ (mallinfo2) only")
def test_importing_the_plugin_and_running_a_pair_leave_the_process_as_it_was() -> None:
    seen = _run(None)
    assert seen["exit"] == 0  # the pair's checks really ran on the integer backend, and passed
    assert not seen["lookups"], "mallopt looked up through ctypes"
    assert seen["before"]["heap growth"] < 8 << 20  # glibc's own top pad, before as after
    assert seen["after"]["heap growth"] < 8 << 20
    assert any(threads == 2 for _, _, threads in seen["before"]["pools"])
    after = {(api, path): threads for api, path, threads in seen["after"]["pools"]}
    assert all(after[api, path] == threads for api, path, threads in seen["before"]["pools"])  # each as it was
    assert seen["after"]["signals"] == seen["before"]["signals"]
    assert seen["after"]["env"] == seen["before"]["env"]


@pytest.mark.slow
@pytest.mark.skipif(not GLIBC, reason="glibc 2.33+ (mallinfo2) only")
def test_the_heap_probe_sees_the_opt_in_tuning() -> None:
    """The same run with ``QACCURACY_HEAP=tuned``: the probe above would catch a tuning applied by default."""
    seen = _run("tuned")
    assert seen["exit"] == 0
    assert "mallopt" in seen["lookups"]
    assert seen["before"]["heap growth"] < 8 << 20
    assert seen["after"]["heap growth"] >= 64 << 20
