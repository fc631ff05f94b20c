"""Intra-op threads: chunks on a pool give bit-identical results, for any thread count and chunking."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from backend_models import assert_same, float_net, ort_session, quantize_qdq

from pytest_qaccuracy.backend import IntegerSession, parallel
from pytest_qaccuracy.errors import InputError

NETS = {
    "residual": ["Conv", "Add", "Conv", "Mul", "Concat", "Transpose", "Relu"],
    "conv-pool-act": ["Conv", "ConvRelu", "DepthwiseConv", "AveragePool", "MaxPool", "Sigmoid", "LeakyRelu"],
    "data-movement": ["Conv", "Resize", "Clip", "Reshape", "Split", "ConvTranspose", "Conv"],
}


@pytest.fixture
def tiny_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel splits even these small tensors: many chunks, many blocks, a partial last block."""
    from pytest_qaccuracy.backend.kernels import conv_chunks

    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 0)
    monkeypatch.setattr(parallel, "BLOCK_ELEMENTS", 100)
    monkeypatch.setattr(conv_chunks, "CHUNK_ELEMENTS", 3000)
    monkeypatch.setattr(conv_chunks, "THREADED_CHUNK_ELEMENTS", 3000)
    monkeypatch.setattr(conv_chunks, "DEPTHWISE_CHUNK_ELEMENTS", 3000)


@pytest.mark.parametrize("net", NETS)
@pytest.mark.parametrize("activation", ["uint8", "int8"])
def test_threads_are_bit_exact_with_onnxruntime(net: str, activation: str, tiny_chunks: None, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    calibration = rng.normal(0, 1, (8, 8, 12, 12)).astype(np.float32)
    records = rng.normal(0, 1.2, (5, 8, 12, 12)).astype(np.float32)
    model = quantize_qdq(float_net(NETS[net], opset=18), calibration, tmp_path, activation=activation, per_channel=True)
    # onnxruntime's default session (int8 activations run as uint8, as the host preset does): on a CPU
    # without VNNI the u8 x s8 pairs then saturate, while int8 fusion would sum s8 x s8 exactly
    want = ort_session(model, int8_fusion=False).run(None, {"input": records})[0]
    for threads in (1, 2, 3):
        got = IntegerSession(model, threads=threads).run(None, {"input": records})[0]
        assert_same(got, want, f"{net} with {threads} threads")
    single = IntegerSession(model, threads=3).run(None, {"input": records[:1]})[0]  # one record: rows split
    assert_same(single, want[:1], f"{net}, one record, 3 threads")


def test_chunks_cover_every_record_and_row_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_qaccuracy.backend.kernels import conv_chunks

    monkeypatch.setattr(conv_chunks, "CHUNK_ELEMENTS", 1 << 23)
    monkeypatch.setattr(conv_chunks, "THREADED_CHUNK_ELEMENTS", 1 << 23)
    for threads, n, first in ((1, 5, 7), (2, 5, 7), (3, 1, 10), (4, 2, 9), (2, 1, 1)):
        with parallel.using(threads):
            spans = conv_chunks.chunk_spans(n, first, per_row=1 << 14)
        covered = np.zeros((n, first), int)
        for n0, n1, o0, o1 in spans:
            covered[n0:n1, o0:o1] += 1
        assert (covered == 1).all(), (threads, n, first, spans)
        assert len(spans) >= min(threads, n * first) or threads == 1, (threads, spans)
        if threads == 1:
            assert len(spans) == 1


def test_chunk_budget_is_larger_when_threads_share_the_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_qaccuracy.backend.kernels import conv_chunks

    monkeypatch.setattr(conv_chunks, "CHUNK_ELEMENTS", 1000)
    monkeypatch.setattr(conv_chunks, "THREADED_CHUNK_ELEMENTS", 4000)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 0)
    sizes = {}
    for threads in (1, 2):
        with parallel.using(threads):
            spans = conv_chunks.chunk_spans(40, 10, per_row=100)  # a record is 10 rows of 100: 1000 elements
        sizes[threads] = {n1 - n0 for n0, n1, _, _ in spans}
    assert sizes == {1: {1}, 2: {4}}


def test_run_all_keeps_order_and_raises_after_all_tasks() -> None:
    finished = []

    def task(i: int) -> int:
        if i == 3:
            raise ValueError("task 3")
        finished.append(i)
        return i * i

    with parallel.using(3):
        assert parallel.run_all([lambda i=i: i * i for i in range(10)]) == [i * i for i in range(10)]
        with pytest.raises(ValueError, match="task 3"):
            parallel.run_all([lambda i=i: task(i) for i in range(8)])
    assert sorted(finished) == [0, 1, 2, 4, 5, 6, 7]


def test_run_all_uses_other_threads_only_inside_using() -> None:
    seen = set()

    def task() -> None:
        seen.add(threading.get_ident())
        threading.Event().wait(0.01)

    parallel.run_all([task] * 6)
    assert seen == {threading.get_ident()}
    with parallel.using(2):
        parallel.run_all([task] * 6)
    assert len(seen) == 2
    assert parallel.current() == 1


def test_blas_is_single_threaded_while_chunks_run_and_restored_after() -> None:
    blas = parallel.blas_threads
    with blas.single():
        calls = blas._calls
        if not calls:
            pytest.skip("no OpenBLAS found in this process (numpy built against another BLAS)")
        assert calls[0]() == 1
    before = calls[0]()
    with parallel.using(2):
        inside = parallel.run_all([lambda: calls[0]()] * 4)
    assert inside == [1] * 4
    assert calls[0]() == before


def test_blockwise_falls_back_for_broadcast_operands() -> None:
    out = np.empty((4, 5))
    assert not parallel.blockwise(np.add, out, np.ones((4, 5)), np.ones((1, 5)))
    got = np.empty((4, 5))
    assert parallel.blockwise(lambda o, a, b: np.add(a, b, out=o), got, np.ones((4, 5)), np.full((4, 5), 2.0))
    assert (got == 3).all()


@pytest.mark.parametrize("threads", [-1, 1.5, "2", True])
def test_bad_thread_count_is_a_clear_error(threads: object, tmp_path: Path) -> None:
    model = quantize_qdq(float_net(["Conv"], opset=18), np.ones((2, 8, 12, 12), np.float32), tmp_path)
    with pytest.raises(InputError, match="threads must be an integer >= 0"):
        IntegerSession(model, threads=threads)  # type: ignore[arg-type]


def _run_in_child(queue) -> None:
    with parallel.using(2):
        queue.put(parallel.run_all([lambda i=i: i + 1 for i in range(6)]))


def test_a_forked_child_gets_its_own_pool() -> None:
    """The parent's pool threads do not exist in a forked child: the child must not wait on them."""
    import multiprocessing

    with parallel.using(2):
        parallel.run_all([lambda: None] * 4)  # the parent's pool exists
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_run_in_child, args=(queue,))
    child.start()
    child.join(timeout=30)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive, "the forked child hung on the parent's pool"
    assert child.exitcode == 0 and queue.get(timeout=5) == [1, 2, 3, 4, 5, 6]


def test_numpy_integer_thread_count_is_accepted(tmp_path: Path) -> None:
    model = quantize_qdq(float_net(["Conv"], opset=18), np.ones((2, 8, 12, 12), np.float32), tmp_path)
    assert IntegerSession(model, threads=np.int64(2)).threads == 2
