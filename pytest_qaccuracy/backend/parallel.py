"""Intra-op parallelism of the integer backend: a kernel's independent chunks on a thread pool.

numpy releases the GIL in its copy and ufunc loops and BLAS in its GEMMs, so chunks of records or of
a flat array run side by side on threads. The thread count belongs to the calling thread (set by
``IntegerSession.run`` through :func:`using`), so sessions with different settings can run in
different threads at once. Chunks never submit chunks, so one shared pool cannot deadlock.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

import numpy as np

T = TypeVar("T")

_local = threading.local()
_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_pid = 0  # the process that built the pool (a forked child needs its own)

#: below this many elements a chunk is not worth a thread hand-off
MIN_PARALLEL_ELEMENTS = 1 << 16


def available_cores() -> int:
    """Cores this process may run on (the affinity mask where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


def resolve(threads: int) -> int:
    """``threads`` as a count: 0 means every available core (onnxruntime's ``intra_op_num_threads``)."""
    if threads < 0:
        raise ValueError(f"threads must be >= 0, got {threads}")
    return threads or available_cores()


def current() -> int:
    """Threads the calling thread's kernels may use (1 outside :func:`using`)."""
    return getattr(_local, "threads", 1)


@contextmanager
def using(threads: int) -> Iterator[None]:
    """Let kernels called from this thread use ``threads`` threads (0: all cores)."""
    previous = current()
    _local.threads = resolve(threads)
    try:
        yield
    finally:
        _local.threads = previous


def _executor(size: int) -> ThreadPoolExecutor:
    """The shared pool, grown to ``size`` workers; a new one in a forked child (its threads stayed behind)."""
    global _pool, _pool_size, _pool_pid
    with _pool_lock:
        forked = _pool_pid != os.getpid()
        if _pool is None or _pool_size < size or forked:
            old = _pool
            _pool, _pool_size = ThreadPoolExecutor(size, thread_name_prefix="qaccuracy-kernel"), size
            _pool_pid = os.getpid()
            if old is not None and not forked:
                old.shutdown(wait=False)
        return _pool


class _BlasThreads:
    """OpenBLAS's own thread count, found through ctypes in the libraries this process has loaded.

    Threaded chunks each call BLAS; if BLAS also spread every call over all cores, the two levels
    would fight for them (measured: slower than one level). While chunks run, BLAS is held to one
    thread and restored afterwards. Without a known BLAS (MKL, Accelerate) this does nothing.
    """

    _NAMES = ("scipy_openblas_{}_num_threads64_", "openblas_{}_num_threads64_", "openblas_{}_num_threads")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved = 0
        self._calls: tuple[Callable[[], int], Callable[[int], None]] | bool | None = False

    def _find(self) -> tuple[Callable[[], int], Callable[[int], None]] | None:
        import ctypes

        try:
            with open("/proc/self/maps", encoding="utf-8") as maps:
                paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and ".so" in line}
        except OSError:
            return None
        for path in sorted(paths):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for name in self._NAMES:
                getter, setter = getattr(lib, name.format("get"), None), getattr(lib, name.format("set"), None)
                if getter is not None and setter is not None:
                    getter.restype = ctypes.c_int
                    return getter, setter
        return None

    @contextmanager
    def single(self) -> Iterator[None]:
        with self._lock:
            if self._calls is False:
                self._calls = self._find()
            if self._calls and self._users == 0:
                self._saved = int(self._calls[0]())
                self._calls[1](1)
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._calls and self._users == 0:
                    self._calls[1](self._saved)


blas_threads = _BlasThreads()


def run_all(tasks: Sequence[Callable[[], T]]) -> list[T]:
    """Run independent tasks, on the calling thread's share of the pool; results in order.

    The calling thread runs tasks too, so one thread means a plain loop. An exception in any task is
    raised here after the others finished (no chunk keeps writing into a buffer the caller reuses).
    """
    threads = min(current(), len(tasks))
    if threads <= 1:
        return [task() for task in tasks]
    pool = _executor(threads - 1)
    lock = threading.Lock()
    position = iter(range(len(tasks)))
    results: list = [None] * len(tasks)
    errors: list[BaseException] = []

    def drain() -> None:
        while True:
            with lock:
                index = next(position, None)
            if index is None:
                return
            try:
                results[index] = tasks[index]()
            except BaseException as exc:  # re-raised in the caller below
                errors.append(exc)

    with blas_threads.single():
        helpers = [pool.submit(drain) for _ in range(threads - 1)]
        drain()
        for helper in helpers:
            helper.result()
    if errors:
        raise errors[0]
    return results


def split(total: int, per_chunk_cost: int = 1) -> list[tuple[int, int]]:
    """``[begin, end)`` ranges covering ``total`` items: one per thread when the work is worth it."""
    threads = current()
    if threads <= 1 or total <= 1 or total * per_chunk_cost < MIN_PARALLEL_ELEMENTS:
        return [(0, total)]
    parts = min(threads, total)
    bounds = [total * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i] < bounds[i + 1]]


def split_records(shape: Sequence[int]) -> list[tuple[int, int]]:
    """:func:`split` of an array of ``shape`` by its first axis, each record costing its elements
    (an empty array, or one of no record, too)."""
    return split(shape[0], math.prod(shape[1:]))


#: elements of one block of an elementwise kernel: its temporaries stay in cache, and there are few
#: enough blocks that two threads gain (measured on the detector's adds and QuantizeLinear: 2^17)
BLOCK_ELEMENTS = 1 << 17

_scratch = threading.local()


def scratch(size: int, dtype: type | np.dtype, role: str) -> np.ndarray:
    """A reusable per-thread buffer of ``size`` elements for one ``role`` (contents undefined).

    Fresh large allocations page-fault on every call, and from several threads they contend in the
    kernel's memory map; kernels call this instead of allocating temporaries per chunk.
    """
    key = (role, np.dtype(dtype).str)
    cache = _scratch.__dict__.setdefault("cache", {})
    buf = cache.get(key)
    if buf is None or buf.size < size:
        buf = cache[key] = np.empty(size, dtype)
    return buf[:size]


def blockwise(fn: Callable[..., None], out: np.ndarray, *inputs: np.ndarray) -> bool:
    """``fn(out_block, *input_blocks)`` over flat blocks, on the calling thread's share of the pool.

    Applies only when ``out`` and every input are C-contiguous with one shape (elementwise kernels
    whose parameters are scalars); returns False otherwise, and the caller runs its whole-array form.
    """
    if not out.flags.c_contiguous or any(x.shape != out.shape or not x.flags.c_contiguous for x in inputs):
        return False
    flat_out = out.reshape(-1)
    flat_in = [x.reshape(-1) for x in inputs]
    total = flat_out.size
    tasks = [
        lambda b=b: fn(flat_out[b : b + BLOCK_ELEMENTS], *(x[b : b + BLOCK_ELEMENTS] for x in flat_in))
        for b in range(0, total, BLOCK_ELEMENTS)
    ]
    if len(tasks) * BLOCK_ELEMENTS < MIN_PARALLEL_ELEMENTS or current() <= 1:
        for task in tasks:
            task()
    else:  # hand out runs of blocks, not single blocks: fewer hand-offs
        runs = max(1, len(tasks) // (4 * current()))
        run_all([lambda i=i: [t() for t in tasks[i : i + runs]] for i in range(0, len(tasks), runs)])
    return True


def _after_fork_in_child() -> None:
    """Locks held by other threads at fork time would stay held forever in the child: renew them."""
    global _pool_lock
    _pool_lock = threading.Lock()
    blas_threads._lock = threading.Lock()
    blas_threads._users = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
