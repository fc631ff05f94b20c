"""Large exact convolutions run their sums in onnxruntime's float32 Conv (``conv_ort``, ``OrtPath``).

Float32 sums of integers are exact below 2^24, so the sums must equal the numpy paths' bit for bit
under every preset, geometry and thread count; the session is built once per weight array, and
convolutions whose sums would not be exact in float32 never go there.
"""

from __future__ import annotations

import gc
import itertools

import numpy as np
import onnx
import pytest
from backend_models import assert_same, node_model, ort_run, random_q
from pair_ways import force_way

from pytest_qaccuracy.backend import IntegerSession, pairs, parallel
from pytest_qaccuracy.backend.interpreter import KernelError
from pytest_qaccuracy.backend.kernels import conv_core, conv_ort

f32 = np.float32

CASES = {
    # name: (x dtype, channels, outputs, group, (h, w), kernel, attrs, records)
    "dense-3x3": (np.uint8, 16, 8, 1, (12, 10), (3, 3), {"pads": [1, 1, 1, 1]}, 4),
    "dense-5x5-stride-2": (np.uint8, 8, 6, 1, (13, 11), (5, 5), {"strides": [2, 2], "pads": [2, 1, 0, 2]}, 3),
    "dilated-3x1": (np.int8, 12, 5, 1, (14, 9), (3, 1), {"dilations": [2, 1], "pads": [2, 0, 2, 0]}, 2),
    "1x1": (np.uint8, 24, 40, 1, (9, 9), (1, 1), {}, 5),
    "grouped": (np.uint8, 12, 12, 3, (10, 10), (3, 3), {"pads": [1, 1, 1, 1]}, 3),
    "depthwise": (np.uint8, 16, 16, 16, (15, 12), (3, 3), {"pads": [1, 1, 1, 1]}, 4),
    "depthwise-x2-stride-2": (np.int8, 6, 12, 6, (16, 14), (5, 5), {"strides": [2, 2], "pads": [2, 2, 2, 2]}, 3),
    "one-record": (np.uint8, 16, 8, 1, (12, 10), (3, 3), {"pads": [0, 1, 1, 0]}, 1),
}  # fmt: skip


