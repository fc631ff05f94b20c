"""glibc's heap parameters for the backend's temporaries (``backend/heap.py``)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from pytest_qaccuracy.backend import heap
from pytest_qaccuracy.errors import InputError

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

#: three 6 MB temporaries made and freed in turn, as a kernel's chunk does: with glibc's own
#: parameters their pages are given back and faulted in again every time
CHURN = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    from pytest_qaccuracy.backend import IntegerSession

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    IntegerSession(model, "onnxruntime-vnni", threads=1)

    def step():
        a, b, c = (np.ones(6 << 20, np.uint8) for _ in range(3))
        del c, b, a

    step(); step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
    """
)


def _faults_per_step(heap_env: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != heap.ENV}
    if heap_env is not None:
        env[heap.ENV] = heap_env
    out = subprocess.run([sys.executable, "-c", CHURN], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's allocator only")
def test_the_heap_is_kept_warm_only_when_asked() -> None:
    """With ``QACCURACY_HEAP=tuned`` a backend session keeps churning multi-MB temporaries from faulting
    pages in; by default (and with ``system``) the process's allocator is as it was, and glibc gives
    them back every time."""
    assert _faults_per_step("tuned") < 20
    assert _faults_per_step(None) > 500
    assert _faults_per_step("system") > 500


def test_the_parameters_are_set_once_and_only_on_request(monkeypatch) -> None:
    """Both parameters, once per process, with ``QACCURACY_HEAP=tuned``; nothing by default, with
    ``system`` or without glibc; any other value is refused in one line."""
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(heap, "_mallopt", lambda: lambda param, value: calls.append((param, value)) or 1)
    monkeypatch.setattr(heap, "_applied", None)
    monkeypatch.delenv(heap.ENV, raising=False)
    assert not heap.keep_temporaries_warm() and not calls

    for value in ("system", "System ", ""):
        monkeypatch.setattr(heap, "_applied", None)
        monkeypatch.setenv(heap.ENV, value)
        assert not heap.keep_temporaries_warm() and not calls

    monkeypatch.setattr(heap, "_applied", None)
    monkeypatch.setenv(heap.ENV, "tuned")
    assert heap.keep_temporaries_warm() and heap.keep_temporaries_warm()
    assert calls == [(heap.M_MMAP_THRESHOLD, heap.MMAP_THRESHOLD), (heap.M_TOP_PAD, heap.TOP_PAD)]

    monkeypatch.setattr(heap, "_applied", None)
    monkeypatch.setattr(heap, "_mallopt", lambda: None)
    assert not heap.keep_temporaries_warm()

    monkeypatch.setenv(heap.ENV, "fast")
    with pytest.raises(InputError, match=r"^QACCURACY_HEAP='fast': expected 'tuned' or 'system'$"):
        heap.keep_temporaries_warm()
