"""The one place the package opens an onnxruntime session: its defaults, then each caller's settings.

Every session gets the same defaults: idle intra-op threads sleep instead of spinning (runs interleave
with numpy work and other processes on the same cores, which spinning threads would steal), and
onnxruntime logs nothing below a fatal error (a failure reaches the user as one exception, not as
onnxruntime's log). Callers say what differs: the execution providers, intra-op threads, graph
optimization level and extra session config entries (the comparison's merged graph, thousands of
small nodes, lets its threads spin briefly during a run: :func:`spin_during_run`).

The module sits beside ``runtime/`` and ``backend/`` rather than inside either, because both open
sessions and ``runtime`` imports ``backend``.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

#: Graph optimization level names (``RuntimeOptions.optimization``) -> ``onnxruntime.GraphOptimizationLevel``.
GRAPH_OPTIMIZATION = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}

#: Session config entries every session gets; a caller's ``config`` may override them.
DEFAULT_CONFIG: Mapping[str, str] = {"session.intra_op.allow_spinning": "0"}

#: the first onnxruntime whose intra-op threads can spin for a bounded time
#: (``session.intra_op.spin_duration_us``; 1.25 has no such entry)
BOUNDED_SPIN_SINCE = (1, 26)

#: How long an intra-op thread spins for more work before it sleeps, in a :func:`spin_during_run` session.
SPIN_MICROSECONDS = 50


def spin_during_run() -> dict[str, str]:
    """Config entries for a session whose run is thousands of small nodes (the comparison's merged
    graph): intra-op threads spin :data:`SPIN_MICROSECONDS` for the next node's work before they
    sleep, and stop when the run returns (nothing spins while numpy works on the results).

    Measured on PP-OCRv4's detector's merged graph, all metrics, 2 cores: waking a sleeping thread for
    each node cost a fifth of a run (1 record 45 -> 36 ms, 8 records 153 -> 123 ms spinning). With a
    CPU-bound process on the other core, a run of 8 records took 205-238 ms sleeping, 235-276 ms with
    the bounded spin, 265-773 ms spinning without a bound: hence the bound, and on onnxruntime before
    :data:`BOUNDED_SPIN_SINCE` (no bound to set) no spinning at all (empty config).
    """
    import onnxruntime as ort

    if version_tuple(ort.__version__) < BOUNDED_SPIN_SINCE:
        return {}
    return {
        "session.intra_op.allow_spinning": "1",
        "session.intra_op.spin_duration_us": str(SPIN_MICROSECONDS),
        "session.force_spinning_stop": "1",
    }


#: onnxruntime's log severity for every session: fatal errors only.
LOG_SEVERITY = 4


#: the first onnxruntime whose priority-based execution order runs the comparison's merged graph right:
#: 1.18.0 gives wrong sums with it on small QDQ nets (the same graph in the default order is right;
#: 1.19.2, 1.20.1, 1.22.0 and 1.32.0 are right in both orders)
PRIORITY_ORDER_SINCE = (1, 19)


def version_tuple(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``1.18.0`` or ``1.20.0.dev20240101``."""
    major, minor, *_ = [int("".join(ch for ch in part if ch.isdigit()) or 0) for part in version.split(".")] + [0, 0]
    return major, minor