def _model(case: str, rng: np.random.Generator, per_channel_zp: bool = False):
    xdt, c, m, group, (h, w), kernel, attrs, records = CASES[case]
    x = random_q(rng, xdt, (records, c, h, w))
    weights = random_q(rng, np.int8, (m, c // group, *kernel))
    inits = {
        "xs": f32(0.013), "xz": np.array(9 if xdt == np.uint8 else -5, xdt), "w": weights,
        "ws": rng.uniform(0.002, 0.02, m).astype(f32), "wz": np.zeros(m, np.int8), "ys": f32(0.21),
        "yz": np.array(120 if xdt == np.uint8 else -3, xdt), "b": rng.integers(-20000, 20000, m).astype(np.int32),
    }  # fmt: skip
    model = node_model(
        "QLinearConv", [("x", xdt, x.shape)], inits, xdt, kernel_shape=list(kernel), group=group, **attrs
    )
    return model, x


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the onnxruntime calls of ``OrtPath``."""
    calls: list[int] = []
    original = conv_core.OrtPath.sums
    spy = lambda self, chunk, dest: calls.append(1) or original(self, chunk, dest)  # noqa: E731
    monkeypatch.setattr(conv_core.OrtPath, "sums", spy)
    return calls


#: presets, and ways of the AVX2 pair correction forced (``pair_ways``)
PRESETS = [
    "onnxruntime-vnni",
    "onnxruntime-avx2",
    "onnxruntime-avx2 sparse",
    "onnxruntime-avx2 dense-blocks",
    "tflite",
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("scheme", PRESETS)
@pytest.mark.parametrize("case", CASES)
def test_sums_in_onnxruntime_equal_the_numpy_paths(case: str, scheme: str, threads: int, monkeypatch) -> None:
    """Every geometry, every preset (the AVX2 pair correction is added to onnxruntime's sums; with
    ``sparse``, found by the candidate search instead of evaluated densely), one or several threads:
    bit for bit the numpy paths' output."""
    scheme, _, way = scheme.partition(" ")
    if way:
        force_way(monkeypatch, way)
    model, x = _model(case, np.random.default_rng(len(case)))
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 0)
    monkeypatch.setattr(conv_core, "MIN_PARALLEL_MACS", 0)
    monkeypatch.setattr(conv_ort, "MIN_MACS", 1 << 60)
    want = IntegerSession(model, scheme=scheme, threads=threads).run(None, {"x": x})[0]
    calls = _spy(monkeypatch)
    monkeypatch.setattr(conv_ort, "MIN_MACS", 0)
    got = IntegerSession(model, scheme=scheme, threads=threads).run(None, {"x": x})[0]
    assert calls, "onnxruntime's Conv was not used"
    assert_same(got, want, f"{case} {scheme} {way}")
    records = x.shape[0]
    assert len(calls) >= min(records, threads), "the records are shared between the threads"


@pytest.mark.parametrize(("limit", "chunks"), [(1 << 60, 1), (0, 2)])
def test_small_convolutions_stay_on_one_thread(limit: int, chunks: int, monkeypatch) -> None:
    """Under ``MIN_PARALLEL_MACS`` a convolution's records are one onnxruntime call on two threads
    (a hand-off costs what the call does); above it, one chunk per thread. Same output either way."""
    model, x = _model("dense-3x3", np.random.default_rng(1))
    monkeypatch.setattr(conv_ort, "MIN_MACS", 0)
    monkeypatch.setattr(conv_core, "MIN_PARALLEL_MACS", 1 << 60)
    want = IntegerSession(model, scheme="onnxruntime-vnni", threads=1).run(None, {"x": x})[0]
    monkeypatch.setattr(conv_core, "MIN_PARALLEL_MACS", limit)
    calls = _spy(monkeypatch)
    got = IntegerSession(model, scheme="onnxruntime-vnni", threads=2).run(None, {"x": x})[0]
    assert len(calls) == chunks
    assert_same(got, want, "two threads")


def test_matches_onnxruntime_exact_int32(monkeypatch) -> None:
    """Against onnxruntime itself where every CPU family sums exactly (depthwise: MLAS's depthwise
    kernel never saturates pairs), so this holds on any host."""
    model, x = _model("depthwise", np.random.default_rng(3))
    monkeypatch.setattr(conv_ort, "MIN_MACS", 0)
    calls = _spy(monkeypatch)
    got = IntegerSession(model, scheme="onnxruntime").run(None, {"x": x})[0]
    assert calls
    assert_same(got, ort_run(model, {"x": x})[0], "depthwise")


def test_one_session_per_weight_array_kept_while_it_lives(monkeypatch) -> None:
    from pytest_qaccuracy import ort_session

    built = []
    original = ort_session.make_session
    monkeypatch.setattr(ort_session, "make_session", lambda *a, **k: built.append(1) or original(*a, **k))
    monkeypatch.setattr(conv_ort, "MIN_MACS", 0)
    model, x = _model("dense-3x3", np.random.default_rng(5))
    session = IntegerSession(model, threads=1)
    first = session.run(None, {"x": x})[0]
    for _ in range(3):
        assert_same(session.run(None, {"x": x})[0], first, "rerun")
    assert len(built) == 1, "the session is built once and reused"
    before = len(conv_ort._SESSIONS)
    del session
    gc.collect()
    assert len(conv_ort._SESSIONS) < before, "released with the weights"


def test_sums_above_float32_stay_on_numpy(monkeypatch) -> None:
    """Weights whose sums can leave float32's exact integers (float64 GEMMs) never go to onnxruntime."""
    rng = np.random.default_rng(9)
    c, m = 256, 4
    x = rng.integers(200, 256, (2, c, 8, 8)).astype(np.uint8)
    w = rng.integers(-128, -100, (m, c, 3, 3)).astype(np.int8)  # 255 * 256 * 9 * 115 > 2^24
    inits = {
        "xs": f32(0.0173), "xz": np.array(7, np.uint8), "w": w, "ws": np.full(m, 0.01, f32),
        "wz": np.zeros(m, np.int8), "ys": f32(300.0), "yz": np.array(127, np.uint8),
    }  # fmt: skip
    model = node_model("QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8, kernel_shape=[3, 3], pads=[1] * 4)
    monkeypatch.setattr(conv_ort, "MIN_MACS", 0)
    calls = _spy(monkeypatch)
    got = IntegerSession(model).run(None, {"x": x})[0]
    assert not calls
    assert_same(got, ort_run(model, {"x": x})[0], "big-accumulator")


def test_small_convolutions_stay_on_numpy(monkeypatch) -> None:
    model, x = _model("one-record", np.random.default_rng(1))
    calls = _spy(monkeypatch)
    IntegerSession(model).run(None, {"x": x})
    assert not calls, f"below {conv_ort.MIN_MACS} multiply-adds the numpy paths run"


@pytest.mark.parametrize(
    ("n", "per_record", "threads", "want"),
    [
        (32, 1000, 2, 2),  # small records: one chunk per thread
        (32, 1 << 19, 2, 16),  # two records per chunk, a multiple of the threads
        (3, 1 << 21, 2, 3),  # records of 2 chunks' worth: one per chunk
        (1, 1000, 2, 1),
        (5, 1 << 18, 1, 2),
    ],
)
def test_record_spans(n: int, per_record: int, threads: int, want: int, monkeypatch) -> None:
    monkeypatch.setattr(conv_core, "ORT_CHUNK_ELEMENTS", 1 << 20)
    spans = conv_core._record_spans(n, per_record, threads, 7)
    assert len(spans) == want
    assert [s[0] for s in spans] == sorted({s[0] for s in spans})
    assert spans[0][0] == 0 and spans[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), "contiguous, no gaps"
    assert all(s[2:] == (0, 7) for s in spans), "whole output rows"


def _golden_convs() -> list[str]:
    from test_goldens import CASES

    return sorted(n for n in CASES if n.startswith(("qlinearconv", "convinteger", "net")))


@pytest.mark.parametrize("name", _golden_convs())
def test_recorded_avx2_goldens_with_sums_from_onnxruntime(name: str, monkeypatch) -> None:
    """The goldens recorded on a real AVX2 CPU, every convolution's exact sums taken from onnxruntime
    (whatever this host's family) and the int16 pair correction added: still bit for bit."""
    from test_goldens import CASES, GOLDENS, _emulate, _mismatches, _scheme

    monkeypatch.setattr(conv_ort, "MIN_MACS", 0)
    calls = _spy(monkeypatch)
    want = dict(np.load(GOLDENS / name / "outputs.npz"))
    assert _mismatches(_emulate(name, _scheme(CASES[name], "onnxruntime-avx2")), want) == 0
    note = CASES[name]["note"]
    assert calls, f"onnxruntime's Conv took no sums ({note})"


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork on this platform")
@pytest.mark.parametrize("case", ["dense-3x3", "one-record"])  # one record: sessions with intra-op threads
def test_a_forked_child_builds_its_own_sessions(monkeypatch, case: str) -> None:
    """The child gets the same output from sessions of its own, and does not hang: the parent's
    sessions are never destroyed there (one with intra-op threads waited in its destructor for the
    parent's threads, which a fork leaves behind)."""
    import os
    import select

    monkeypatch.setattr(conv_ort, "MIN_MACS", 0)
    model, x = _model(case, np.random.default_rng(5))
    session = IntegerSession(model, threads=2)
    want = session.run(None, {"x": x})[0]
    assert conv_ort._SESSIONS
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no inherited session, and the same output from new ones
        ok = not conv_ort._SESSIONS and np.array_equal(session.run(None, {"x": x})[0], want)
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 60)
    if not ready:
        os.kill(pid, 9)
    answer = os.read(read, 1) if ready else b""
    os.waitpid(pid, 0)
    assert answer == b"1", "the forked child hung" if not ready else "the forked child's output differs"


@pytest.mark.parametrize("way", ["sparse", "dense"])
def test_a_correction_on_two_threads_equals_one_thread(way: str, monkeypatch) -> None:
    """On two threads the chunks (and the sparse search before them, or the dense correction made once
    by whichever chunk comes first) give the same output and saturation counts as one thread, and
    as the numpy paths."""
    force_way(monkeypatch, way)
    model, x = _model("dense-3x3", np.random.default_rng(3))
    monkeypatch.setattr(conv_ort, "MIN_MACS", 0)
    monkeypatch.setattr(conv_core, "MIN_PARALLEL_MACS", 0)

    def run(threads: int) -> tuple[np.ndarray, dict[int, int]]:
        counter = pairs.SaturationCounter()
        with pairs.counting(counter):
            out = IntegerSession(model, scheme="onnxruntime-avx2", threads=threads).run(None, {"x": x})[0]
        (node,) = counter.nodes.values()
        return out, node.per_record

    want, want_counts = run(1)
    got, counts = run(2)
    assert_same(got, want, "two threads")
    assert counts == want_counts and sum(counts.values()) > 0
    monkeypatch.setattr(conv_ort, "MIN_MACS", 1 << 60)
    numpy_paths = IntegerSession(model, scheme="onnxruntime-avx2", threads=2).run(None, {"x": x})[0]
    assert_same(got, numpy_paths, "the numpy paths")
    exact = IntegerSession(model, scheme="onnxruntime-vnni", threads=2).run(None, {"x": x})[0]
    assert not np.array_equal(got, exact), "some pairs saturate: the search found something to add"


def _empty_input_model(
    c: int,
    m: int,
    spatial: tuple[int, int],
    kernel: tuple[int, int],
    pads: list[int],
    x_zp: int = 230,
    group: int = 1,
):
    """A QLinearConv whose uint8 input has a zero-size side but padding: every output reads only padding.
    With ``x_zp`` 0 the weights are all -128: ARM64's int16 pairs of (-128)(-128) wrap."""
    rng = np.random.default_rng(11)
    per_group = (m, c // group, *kernel)
    weights = random_q(rng, np.int8, per_group) if x_zp else np.full(per_group, -128, np.int8)
    inits = {
        "xs": f32(0.02), "xz": np.array(x_zp, np.uint8), "w": weights,
        "ws": f32(0.004), "wz": np.array(0, np.int8), "ys": f32(0.7), "yz": np.array(128, np.uint8),
    }  # fmt: skip
    shape = (2, c, *spatial)
    model = node_model(
        "QLinearConv", [("x", np.uint8, shape)], inits, np.uint8, kernel_shape=list(kernel), pads=pads, group=group
    )
    return model, np.zeros(shape, np.uint8)


EMPTY_INPUTS = {
    # name: (channels, outputs, input (h, w), kernel, pads)
    "no-rows-1x1": (8, 6, (0, 5), (1, 1), [1, 1, 1, 1]),
    "no-columns-1x1": (8, 6, (4, 0), (1, 1), [1, 2, 1, 0]),
    "no-rows-1x3": (16, 4, (0, 6), (1, 3), [2, 1, 1, 1]),
}  # fmt: skip


def _padding_only(case: str, x_zp: int) -> tuple[onnx.ModelProto, np.ndarray, onnx.ModelProto, np.ndarray]:
    """The model of a padding-only input, and the oracle: the same convolution, unpadded, on an input of
    the padded shape filled with the zero point (every output reads the same values)."""
    depthwise = case.startswith("depthwise")
    c, m, spatial, kernel, pads = (8, 8, (0, 5), (3, 3), [2, 1, 2, 1]) if depthwise else EMPTY_INPUTS[case]
    group = c if depthwise else 1
    model, x = _empty_input_model(c, m, spatial, kernel, pads, x_zp=x_zp, group=group)
    padded = (spatial[0] + pads[0] + pads[2], spatial[1] + pads[1] + pads[3])
    oracle, _ = _empty_input_model(c, m, padded, kernel, [0, 0, 0, 0], x_zp=x_zp, group=group)
    return model, x, oracle, np.full((2, c, *padded), x_zp, np.uint8)


PADDING_ONLY = [
    # (case, preset, x zero point): AVX2's u8 x s8 pairs saturate on a zero point of 230 and random
    # weights; ARM64's int16 pairs of (-128)(-128) wrap on a zero point of 0 (flipped to -128) and -128
    # weights, in the GEMM without dot products and in the depthwise kernel of every ARM64 CPU
    *[(case, "onnxruntime-avx2", 230) for case in EMPTY_INPUTS],
    ("no-rows-1x3", "onnxruntime-arm64-neon", 0),  # (1x1 kernels: no pair of the emulation wraps)
    ("depthwise-no-rows-3x3", "onnxruntime-arm64", 0),
]


@pytest.mark.parametrize("way", ["sparse", "dense"])
@pytest.mark.parametrize(("case", "preset", "x_zp"), PADDING_ONLY)
def test_an_input_of_padding_only_saturates_as_its_zero_points(
    case: str, preset: str, x_zp: int, way: str, monkeypatch
) -> None:
    """An input with no pixel gives outputs where padding makes room for them; their int16 pairs read
    the zero point and saturate (x86 without VNNI) or wrap (ARM64) as any others (measured with
    onnxruntime 1.32 on qemu's Haswell, Cortex-A53 and Neoverse-N1: the emulation had skipped the
    corrections for an empty input)."""
    force_way(monkeypatch, way)
    model, x, oracle, filled = _padding_only(case, x_zp)
    got = IntegerSession(model, scheme=preset).run(None, {"x": x})[0]
    assert_same(got, IntegerSession(oracle, scheme=preset).run(None, {"x": filled})[0], case)
    exact = IntegerSession(model, scheme="onnxruntime-vnni").run(None, {"x": x})[0]
    assert not np.array_equal(got, exact), "the weights make some pairs saturate or wrap"
    assert (exact == 128).all(), "exact sums of (zp - zp) are 0: the output zero point"


@pytest.mark.parametrize("x_zp", [230, 0])
@pytest.mark.parametrize("case", [*EMPTY_INPUTS, "depthwise-no-rows-3x3"])
def test_an_input_of_padding_only_matches_the_hosts_onnxruntime(case: str, x_zp: int) -> None:
    """The same models against this host's onnxruntime with the host's preset (``.ci/avx2`` runs this
    file on an emulated AVX2 CPU too, where onnxruntime saturates the pairs; zero point 0 and -128
    weights: the pairs ARM64's NEON kernel wraps)."""
    model, x, _, _ = _padding_only(case, x_zp)
    got = IntegerSession(model, scheme="onnxruntime").run(None, {"x": x})[0]
    assert_same(got, ort_run(model, {"x": x})[0], case)


@pytest.mark.parametrize(
    ("spatial", "kernel", "pads"),
    [((0, 5), (3, 3), [1, 1, 1, 1]), ((5, 0), (3, 3), [1, 1, 1, 1]), ((1, 1), (3, 3), [0, 0, 0, 0])],
)
def test_a_convolution_without_output_positions_is_refused_like_onnxruntime(spatial, kernel, pads) -> None:
    """onnxruntime refuses a convolution whose output would have no position on some axis ("Invalid
    input shape"), even where the other axis is empty too; the emulation had returned an empty output
    or failed inside numpy."""
    model, x = _empty_input_model(4, 4, spatial, kernel, pads)
    with pytest.raises(Exception, match="Invalid input shape"):
        ort_run(model, {"x": x})
    with pytest.raises(KernelError, match=r"leaves no output position"):
        IntegerSession(model, scheme="onnxruntime").run(None, {"x": x})
