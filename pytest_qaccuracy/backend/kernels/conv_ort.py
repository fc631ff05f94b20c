"""Exact integer convolution sums computed by onnxruntime's float32 convolution.

A float32 sum of integers is exact, in any order, while every partial sum stays below 2^24 in
magnitude: the integer convolution's inputs ``x - x_zp`` and weights ``w - w_zp`` are such integers,
and :func:`~pytest_qaccuracy.backend.kernels.conv.conv_integer_acc` bounds every partial sum before it
chooses float32. Under that bound, any float32 convolution gives the exact integer sums, so the
backend may hand them to onnxruntime's own (MLAS: NCHWc direct, depthwise and im2col kernels, no
Winograd or FFT), which runs them several times faster than numpy's GEMMs and tap loops. Only the
sums come from onnxruntime: the scheme's arithmetic (pair saturation, bias, requantization,
rounding) stays the backend's own.

One single-node session per convolution and weight array, kept while the weight array lives (a
session passes the same constant arrays on every run); its intra-op threads are the caller's, since
the driver runs chunks of records on its own threads.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Hashable
from typing import Any

import numpy as np

#: multiply-adds of a convolution call below which the numpy paths run it (a session costs about
#: 5 ms to build and each call some tens of microseconds: not worth it on small tensors)
MIN_MACS = 1 << 22

#: opset of the single-node models (Conv has not changed since opset 11)
OPSET = 13

_SESSIONS: dict[tuple[int, Hashable], tuple[weakref.ref, Any]] = {}
_LOCK = threading.Lock()


def worth_it(macs: int) -> bool:
    """Whether a convolution of ``macs`` multiply-adds goes to onnxruntime."""
    return macs >= MIN_MACS


def conv_model(
    w: np.ndarray,
    group: int,
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    pads: list[int],
) -> bytes:
    """A serialized one-node float32 ``Conv`` model with free batch and spatial axes."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.ascontiguousarray(w, np.float32), "w")]
    node = helper.make_node(
        "Conv",
        ["x", "w"],
        ["y"],
        group=group,
        strides=list(strides),
        dilations=list(dilations),
        pads=list(pads),
        kernel_shape=list(w.shape[2:]),
    )
    spatial = [f"s{i}" for i in range(w.ndim - 2)]
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", w.shape[1] * group, *spatial])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 7  # readable by every onnxruntime the package supports
    return model.SerializeToString()


def session_for(source: np.ndarray, key: Hashable, build: Any, threads: int) -> Any:
    """The session of ``build()`` (model bytes) for weights derived from ``source`` and ``key``,
    kept while ``source`` lives; built on first use."""
    from pytest_qaccuracy.ort_session import make_session

    slot = (id(source), (key, threads))
    with _LOCK:
        found = _SESSIONS.get(slot)
        if found is not None and found[0]() is source:
            return found[1]
    session = make_session(build(), threads=threads)
    try:
        ref = weakref.ref(source, lambda _, slot=slot: _SESSIONS.pop(slot, None))
    except TypeError:  # not weak-referenceable: no caching
        return session
    with _LOCK:
        _SESSIONS[slot] = (ref, session)
    return session


#: the parent's sessions, in a forked child: kept, never destroyed there. A session with intra-op
#: threads waits in its destructor for those threads, which the fork left behind in the parent, so
#: destroying one hung the child for good.
_ABANDONED: list[Any] = []


def _forget_in_child() -> None:
    """A forked child builds its own sessions: a parent's intra-op threads do not survive a fork."""
    global _LOCK
    _LOCK = threading.Lock()  # another thread of the parent may have held it at the fork
    _ABANDONED.extend(session for _, session in _SESSIONS.values())
    _SESSIONS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