def make_session(
    model: onnx.ModelProto | bytes | str | os.PathLike[str],
    *,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    threads: int = 0,
    optimization: str = "all",
    config: Mapping[str, object] | None = None,
    optimized_model_path: str | os.PathLike[str] | None = None,
    in_node_order: bool = False,
    mem_pattern: bool = True,
) -> Any:
    """An ``onnxruntime.InferenceSession`` for ``model`` with the package's defaults.

    Args:
        model: a model proto, its serialized bytes, or a path.
        providers: execution providers in priority order.
        threads: intra-op threads (0 lets onnxruntime choose).
        optimization: graph optimization level, a key of :data:`GRAPH_OPTIMIZATION`.
        config: session config entries added after :data:`DEFAULT_CONFIG` (values passed as strings).
        optimized_model_path: where onnxruntime writes the graph as it optimized it (for a caller
            that builds on the optimized graph), if given.
        in_node_order: run the nodes in the order the graph lists them where dependencies allow
            (onnxruntime's priority-based order, ties by position) instead of its depth-first order,
            on onnxruntime :data:`PRIORITY_ORDER_SINCE` and later; before, the default order runs.
        mem_pattern: onnxruntime's memory pattern (``SessionOptions.enable_mem_pattern``): after the
            first run, one block holds every tensor of a run at a planned offset. Off, tensors come
            from the arena as they are made and freed.

    Raises:
        Whatever onnxruntime raises for a model it cannot load; callers that report to the user turn
        it into a :class:`~pytest_qaccuracy.errors.ModelError` with :func:`first_line`.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, GRAPH_OPTIMIZATION[optimization])
    options.intra_op_num_threads = threads
    options.log_severity_level = LOG_SEVERITY
    options.enable_mem_pattern = mem_pattern
    if optimized_model_path is not None:
        options.optimized_model_filepath = os.fspath(optimized_model_path)
    if in_node_order and version_tuple(ort.__version__) >= PRIORITY_ORDER_SINCE:
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    for key, value in {**DEFAULT_CONFIG, **(config or {})}.items():
        options.add_session_config_entry(key, str(value))
    if isinstance(model, bytes):
        source: bytes | str = model
    elif isinstance(model, str | os.PathLike):
        source = os.fspath(model)
    else:
        source = model.SerializeToString()
    return ort.InferenceSession(source, sess_options=options, providers=list(providers))


def fetch(session: Any, names: Sequence[str], feeds: Mapping[str, Any]) -> list[Any]:
    """``session.run(names, feeds)``, with the graph inputs among ``names`` taken from ``feeds``.

    onnxruntime 1.22 returns a graph input asked for as an output as a view of the feed's memory
    without keeping the feed alive: once the caller drops its feeds (a batch's stacked records), the
    array reads freed memory (measured: every run of a test model read garbage; 1.18 and 1.32 copy).
    """
    asked = [n for n in names if n not in feeds]
    try:
        values = dict(zip(asked, session.run(asked, dict(feeds)), strict=True)) if asked else {}
    except Exception:
        check_fetchable(session, asked)
        raise
    return [values[n] if n in values else feeds[n] for n in names]


#: Element types onnxruntime's Python API cannot return as numpy arrays (it fails with "No
#: corresponding Numpy type for Tensor Type. Int4x2", naming no tensor).
NO_NUMPY_TYPES = ("int4", "uint4", "float4e2m1")


def check_fetchable(session: Any, names: Sequence[str]) -> None:
    """Refuse a request for a tensor onnxruntime cannot return (an int4 activation of a QDQ model):
    a :class:`~pytest_qaccuracy.errors.ModelError` naming the tensor and its type.

    Raises:
        ModelError: one of ``names`` has a type of :data:`NO_NUMPY_TYPES`.
    """
    from pytest_qaccuracy.errors import ModelError

    wanted = set(names)
    for output in session.get_outputs():
        kind = output.type.removeprefix("tensor(").removesuffix(")")
        if output.name in wanted and kind in NO_NUMPY_TYPES:
            raise ModelError(
                f"tensor '{output.name}' is {kind}: {kind} tensors are not supported "
                "(onnxruntime cannot return them to Python)"
            )


def first_line(exc: BaseException) -> str:
    """The first line of an onnxruntime error (its full text repeats the model and a stack), else its type."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# -- forking --------------------------------------------------------------------------------------
#
# A session with intra-op threads must not be destroyed in a forked child: its destructor joins
# threads the fork left in the parent (measured: SIGSEGV, or a hang). Sessions the parent still
# holds are safe until the child drops them (``conv_ort`` keeps its own); but a session that was
# garbage at the fork, in a reference cycle not yet collected, was destroyed by the child's first
# garbage collection (the CI's Python 3.13 run: the forked child of
# ``test_a_forked_child_gets_its_own_pool`` died with SIGSEGV while collecting). Before a fork the
# parent's objects are frozen (``gc.freeze``), so the child never collects them, and unfrozen again
# in the parent. A caller that froze them itself keeps its own freeze.

_froze_for_fork = False


def _freeze_before_fork() -> None:
    global _froze_for_fork
    _froze_for_fork = gc.get_freeze_count() == 0
    if _froze_for_fork:
        gc.freeze()


def _unfreeze_after_fork() -> None:
    if _froze_for_fork:
        gc.unfreeze()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_freeze_before_fork, after_in_parent=_unfreeze_after_fork)
