"""Unit tests of the backend's plumbing: schemes, the kernel registry, the host probe, the heap, the
thread pool, and the graph rewrites (tables, int8 as uint8, weight groups, float weights quantized).

Expected values are worked by hand from the documented rules (each test says which), or come from
onnxruntime run on a one-node model.
"""

from __future__ import annotations

import importlib.metadata
import threading
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

try:  # onnx 1.19 and later depend on it (their numpy types of 4-bit tensors)
    import ml_dtypes
except ImportError:  # onnx < 1.19: no 4-bit numpy types (see test_narrow_types_need_an_onnx_with_their_numpy_dtypes)
    ml_dtypes = None

from pytest_qaccuracy.backend import graph as graph_module
from pytest_qaccuracy.backend import (
    heap,
    host,
    int8_to_uint8,
    parallel,
    registry,
    scheme,
    tables,
    weight_groups,
    weight_quantization,
)
from pytest_qaccuracy.backend.graph import Step, attribute_value, steps_from_graph, tensor_types
from pytest_qaccuracy.backend.scheme import FAMILIES, PRESETS, Scheme, get_scheme
from pytest_qaccuracy.errors import InputError, ModelError, QAccuracyError, UnsupportedOpError
from pytest_qaccuracy.presets import HOST, HOST_FAMILIES, NAMES

# --- scheme.py ---------------------------------------------------------------------------------


def test_a_scheme_refuses_an_unknown_accumulator_and_hints_at_pair_saturation() -> None:
    with pytest.raises(InputError) as plain:
        Scheme(name="mine", accumulator="int64")  # type: ignore[arg-type]
    assert str(plain.value) == "scheme 'mine': accumulator must be exact, wrap32 or saturate32, got 'int64'"
    with pytest.raises(InputError) as hinted:
        Scheme(name="old", accumulator="int16_pairs")  # type: ignore[arg-type]
    assert str(hinted.value) == (
        "scheme 'old': accumulator must be exact, wrap32 or saturate32, got 'int16_pairs'"
        " (the int16 pair sums of x86 CPUs without VNNI are pair_saturation=True)"
    )
    for accumulator in ("exact", "wrap32", "saturate32"):
        assert Scheme(accumulator=accumulator).accumulator == accumulator  # type: ignore[arg-type]


def test_a_scheme_refuses_unknown_op_families_and_lists_the_known_ones() -> None:
    with pytest.raises(InputError) as error:
        Scheme(name="s", zp_before_rounding=frozenset({"conv", "add", "bad"}))
    assert str(error.value) == f"scheme 's': unknown op families ['bad', 'conv']; known: {FAMILIES}"
    every = Scheme(zp_before_rounding=frozenset(FAMILIES))
    assert all(every.zp_first(family) for family in FAMILIES)
    some = Scheme(zp_before_rounding=frozenset({"add"}))
    assert some.zp_first("add") and not some.zp_first("mul") and not some.zp_first("gemm")


@pytest.mark.parametrize(
    ("bits", "reduce_range", "ok"),
    [(8, False, True), (9, True, True), (2, False, True), (3, True, True), (9, False, False), (1, False, False),
     (2, True, False), (10, True, False)],
)  # fmt: skip
def test_a_scheme_keeps_two_to_eight_weight_bits_after_reduce_range(bits: int, reduce_range: bool, ok: bool) -> None:
    """The bits left are ``weight_bits - reduce_range``; 2 to 8 are accepted."""
    if ok:
        assert Scheme(weight_bits=bits, reduce_range=reduce_range).weight_bits == bits
        return
    with pytest.raises(InputError) as error:
        Scheme(name="w", weight_bits=bits, reduce_range=reduce_range)
    assert str(error.value) == f"scheme 'w': weight_bits must leave 2..8 bits, got {bits}"


def test_double_rounding_needs_a_q31_multiplier() -> None:
    assert Scheme(multiplier="q31", double_rounding=True).double_rounding
    for multiplier in ("float32", "q15", "power2"):
        with pytest.raises(InputError) as error:
            Scheme(name="d", multiplier=multiplier, double_rounding=True)  # type: ignore[arg-type]
        assert str(error.value) == "scheme 'd': double_rounding needs multiplier='q31'"


def test_replace_names_the_copy_custom_unless_a_name_is_given() -> None:
    base = Scheme(name="base", rounding="floor")
    copy = base.replace(multiplier="q31")
    assert (copy.name, copy.multiplier, copy.rounding) == ("custom", "q31", "floor")
    assert base.multiplier == "float32"  # the original is unchanged
    assert base.replace(name="mine").name == "mine"
    with pytest.raises(InputError):
        base.replace(weight_bits=1)  # the copy is checked too


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        ({"onnxruntime": "1.23.2"}, (1, 23)),
        ({"onnxruntime": "1.20.0rc1"}, (1, 20)),
        ({"onnxruntime": "1.9"}, (1, 9)),
        ({"onnxruntime": "1.x"}, (1, 0)),
        ({"onnxruntime-gpu": "1.21.1"}, (1, 21)),
        ({"onnxruntime": "7", "onnxruntime-openvino": "1.22.0"}, (1, 22)),
        ({"onnxruntime-directml": "2.0.0"}, (2, 0)),
        ({}, (0, 0)),
    ],
)
def test_the_onnxruntime_version_is_read_from_the_first_installed_distribution(
    versions: dict[str, str], expected: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``major.minor`` of onnxruntime, -gpu, -openvino, -directml in that order; a version without a minor
    is skipped; none installed is (0, 0)."""

    def version(dist: str) -> str:
        if dist not in versions:
            raise importlib.metadata.PackageNotFoundError(dist)
        return versions[dist]

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert scheme._onnxruntime_version() == expected


def test_the_onnxruntime_version_prefers_the_plain_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    versions = {"onnxruntime": "1.18.0", "onnxruntime-gpu": "1.30.0", "onnxruntime-openvino": "1.31.0"}
    monkeypatch.setattr(importlib.metadata, "version", lambda dist: versions[dist])
    assert scheme._onnxruntime_version() == (1, 18)


@pytest.mark.parametrize(
    ("version", "quantizes"),
    [((1, 20), False), ((1, 21), True), ((1, 22), False), ((1, 23), True), ((2, 0), True), ((0, 0), False)],
)
def test_float_weights_are_quantized_from_onnxruntime_1_21_but_not_by_1_22(
    version: tuple[int, int], quantizes: bool
) -> None:
    assert scheme._quantizes_float_weights(version) is quantizes


def test_get_scheme_returns_a_scheme_a_preset_or_the_host_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    mine = Scheme(name="mine")
    assert get_scheme(mine) is mine
    assert get_scheme("tflite") is PRESETS["tflite"]
    monkeypatch.setattr(host, "host_preset", lambda: "onnxruntime-avx2")
    assert get_scheme(None) is PRESETS["onnxruntime-avx2"]
    assert get_scheme("onnxruntime") is PRESETS["onnxruntime-avx2"]
    with pytest.raises(InputError) as error:
        get_scheme("onnxruntime-sse")
    assert str(error.value) == "unknown scheme 'onnxruntime-sse'; presets: " + ", ".join(("onnxruntime", *PRESETS))
    assert error.value.__cause__ is None and error.value.__suppress_context__


def test_the_backend_defines_every_named_preset_but_the_hosts() -> None:
    assert (HOST, *PRESETS) == NAMES and HOST == "onnxruntime"
    assert set(HOST_FAMILIES) < set(PRESETS) and all(PRESETS[name].name == name for name in PRESETS)


# --- registry.py -------------------------------------------------------------------------------


@pytest.fixture
def empty_registry(monkeypatch: pytest.MonkeyPatch) -> dict:
    """A registry of its own, so that the test's kernels do not join the library's."""
    fresh: dict = {}
    monkeypatch.setattr(registry, "_REGISTRY", fresh)
    return fresh


def test_domains_ai_onnx_and_empty_are_one(empty_registry: dict) -> None:
    assert registry.normalize_domain("") == "" and registry.normalize_domain("ai.onnx") == ""
    assert registry.normalize_domain("com.microsoft") == "com.microsoft"

    def fn() -> tuple:
        return ()

    assert registry.kernel("ai.onnx", "Relu", 6)(fn) is fn
    (found,) = empty_registry[("", "Relu")]
    assert (found.domain, found.op_type, found.since, found.fn) == ("", "Relu", 6, fn)
    assert registry.find_kernel("", "Relu", 6) is found and registry.find_kernel("ai.onnx", "Relu", 7) is found


def test_kernels_are_found_by_the_newest_version_not_past_the_opset(empty_registry: dict) -> None:
    def v1() -> tuple:
        return (1,)

    def v13() -> tuple:
        return (13,)

    def v7() -> tuple:
        return (7,)

    registry.kernel("", "Op")(v1)  # since defaults to 1
    registry.kernel("", "Op", 13, scheme=True, float_op=True, outputs=True)(v13)
    registry.kernel("", "Op", 7)(v7)
    assert [k.since for k in empty_registry[("", "Op")]] == [1, 7, 13]
    assert registry.find_kernel("", "Op", 1).fn is v1
    assert registry.find_kernel("", "Op", 6).fn is v1
    assert registry.find_kernel("", "Op", 7).fn is v7
    assert registry.find_kernel("", "Op", 12).fn is v7
    assert registry.find_kernel("", "Op", 13).fn is v13
    assert registry.find_kernel("", "Op", 99).fn is v13
    assert registry.find_kernel("", "Op", 0) is None
    assert registry.find_kernel("", "Other", 13) is None
    assert registry.find_kernel("com.microsoft", "Op", 13) is None
    newest, oldest = registry.find_kernel("", "Op", 13), registry.find_kernel("", "Op", 1)
    assert (newest.needs_scheme, newest.float_op, newest.needs_outputs) == (True, True, True)
    assert (oldest.needs_scheme, oldest.float_op, oldest.needs_outputs) == (False, False, False)


def test_a_kernel_registered_twice_names_it(empty_registry: dict) -> None:
    registry.kernel("com.microsoft", "QLinearAdd", 1)(lambda: ())
    with pytest.raises(ValueError) as error:
        registry.kernel("com.microsoft", "QLinearAdd", 1)(lambda: ())
    assert str(error.value) == "kernel com.microsoft::QLinearAdd (since 1) registered twice"
    registry.kernel("", "Relu", 14)(lambda: ())
    with pytest.raises(ValueError) as error:
        registry.kernel("ai.onnx", "Relu", 14)(lambda: ())
    assert str(error.value) == "kernel ai.onnx::Relu (since 14) registered twice"
    with pytest.raises(ValueError) as error:
        registry.kernel("", "Relu", 14)(lambda: ())
    assert str(error.value) == "kernel ai.onnx::Relu (since 14) registered twice"
    registry.kernel("", "Relu", 6)(lambda: ())  # another version is fine
    assert len(empty_registry[("", "Relu")]) == 2


def test_available_lists_kernels_sorted_and_by_domain(empty_registry: dict) -> None:
    for domain, op in (("", "Relu"), ("com.microsoft", "QLinearAdd"), ("", "Add"), ("ai.onnx", "Abs")):
        registry.kernel(domain, op)(lambda: ())
    assert registry.available() == ["ai.onnx::Abs", "ai.onnx::Add", "ai.onnx::Relu", "com.microsoft::QLinearAdd"]
    assert registry.available("") == ["ai.onnx::Abs", "ai.onnx::Add", "ai.onnx::Relu"]
    assert registry.available("ai.onnx") == ["ai.onnx::Abs", "ai.onnx::Add", "ai.onnx::Relu"]
    assert registry.available("com.microsoft") == ["com.microsoft::QLinearAdd"]
    assert registry.available("org.other") == []


def test_unsupported_names_the_node_op_opset_and_the_domain_s_kernels(empty_registry: dict) -> None:
    registry.kernel("", "Relu")(lambda: ())
    registry.kernel("", "Add")(lambda: ())
    error = registry.unsupported("n1", "", "Foo", 17)
    assert isinstance(error, UnsupportedOpError)
    assert (
        str(error)
        == "node 'n1': no integer-backend kernel for ai.onnx::Foo at opset 17; kernels in this domain: Add, Relu"
    )
    error = registry.unsupported("n2", "org.x", "Bar", 1, "a reason")
    assert (
        str(error)
        == "node 'n2': no integer-backend kernel for org.x::Bar at opset 1 (a reason); kernels in this domain: none"
    )


# --- host.py -----------------------------------------------------------------------------------


@pytest.fixture
def fresh_host(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """host_preset's cache emptied before and after, no override in the environment."""
    monkeypatch.delenv(host.ENV_OVERRIDE, raising=False)
    host.host_preset.cache_clear()
    yield
    host.host_preset.cache_clear()


@pytest.mark.parametrize(("machine", "arm"), [("aarch64", True), ("ARM64", True), ("x86_64", False), ("armv7l", False)])
def test_arm64_is_aarch64_or_arm64_in_any_case(machine: str, arm: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host.platform, "machine", lambda: machine)
    assert host.is_arm64() is arm


@pytest.mark.parametrize(("value", "preset"), [(32767, "onnxruntime-avx2"), (64770, "onnxruntime-vnni")])
def test_the_x86_probe_names_the_preset(
    value: int, preset: str, fresh_host: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64770 = 2 * 255 * 127 exact, 32767 = the int16 pair saturated."""
    monkeypatch.setattr(host, "is_arm64", lambda: False)
    monkeypatch.setattr(host, "probe", lambda: value)
    assert host.host_preset() == preset
    monkeypatch.setattr(host, "probe", lambda: 0)
    assert host.host_preset() == preset  # once per process


@pytest.mark.parametrize(("value", "preset"), [(262144, "onnxruntime-arm64"), (-262144, "onnxruntime-arm64-neon")])
def test_the_arm64_probe_names_the_preset(
    value: int, preset: str, fresh_host: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 * 128 * 128 = 262144 exact; wrapped int16 pairs of 32768 give -262144."""
    monkeypatch.setattr(host, "is_arm64", lambda: True)
    monkeypatch.setattr(host, "arm64_probe", lambda: value)
    monkeypatch.setattr(host, "probe", lambda: pytest.fail("the x86 probe ran on ARM64"))
    assert host.host_preset() == preset


def test_an_unexpected_probe_answer_asks_for_the_override(fresh_host: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "is_arm64", lambda: False)
    monkeypatch.setattr(host, "probe", lambda: 12345)
    with pytest.raises(QAccuracyError) as error:
        host.host_preset()
    assert type(error.value) is QAccuracyError and error.value.__suppress_context__
    assert str(error.value) == (
        "onnxruntime's u8 x s8 MatMulInteger gave 12345 for 255*127 + 255*127 (expected 64770 with exact "
        "int32 sums or 32767 with int16 pair saturation): set QACCURACY_HOST_PRESET to the preset this machine needs"
    )
    host.host_preset.cache_clear()
    monkeypatch.setattr(host, "is_arm64", lambda: True)
    monkeypatch.setattr(host, "arm64_probe", lambda: 7)
    with pytest.raises(QAccuracyError) as error:
        host.host_preset()
    assert type(error.value) is QAccuracyError and error.value.__suppress_context__
    assert str(error.value) == (
        "onnxruntime's s8 x s8 MatMulInteger gave 7 for sixteen (-128)*(-128) (expected 262144 with "
        "exact sums or -262144 with wrapped int16 pairs): set QACCURACY_HOST_PRESET to the preset this machine needs"
    )


def test_the_override_wins_and_is_checked(fresh_host: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "probe", lambda: pytest.fail("probed despite the override"))
    monkeypatch.setattr(host, "arm64_probe", lambda: pytest.fail("probed despite the override"))
    for preset in HOST_FAMILIES:
        host.host_preset.cache_clear()
        monkeypatch.setenv(host.ENV_OVERRIDE, f" {preset}\n")
        assert host.host_preset() == preset
    host.host_preset.cache_clear()
    monkeypatch.setenv(host.ENV_OVERRIDE, "tflite")
    with pytest.raises(InputError) as error:
        host.host_preset()
    assert str(error.value) == (
        "QACCURACY_HOST_PRESET='tflite': expected one of onnxruntime-avx2, onnxruntime-vnni, onnxruntime-arm64, "
        "onnxruntime-arm64-neon"
    )
    host.host_preset.cache_clear()
    monkeypatch.setenv(host.ENV_OVERRIDE, "  ")  # blank: the probe decides
    monkeypatch.setattr(host, "is_arm64", lambda: False)
    monkeypatch.setattr(host, "probe", lambda: 32767)
    assert host.host_preset() == "onnxruntime-avx2"


def test_the_probes_run_onnxruntime_s_matmul_integer() -> None:
    """The x86 probe is 64770 (exact) or 32767 (saturated pair); s8 x s8 sums of sixteen 16384 are 262144
    on every x86 onnxruntime; and a small product is the exact integer product."""
    assert host.probe() in (64770, 32767)
    if not host.is_arm64():
        assert host.arm64_probe() == 16 * 128 * 128
    a = np.array([[3, -2, 5, 1]], np.int8)
    b = np.array([[2], [7], [-1], [4]], np.int8)
    assert host._matmul_integer(a, b) == 3 * 2 - 2 * 7 - 5 + 4
    assert host._matmul_integer(np.array([[1, 2]], np.uint8), np.array([[3], [4]], np.uint8)) == 11


# --- heap.py -----------------------------------------------------------------------------------


def test_mallopt_is_glibc_s_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap.platform, "system", lambda: "Linux")
    monkeypatch.setattr(heap.platform, "libc_ver", lambda: ("musl", "1.2"))
    assert heap._mallopt() is None
    monkeypatch.setattr(heap.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(heap.platform, "libc_ver", lambda: ("glibc", "2.36"))
    assert heap._mallopt() is None
    monkeypatch.setattr(heap.platform, "system", lambda: "Linux")

    class NoMallopt:
        def __init__(self, name: object) -> None:
            assert name is None

    monkeypatch.setattr(heap.ctypes, "CDLL", NoMallopt)
    assert heap._mallopt() is None

    def unloadable(name: object) -> None:
        raise OSError("no libc")

    monkeypatch.setattr(heap.ctypes, "CDLL", unloadable)
    assert heap._mallopt() is None

    class WithMallopt:
        def __init__(self, name: object) -> None:
            assert name is None
            self.mallopt = "the function"

    monkeypatch.setattr(heap.ctypes, "CDLL", WithMallopt)
    assert heap._mallopt() == "the function"


def test_the_real_mallopt_is_found_on_glibc() -> None:
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    assert callable(heap._mallopt())


def test_tuned_is_read_in_any_case_and_a_failed_mallopt_is_not_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(heap, "_mallopt", lambda: lambda param, value: calls.append((param, value)) or 1)
    monkeypatch.setattr(heap, "_applied", None)
    monkeypatch.setenv(heap.ENV, " TUNED ")
    assert heap.keep_temporaries_warm() is True
    assert calls == [(-3, 32 << 20), (-2, 64 << 20)]  # glibc's M_MMAP_THRESHOLD and M_TOP_PAD

    monkeypatch.setattr(heap, "_applied", None)
    monkeypatch.setenv(heap.ENV, "system")
    assert heap.keep_temporaries_warm() is False and heap._applied is False
    monkeypatch.setenv(heap.ENV, "tuned")
    assert heap.keep_temporaries_warm() is False  # decided once per process, by the first call
    assert len(calls) == 2

    for results, applied in (([0, 1], False), ([1, 0], False), ([1, 1], True)):
        answers = iter(results)
        monkeypatch.setattr(heap, "_mallopt", lambda answers=answers: lambda param, value: next(answers))
        monkeypatch.setattr(heap, "_applied", None)
        assert heap.keep_temporaries_warm() is applied
        assert heap._applied is applied

    monkeypatch.setenv(heap.ENV, "Fast")
    with pytest.raises(InputError) as error:
        heap.keep_temporaries_warm()
    assert str(error.value) == "QACCURACY_HEAP='Fast': expected 'tuned' or 'system'"


# --- parallel.py -------------------------------------------------------------------------------


def test_resolve_reads_zero_as_every_core_and_refuses_negatives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "available_cores", lambda: 6)
    assert parallel.resolve(0) == 6
    assert parallel.resolve(1) == 1 and parallel.resolve(3) == 3
    with pytest.raises(ValueError) as error:
        parallel.resolve(-1)
    assert str(error.value) == "threads must be >= 0, got -1"


def test_available_cores_is_the_affinity_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: {0, 2, 5})
    assert parallel.available_cores() == 3
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: set())
    assert parallel.available_cores() == 1


def test_using_sets_the_thread_count_for_this_thread_only_and_restores_it() -> None:
    assert parallel.current() == 1
    seen: list[int] = []
    with parallel.using(3):
        assert parallel.current() == 3
        other = threading.Thread(target=lambda: seen.append(parallel.current()))
        other.start()
        other.join()
        with parallel.using(2):
            assert parallel.current() == 2
        assert parallel.current() == 3
        with pytest.raises(KeyError), parallel.using(5):
            raise KeyError("inside")
        assert parallel.current() == 3
    assert parallel.current() == 1 and seen == [1]


@pytest.mark.parametrize(
    ("threads", "total", "cost", "expected"),
    [
        (1, 1 << 20, 1, [(0, 1 << 20)]),  # one thread
        (4, 1, 1 << 20, [(0, 1)]),  # one item
        (4, 0, 1, [(0, 0)]),
        (4, (1 << 16) - 1, 1, [(0, (1 << 16) - 1)]),  # just under the threshold
        (2, 1 << 16, 1, [(0, 1 << 15), (1 << 15, 1 << 16)]),  # just on it
        (3, 10, 1 << 14, [(0, 3), (3, 6), (6, 10)]),  # 10 * 3 // 3 ...: floor of total * i / parts
        (8, 3, 1 << 15, [(0, 1), (1, 2), (2, 3)]),  # no more parts than items
        (2, 5, 1 << 14, [(0, 2), (2, 5)]),
    ],
)
def test_split_gives_one_range_per_thread_when_the_work_is_worth_it(
    threads: int, total: int, cost: int, expected: list[tuple[int, int]]
) -> None:
    with parallel.using(threads):
        assert parallel.split(total, cost) == expected


def test_split_reads_the_cost_per_item() -> None:
    with parallel.using(2):
        assert parallel.split(4) == [(0, 4)]  # default cost 1: 4 elements are not worth a thread
        assert parallel.split(4, 1 << 14) == [(0, 2), (2, 4)]
        assert parallel.split(40_000) == [(0, 40_000)]  # 40,000 elements at cost 1: under 65,536
        assert parallel.split(40_000, 2) == [(0, 20_000), (20_000, 40_000)]
        assert parallel.split(2, 1 << 16) == [(0, 1), (1, 2)]  # two items are split


def test_split_records_costs_each_record_its_elements_and_takes_empty_arrays() -> None:
    with parallel.using(2):
        assert parallel.split_records((2, 128, 256)) == [(0, 1), (1, 2)]  # 32,768 elements a record
        assert parallel.split_records((2, 128, 255)) == [(0, 2)]  # under 65,536 in all
        assert parallel.split_records((0, 3, 4)) == [(0, 0)]  # no record
        assert parallel.split_records((5, 0, 4)) == [(0, 5)]  # records of no value (it read x[0].size)
        assert parallel.split_records((4,)) == [(0, 4)]


def test_scratch_buffers_are_reused_per_role_and_type_and_grow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "_scratch", threading.local())  # no buffer left by an earlier run
    a = parallel.scratch(10, np.int32, "unit-a")
    assert a.shape == (10,) and a.dtype == np.int32
    a[:] = 7
    again = parallel.scratch(4, np.int32, "unit-a")
    assert again.shape == (4,) and np.shares_memory(again, a) and (again == 7).all()
    same_size = parallel.scratch(10, np.int32, "unit-a")
    assert np.shares_memory(same_size, a)
    assert not np.shares_memory(parallel.scratch(10, np.int32, "unit-b"), a)
    assert not np.shares_memory(parallel.scratch(10, np.int64, "unit-a"), a)
    grown = parallel.scratch(11, np.int32, "unit-a")
    assert grown.shape == (11,) and not np.shares_memory(grown, a)
    assert np.shares_memory(parallel.scratch(5, np.dtype(np.int32), "unit-a"), grown)
    found: list[np.ndarray] = []
    other = threading.Thread(target=lambda: found.append(parallel.scratch(11, np.int32, "unit-a")))
    other.start()
    other.join()
    assert not np.shares_memory(found[0], grown)  # per thread


def test_blockwise_refuses_non_contiguous_or_mismatched_arrays() -> None:
    def fail(*args: np.ndarray) -> None:
        raise AssertionError("ran")

    base = np.zeros((4, 6))
    assert not parallel.blockwise(fail, base[:, ::2], np.ones((4, 3)))
    assert not parallel.blockwise(fail, np.zeros((4, 3)), np.ones((4, 6))[:, ::2])
    assert not parallel.blockwise(fail, np.zeros((4, 3)), np.ones((4, 3)), np.ones((3,)))
    assert not parallel.blockwise(fail, np.zeros((4, 3)), np.ones((3, 4)))
    out = np.zeros((4, 3))
    assert parallel.blockwise(lambda o: o.__setitem__(slice(None), 5.0), out)  # no inputs at all
    assert (out == 5).all()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_blockwise_covers_every_element_once_in_blocks(threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of BLOCK_ELEMENTS; with threads, runs of max(1, blocks // (4 * threads)) blocks per task."""
    monkeypatch.setattr(parallel, "BLOCK_ELEMENTS", 10)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 0)
    sizes: list[int] = []
    lock = threading.Lock()

    def fn(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        with lock:
            sizes.append(out.size)
        out += a * 10 + b

    a = np.arange(95, dtype=np.int64).reshape(5, 19)
    b = np.full((5, 19), 3, np.int64)
    out = np.ones((5, 19), np.int64)
    with parallel.using(threads):
        assert parallel.blockwise(fn, out, a, b)
    np.testing.assert_array_equal(out, 1 + a * 10 + 3)
    assert sorted(sizes) == [5] + [10] * 9


def test_blockwise_runs_small_arrays_on_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under MIN_PARALLEL_ELEMENTS (blocks * BLOCK_ELEMENTS) or with one thread: a plain loop here."""
    monkeypatch.setattr(parallel, "BLOCK_ELEMENTS", 10)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 30)
    monkeypatch.setattr(parallel, "run_all", lambda tasks: pytest.fail("handed to the pool"))
    seen: set[int] = set()

    def fn(out: np.ndarray) -> None:
        seen.add(threading.get_ident())
        out[:] = 1

    with parallel.using(4):
        out = np.zeros(25)  # 3 blocks of 10: 30 elements of blocks, not under 30, but ...
        with pytest.raises(pytest.fail.Exception):
            parallel.blockwise(fn, out)
        out = np.zeros(20)  # 2 blocks: 20 < 30
        assert parallel.blockwise(fn, out) and (out == 1).all()
    out = np.zeros(100)
    assert parallel.blockwise(fn, out) and (out == 1).all()  # one thread
    assert seen == {threading.get_ident()}


def test_blockwise_hands_out_runs_of_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "BLOCK_ELEMENTS", 1)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 0)
    handed: list[int] = []
    real = parallel.run_all

    def run_all(tasks):
        handed.append(len(tasks))
        return real(tasks)

    monkeypatch.setattr(parallel, "run_all", run_all)
    out = np.zeros(40)
    with parallel.using(2):
        parallel.blockwise(lambda o: o.__setitem__(slice(None), 1.0), out)
    assert handed == [8] and (out == 1).all()  # runs of 40 // (4 * 2) = 5 blocks
    handed.clear()
    with parallel.using(3):
        parallel.blockwise(lambda o: o.__setitem__(slice(None), 2.0), np.zeros(5))
    assert handed == [5]  # 5 // 12 = 0: runs of one block


def test_run_all_runs_on_at_most_the_tasks_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    real = parallel._executor
    monkeypatch.setattr(parallel, "_executor", lambda size: sizes.append(size) or real(size))
    with parallel.using(4):
        assert parallel.run_all([lambda: 1]) == [1]  # one task: no pool
        assert parallel.run_all([]) == []
        assert parallel.run_all([lambda: 1, lambda: 2]) == [1, 2]
        assert parallel.run_all([lambda i=i: i for i in range(9)]) == list(range(9))
    assert sizes == [1, 3]


def test_the_pool_grows_and_is_rebuilt_after_a_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "_pool", None)
    monkeypatch.setattr(parallel, "_pool_size", 0)
    first = parallel._executor(2)
    assert parallel._pool is first and parallel._pool_size == 2 and parallel._pool_pid == parallel.os.getpid()
    assert first._max_workers == 2
    assert first.submit(lambda: threading.current_thread().name).result().startswith("qaccuracy-kernel")
    assert parallel._executor(1) is first and parallel._executor(2) is first
    bigger = parallel._executor(3)
    assert bigger is not first and parallel._pool_size == 3 and bigger._max_workers == 3
    with pytest.raises(RuntimeError):
        first.submit(lambda: None)  # the old pool was shut down
    monkeypatch.setattr(parallel, "_pool_pid", -1)  # as if built by a parent process
    child = parallel._executor(1)
    assert child is not bigger and parallel._pool_size == 1
    assert bigger.submit(lambda: 5).result() == 5  # a parent's pool is left alone
    bigger.shutdown()
    child.shutdown()


def test_a_forked_child_renews_the_locks() -> None:
    old_pool_lock, old_blas_lock = parallel._pool_lock, parallel.blas_threads._lock
    users = parallel.blas_threads._users
    try:
        parallel.blas_threads._users = 3
        parallel._after_fork_in_child()
        assert parallel._pool_lock is not old_pool_lock and parallel.blas_threads._lock is not old_blas_lock
        for lock in (parallel._pool_lock, parallel.blas_threads._lock):
            assert lock.acquire(blocking=False)  # a fresh, free lock
            lock.release()
        assert parallel.blas_threads._users == 0
    finally:
        parallel._pool_lock, parallel.blas_threads._lock = old_pool_lock, old_blas_lock
        parallel.blas_threads._users = users


def test_blas_threads_are_held_at_one_and_restored_by_the_last_user() -> None:
    state = {"threads": 4}
    log: list[int] = []

    def set_threads(n: int) -> None:
        log.append(n)
        state["threads"] = n

    blas = parallel._BlasThreads()
    blas._calls = (lambda: state["threads"], set_threads)
    with blas.single():
        assert state["threads"] == 1
        with blas.single():
            assert state["threads"] == 1
        assert state["threads"] == 1 and blas._users == 1
    assert state["threads"] == 4 and blas._users == 0 and log == [1, 4]
    with pytest.raises(KeyError), blas.single():
        raise KeyError("in a chunk")
    assert state["threads"] == 4 and blas._users == 0


def test_without_a_known_blas_nothing_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    blas = parallel._BlasThreads()
    monkeypatch.setattr(blas, "_find", lambda: None)
    with blas.single():
        assert blas._users == 1
    assert blas._users == 0 and blas._calls is None


# --- graph.py ----------------------------------------------------------------------------------


def test_a_step_describes_itself_with_its_domain_and_fused_nodes() -> None:
    step = Step("conv", "", "Conv", ["x"], ["y"])
    assert step.describe() == "node 'conv' (ai.onnx::Conv)"
    assert step.attrs == {} and step.proto is None and step.fused == () and step.group == ()
    fused = Step("g", "ai.qaccuracy", "QGemm", ["x"], ["y"], fused=("dq", "gemm", "q"))
    assert fused.describe() == "node 'g' (ai.qaccuracy::QGemm) (fused from dq, gemm, q)"
    assert Step("a", "", "Relu", [], []).attrs is not Step("b", "", "Relu", [], []).attrs


def test_attribute_values_are_python_values() -> None:
    node = helper.make_node(
        "Op", ["x"], ["y"], i=3, f=0.5, s="text", ints=[1, 2], strings=["a", "bé"],
        t=numpy_helper.from_array(np.array([1, 2], np.int8)),
    )  # fmt: skip
    values = {a.name: attribute_value(a) for a in node.attribute}
    assert values["i"] == 3 and values["f"] == 0.5 and values["ints"] == [1, 2]
    assert values["s"] == "text" and isinstance(values["s"], str)
    assert values["strings"] == ["a", "bé"]
    assert isinstance(values["t"], np.ndarray) and values["t"].dtype == np.int8 and values["t"].tolist() == [1, 2]


def test_steps_are_the_graph_s_nodes_named_by_op_and_index_when_unnamed() -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"]),
            helper.make_node("LeakyRelu", ["a"], ["b"], name="leaky", alpha=0.25),
            helper.make_node("QLinearAdd", ["b", "", "c"], ["y"], domain="com.microsoft"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    relu, leaky, add = steps_from_graph(graph)
    assert (relu.name, relu.domain, relu.op_type, relu.inputs, relu.outputs) == ("Relu_0", "", "Relu", ["x"], ["a"])
    assert leaky.name == "leaky" and leaky.attrs == {"alpha": 0.25} and leaky.proto is graph.node[1]
    assert (add.name, add.domain, add.inputs) == ("QLinearAdd_2", "com.microsoft", ["b", "", "c"])


def test_tensor_types_come_from_inputs_outputs_inference_and_initializers() -> None:
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["c"], to=TensorProto.INT32), helper.make_node("Add", ["c", "k"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [2])],
        [numpy_helper.from_array(np.array([1, 2], np.int32), "k")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    types = tensor_types(model)
    assert types == {"x": np.float16, "c": np.int32, "y": np.int32, "k": np.int32}
    assert all(isinstance(t, np.dtype) for t in types.values())


def test_tensor_types_fall_back_to_the_declared_ones_when_inference_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [2]), helper.make_tensor_value_info("u", 0, None)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("inference failed")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", broken)
    assert tensor_types(model) == {"x": np.uint8, "y": np.uint8}  # no inferred "r"; "u" has no type


def test_tensor_types_read_inference_leniently(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict = {}
    real = onnx.shape_inference.infer_shapes

    def spy(model: onnx.ModelProto, **kwargs: object) -> onnx.ModelProto:
        seen.update(kwargs)
        return real(model, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", spy)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    tensor_types(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert seen == {"strict_mode": False}


def test_narrow_types_need_an_onnx_with_their_numpy_dtypes(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    if graph_module.NARROW_TYPES_SUPPORTED:  # onnx 1.19 or later; before, the refusal below is the real path
        assert tensor_types(model)["x"] == np.dtype(helper.tensor_dtype_to_np_dtype(TensorProto.FLOAT8E4M3FN))
    monkeypatch.setattr(graph_module, "NARROW_TYPES_SUPPORTED", False)
    with pytest.raises(ModelError) as error:
        tensor_types(model)
    assert str(error.value) == (
        "tensor 'x' is FLOAT8E4M3FN: float8, 4-bit, 2-bit and float4 tensors need onnx >= 1.19 "
        f"(onnx {onnx.__version__} has no numpy dtype for them)"
    )
    init_only = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [helper.make_tensor("w", TensorProto.INT4, [2], [1, -2])],
    )
    with pytest.raises(ModelError, match=r"^tensor 'w' is INT4: "):
        tensor_types(helper.make_model(init_only, opset_imports=[helper.make_opsetid("", 21)]))
    graph_module._check_representable("fine", TensorProto.FLOAT)  # other types pass


# --- int8_to_uint8.py --------------------------------------------------------------------------

U8_ZP = "qaccuracy::zp:uint8"  # the converted zero point's name: INTERNAL_PREFIX + zero point + ":uint8"


def _q(name: str, x: str, y: str, zp: str = "zp", scale: str = "s", **attrs: object) -> Step:
    return Step(name, "", "QuantizeLinear", [x, scale, zp], [y], dict(attrs))


def _dq(name: str, x: str, y: str, zp: str = "zp", scale: str = "s", **attrs: object) -> Step:
    return Step(name, "", "DequantizeLinear", [x, scale, zp], [y], dict(attrs))


def _pair_constants(zp: int = -3) -> dict[str, np.ndarray]:
    return {"s": np.array(0.1, np.float32), "zp": np.array(zp, np.int8)}


def _convert(steps: list[Step], constants: dict | None = None, keep: set[str] | None = None):
    types = {"x": np.dtype(np.float32), "t": np.dtype(np.int8)}
    return int8_to_uint8.convert(steps, constants or _pair_constants(), types, keep or set())


@pytest.mark.parametrize(("zp", "shifted"), [(-3, 125), (-128, 0), (127, 255), (0, 128)])
def test_an_int8_activation_pair_runs_as_uint8_with_the_zero_point_plus_128(zp: int, shifted: int) -> None:
    q = _q("q", "x", "t", axis=1)
    q.proto = helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["t"], name="q")
    dq = Step("dq", "ai.onnx", "DequantizeLinear", ["t", "s", "zp"], ["d"], {"axis": 1}, proto=None)
    relu = Step("relu", "", "Relu", ["d"], ["y"])
    steps, added, types, converted = _convert([q, dq, relu], _pair_constants(zp), keep={"y"})
    new_q, new_dq, same_relu = steps
    assert same_relu is relu and converted == {"t"}
    assert new_q.proto is q.proto and new_dq.proto is None  # the node kept for messages and fallbacks
    assert list(added) == [U8_ZP] and added[U8_ZP].dtype == np.uint8 and int(added[U8_ZP]) == shifted
    assert types == {"x": np.float32, "t": np.uint8}
    assert (new_q.name, new_q.op_type, new_q.inputs, new_q.outputs, new_q.attrs) == (
        "q", "QuantizeLinear", ["x", "s", U8_ZP], ["t"], {"axis": 1},
    )  # fmt: skip
    assert (new_dq.name, new_dq.domain, new_dq.inputs, new_dq.outputs) == ("dq", "ai.onnx", ["t", "s", U8_ZP], ["d"])
    assert q.inputs == ["x", "s", "zp"] and dq.inputs == ["t", "s", "zp"]  # the given steps are left as they were


def test_as_model_type_gives_back_the_int8_values() -> None:
    got = int8_to_uint8.as_model_type(np.array([0, 1, 127, 128, 129, 255], np.uint8))
    assert got.dtype == np.int8 and got.tolist() == [-128, -127, -1, 0, 1, 127]
    assert int8_to_uint8.as_model_type(np.array([[125]], np.int64)).tolist() == [[-3]]


def _unconverted(steps: list[Step], constants: dict | None = None, keep: set[str] | None = None) -> bool:
    new, added, types, converted = _convert(steps, constants, keep)
    return (
        all(a is b for a, b in zip(new, steps, strict=True)) and not added and not converted and types["t"] == np.int8
    )


def test_pairs_that_onnxruntime_leaves_as_int8() -> None:
    relu = Step("relu", "", "Relu", ["d"], ["y"])
    pair = [_q("q", "x", "t"), _dq("dq", "t", "d"), relu]
    assert not _unconverted(pair)
    assert _unconverted([Step("q", "", "QuantizeLinear", ["x", "s"], ["t"]), _dq("dq", "t", "d"), relu])  # no zp
    assert _unconverted([_q("q", "x", "t", zp="nope"), _dq("dq", "t", "d", zp="nope"), relu])  # zp not constant
    uint8 = {"s": np.array(0.1, np.float32), "zp": np.array(3, np.uint8)}
    assert _unconverted(pair, uint8)
    assert _unconverted(pair, keep={"t"})  # the quantized tensor is asked for
    assert _unconverted([*pair, Step("other", "", "Relu", ["t"], ["o"])])  # two readers of t
    assert _unconverted([_q("q", "x", "t"), Step("r", "", "Relu", ["t"], ["d"]), relu])  # not a DequantizeLinear
    assert _unconverted(
        [_q("q", "x", "t"), _dq("dq", "s2", "d", scale="t"), relu], {**_pair_constants(), "s2": np.ones(1, np.float32)}
    )
    ms = Step("dq", "com.microsoft", "DequantizeLinear", ["t", "s", "zp"], ["d"])
    assert _unconverted([_q("q", "x", "t"), ms, relu])  # another domain
    assert _unconverted(
        [Step("q", "com.microsoft", "QuantizeLinear", ["x", "s", "zp"], ["t"]), _dq("dq", "t", "d"), relu]
    )
    assert _unconverted([_q("q", "x", "t"), Step("dq", "", "DequantizeLinear", ["t", "s", "zp"], [""]), relu])
    assert _unconverted([_q("q", "x", "t"), _dq("dq", "t", "d"), relu, Step("r2", "", "Relu", ["d"], ["z"])])


def test_the_dequantize_must_use_the_same_scale_zero_point_and_axis() -> None:
    relu = Step("relu", "", "Relu", ["d"], ["y"])
    base = _pair_constants()
    same_values = {**base, "s2": np.array(0.1, np.float32), "zp2": np.array(-3, np.int8)}
    assert not _unconverted([_q("q", "x", "t"), _dq("dq", "t", "d", zp="zp2", scale="s2"), relu], same_values)
    other_scale = {**base, "s2": np.array(0.2, np.float32)}
    assert _unconverted([_q("q", "x", "t"), _dq("dq", "t", "d", scale="s2"), relu], other_scale)
    other_zp = {**base, "zp2": np.array(-2, np.int8)}
    assert _unconverted([_q("q", "x", "t"), _dq("dq", "t", "d", zp="zp2"), relu], other_zp)
    other_type = {**base, "s2": np.array(0.1, np.float64)}
    assert _unconverted([_q("q", "x", "t"), _dq("dq", "t", "d", scale="s2"), relu], other_type)
    assert _unconverted([_q("q", "x", "t"), _dq("dq", "t", "d", scale="unknown"), relu])  # not a constant
    assert _unconverted([_q("q", "x", "t", scale="unknown"), _dq("dq", "t", "d"), relu])
    assert _unconverted([_q("q", "x", "t"), Step("dq", "", "DequantizeLinear", ["t", "s"], ["d"]), relu])
    assert _unconverted([_q("q", "x", "t", axis=0), _dq("dq", "t", "d"), relu])
    assert _unconverted([_q("q", "x", "t"), _dq("dq", "t", "d", axis=0), relu])
    assert not _unconverted([_q("q", "x", "t", axis=1), _dq("dq", "t", "d"), relu])  # 1 is the default axis
    assert not _unconverted([_q("q", "x", "t"), _dq("dq", "t", "d", axis=1), relu])


def test_identity_and_redundant_pairs_after_the_dequantize_are_looked_through() -> None:
    """``Q -> DQ -> Identity -> Q' -> DQ'`` is ``Q -> DQ'`` for onnxruntime: DQ' must then have one
    reader, not be kept, and be read at all."""
    chain = [
        _q("q", "x", "t"),
        _dq("dq", "t", "d"),
        Step("id", "", "Identity", ["d"], ["i"]),
        _q("q2", "i", "t2"),
        _dq("dq2", "t2", "d2"),
    ]
    relu = Step("relu", "", "Relu", ["d2"], ["y"])
    assert _converted([*chain, relu]) == {"t", "t2"}
    assert _converted([*chain, relu], keep={"d2"}) == {"t2"}  # a plain pair's output may be kept
    assert _converted(chain) == {"t2"}  # d2 read by nobody
    assert _converted([*chain, relu, Step("r2", "", "Relu", ["d2"], ["z"])]) == set()
    # a different second scale: not redundant, so the first pair stands for itself (d read by one step)
    other = {**_pair_constants(), "s9": np.array(0.5, np.float32)}
    chain9 = [*chain[:3], _q("q2", "i", "t2", scale="s9"), _dq("dq2", "t2", "d2", scale="s9"), relu]
    assert _converted(chain9, other) == {"t", "t2"}
    # Q' read by a Relu: the pair stops at DQ
    assert _converted([*chain[:4], Step("r", "", "Relu", ["t2"], ["y"])]) == {"t"}
    # Q' read twice: DQ stands for itself, read once through the Identity
    assert _converted([*chain, relu, Step("r3", "", "Relu", ["t2"], ["z"])]) == {"t"}
    # Q' read by nobody (a graph output): DQ stands for itself
    assert _converted(chain[:4], keep={"t2"}) == {"t"}
    # an Identity read twice ends the look-through at DQ
    twice = [*chain, relu, Step("r4", "", "Relu", ["i"], ["z"])]
    assert _converted(twice) == {"t", "t2"}


def _converted(steps: list[Step], constants: dict | None = None, keep: set[str] | None = None) -> set[str]:
    return int8_to_uint8.convert(steps, constants or _pair_constants(), {}, keep or set())[3]


def test_the_redundant_pairs_are_followed_for_64_steps_at_most() -> None:
    n = 70
    steps = [_q("q", "x", "t0"), _dq("dq", "t0", "d0")]
    for i in range(1, n):
        steps += [_q(f"q{i}", f"d{i - 1}", f"t{i}"), _dq(f"dq{i}", f"t{i}", f"d{i}")]
    steps.append(Step("relu", "", "Relu", [f"d{n - 1}"], ["y"]))
    consumers: dict[str, list[Step]] = {}
    for s in steps:
        for name in s.inputs:
            consumers.setdefault(name, []).append(s)
    end = int8_to_uint8._after_redundant_pairs(steps[1], consumers, _pair_constants())
    assert end.name == "dq64"
    short = [*steps[:20], Step("relu", "", "Relu", ["d9"], ["y"])]
    consumers = {}
    for s in short:
        for name in s.inputs:
            consumers.setdefault(name, []).append(s)
    assert int8_to_uint8._after_redundant_pairs(short[1], consumers, _pair_constants()).name == "dq9"


# --- weight_quantization.py --------------------------------------------------------------------
# onnxruntime's WeightBiasQuantization: scale = (max(w, 0) - min(w, 0)) / 255 in float32, zero point
# rint(-128 - min / scale), weights rint(w / scale) + zero point; bias rint(b / (s_x * s_w)) as int32.
# The weights below have a range of 255 / 16, so the scale is exactly 1/16 and the values are exact.

WQ = "qaccuracy::conv_weight_"  # INTERNAL_PREFIX + node name + _weight_ + part
BQ = "qaccuracy::conv_bias_"


def _float_conv(w: np.ndarray, bias: np.ndarray | None = None, op: str = "Conv") -> tuple[list[Step], dict]:
    constants = {"sx": np.array(0.5, np.float32), "zx": np.array(0, np.uint8), "w": w}
    inputs = ["x", "w"]
    if bias is not None:
        constants["b"] = bias
        inputs.append("b")
    steps = [
        _dq("dqx", "xq", "x", zp="zx", scale="sx"),
        Step("conv", "", op, inputs, ["y"]),
        _q("qy", "y", "yq", zp="zx", scale="sx"),
    ]
    return steps, constants


def _quantize_weights(steps: list[Step], constants: dict, scheme_: Scheme | None = None) -> list[Step]:
    return weight_quantization.quantize_float_weights(steps, constants, scheme_ or Scheme())


@pytest.mark.parametrize(
    ("w", "zero_point", "quantized"),
    [
        ([-8.0, 7.9375, 0.0, 1.0], 0, [-128, 127, 0, 16]),  # min -8: -128 - (-128) = 0
        ([-0.5, 15.4375, 0.25], -120, [-128, 127, -116]),  # -128 + 8
        ([0.0, 15.9375, 0.09375], -128, [-128, 127, -126]),  # 1.5 -> 2 (half to even)
        ([0.03125, 15.9375], -128, [-128, 127]),  # all positive: the range still starts at 0
        ([-0.03125, 15.90625], -128, [-128, 126]),  # zero point -127.5 to even: -128; 254.5 to even
        ([-0.09375, 15.84375], -126, [-128, 127]),  # -126.5 to even: -126
    ],
)
def test_a_float_weight_gets_onnxruntime_s_asymmetric_int8_parameters(
    w: list[float], zero_point: int, quantized: list[int]
) -> None:
    steps, constants = _float_conv(np.array(w, np.float32))
    out = _quantize_weights(steps, constants)
    assert [s.name for s in out] == ["dqx", "conv_weight_dq", "conv", "qy"]
    dq = out[1]
    assert (dq.domain, dq.op_type, dq.attrs, dq.proto, dq.fused) == ("", "DequantizeLinear", {}, None, ("conv",))
    assert dq.inputs == [WQ + "q", WQ + "scale", WQ + "zp"] and dq.outputs == [WQ + "dq"]
    assert out[2].inputs == ["x", WQ + "dq"]
    assert constants[WQ + "scale"].dtype == np.float32 and float(constants[WQ + "scale"]) == 1 / 16
    assert constants[WQ + "zp"].dtype == np.int8 and int(constants[WQ + "zp"]) == zero_point
    assert constants[WQ + "q"].dtype == np.int8 and constants[WQ + "q"].tolist() == quantized


def test_the_weights_round_as_the_scheme_says() -> None:
    """2.5 steps: half to even gives 2, half away from zero 3."""
    w = np.array([0.0, 15.9375, 0.15625], np.float32)
    for rounding, third in (("half_even", -126), ("half_away", -125)):
        steps, constants = _float_conv(w.copy())
        _quantize_weights(steps, constants, Scheme(quantize_rounding=rounding))  # type: ignore[arg-type]
        assert constants[WQ + "q"].tolist() == [-128, 127, third]


def test_a_weight_of_zeros_has_scale_one() -> None:
    steps, constants = _float_conv(np.zeros((2, 2), np.float32))
    _quantize_weights(steps, constants)
    assert float(constants[WQ + "scale"]) == 1.0 and int(constants[WQ + "zp"]) == -128
    assert constants[WQ + "q"].tolist() == [[-128, -128], [-128, -128]]


def test_the_bias_is_int32_at_the_input_scale_times_the_weight_scale() -> None:
    """s_x = 0.5, s_w = 1/16: the bias step is 1/32; 0.3 * 32 = 9.6 -> 10, -1 -> -32, 0.046875 * 32 = 1.5 -> 2."""
    steps, constants = _float_conv(np.array([-8.0, 7.9375], np.float32), np.array([0.3, -1.0, 0.046875], np.float32))
    out = _quantize_weights(steps, constants)
    assert [s.name for s in out] == ["dqx", "conv_weight_dq", "conv_bias_dq", "conv", "qy"]
    bias_dq = out[2]
    assert bias_dq.inputs == [BQ + "int32", BQ + "scale"] and bias_dq.outputs == [BQ + "dq"]
    assert (bias_dq.domain, bias_dq.op_type, bias_dq.attrs, bias_dq.fused) == ("", "DequantizeLinear", {}, ("conv",))
    assert bias_dq.name == "conv_bias_dq" and bias_dq.proto is None
    assert out[3].inputs == ["x", WQ + "dq", BQ + "dq"]
    assert constants[BQ + "int32"].dtype == np.int32 and constants[BQ + "int32"].tolist() == [10, -32, 2]
    assert constants[BQ + "scale"].dtype == np.float32 and constants[BQ + "scale"].shape == ()
    assert float(constants[BQ + "scale"]) == 1 / 32


def test_a_one_element_input_scale_gives_a_scalar_bias_scale() -> None:
    steps, constants = _float_conv(np.array([-8.0, 7.9375], np.float32), np.array([1.0], np.float32))
    constants["sx"] = np.array([0.5], np.float32)  # shape (1,): one scale all the same
    out = _quantize_weights(steps, constants)
    assert constants[BQ + "scale"].shape == () and out[2].attrs == {}
    assert constants[BQ + "int32"].tolist() == [32]


def test_int8_weights_already_dequantized_get_only_their_bias_quantized() -> None:
    steps, constants = _float_conv(np.array([1.0], np.float32), np.array([1.0, 0.5], np.float32))
    constants.update(
        {"wq": np.array([3, -4], np.int8), "sw": np.array([0.25], np.float32), "zw": np.array([0], np.int8)}
    )
    steps[1].inputs[1] = "wd"
    steps.insert(1, _dq("dqw", "wq", "wd", zp="zw", scale="sw"))
    out = _quantize_weights(steps, constants)
    assert [s.name for s in out] == ["dqx", "dqw", "conv_bias_dq", "conv", "qy"]
    assert out[2].attrs == {"axis": 0}  # a 1-D weight scale of one value: a 1-D bias scale
    assert constants[BQ + "scale"].tolist() == [0.125]
    assert constants[BQ + "int32"].tolist() == [8, 4]
    assert out[3].inputs == ["x", "wd", BQ + "dq"]
    # without a bias, or with per-channel weights, nothing changes
    steps, constants = _float_conv(np.array([1.0], np.float32))
    constants.update({"wq": np.array([3, -4], np.int8), "sw": np.array(0.25, np.float32), "zw": np.array(0, np.int8)})
    steps[1].inputs[1] = "wd"
    steps.insert(1, _dq("dqw", "wq", "wd", zp="zw", scale="sw"))
    assert [s.name for s in _quantize_weights(steps, constants)] == ["dqx", "dqw", "conv", "qy"]
    steps, constants = _float_conv(np.array([1.0], np.float32), np.array([1.0, 0.5], np.float32))
    constants.update(
        {"wq": np.array([3, -4], np.int8), "sw": np.array([0.25, 0.5], np.float32), "zw": np.array([0, 0], np.int8)}
    )
    steps[1].inputs[1] = "wd"
    steps.insert(1, _dq("dqw", "wq", "wd", zp="zw", scale="sw"))
    assert [s.name for s in _quantize_weights(steps, constants)] == ["dqx", "dqw", "conv", "qy"]
    assert steps[2].inputs == ["x", "wd", "b"]


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose", "Gemm"])
def test_conv_conv_transpose_and_gemm_are_rewritten_and_other_ops_not(op: str) -> None:
    steps, constants = _float_conv(np.array([1.0, -1.0], np.float32), op=op)
    assert len(_quantize_weights(steps, constants)) == 4
    steps, constants = _float_conv(np.array([1.0, -1.0], np.float32), op="MatMul")
    assert len(_quantize_weights(steps, constants)) == 3
    steps, constants = _float_conv(np.array([1.0, -1.0], np.float32), op=op)
    steps[1].domain = "com.microsoft"
    assert len(_quantize_weights(steps, constants)) == 3


def _untouched(steps: list[Step], constants: dict) -> bool:
    before = [list(s.inputs) for s in steps]
    out = _quantize_weights(steps, constants)
    return [s.name for s in out] == [s.name for s in steps] and [list(s.inputs) for s in steps] == before


def test_float_weights_stay_float_unless_onnxruntime_s_conditions_hold() -> None:
    w = np.array([1.0, -1.0], np.float32)
    steps, constants = _float_conv(w)
    steps[0] = Step("relu0", "", "Relu", ["xq"], ["x"])  # the input is not dequantized
    assert _untouched(steps, constants)
    steps, constants = _float_conv(w)
    steps.pop(0)  # a graph input
    assert _untouched(steps, constants)
    steps, constants = _float_conv(w)
    constants["sx"] = np.array([0.5, 0.25], np.float32)  # a per-channel input scale
    assert _untouched(steps, constants)
    steps, constants = _float_conv(w)
    del constants["sx"]  # an input scale that is not a constant
    assert _untouched(steps, constants)
    steps, constants = _float_conv(w.astype(np.float64))
    assert _untouched(steps, constants)
    steps, constants = _float_conv(w)
    steps[1].inputs[1] = "runtime_w"  # a weight computed at run time
    assert _untouched(steps, constants)
    steps, constants = _float_conv(w, np.ones((2, 1), np.float32))  # a 2-D bias
    assert _untouched(steps, constants)
    steps, constants = _float_conv(w, np.ones(2, np.float32))
    steps[1].inputs[2] = "runtime_b"  # a bias computed at run time
    assert _untouched(steps, constants)
    steps, constants = _float_conv(w)
    steps[1].inputs.append("")  # an empty bias name is no bias
    assert not _untouched(steps, constants)


def test_the_output_must_reach_a_quantize_through_relu_or_clip_only() -> None:
    w = np.array([1.0, -1.0], np.float32)

    def ends_with(*tail: Step) -> bool:
        steps, constants = _float_conv(w)
        steps[2:] = list(tail)
        return not _untouched(steps, constants)

    q = _q("qy", "r2", "yq")
    assert ends_with(Step("r", "", "Relu", ["y"], ["r1"]), Step("c", "", "Clip", ["r1"], ["r2"]), q)
    assert not ends_with(Step("r", "", "Sigmoid", ["y"], ["r1"]), Step("c", "", "Clip", ["r1"], ["r2"]), q)
    assert not ends_with(Step("r", "", "Relu", ["y"], ["r1"]), Step("c", "", "Clip", ["r1"], ["r2"]))  # no Q
    assert not ends_with(
        Step("r", "", "Relu", ["y"], ["r1"]),
        Step("c", "", "Clip", ["r1"], ["r2"]),
        q,
        Step("o", "", "Relu", ["r1"], ["z"]),
    )  # r1 read twice
    assert not ends_with(Step("r", "", "Relu", ["y"], ["r1", "extra"]), _q("qy", "r1", "yq"))  # two outputs
    assert not ends_with(_q("qy", "y", "yq"), Step("o", "", "Relu", ["y"], ["z"]))  # y read twice


# --- weight_groups.py --------------------------------------------------------------------------


def _weight_constants() -> dict[str, np.ndarray]:
    return {
        "wq": np.array([[1, -2], [3, 4]], np.int8), "sw": np.array(0.5, np.float32), "zw": np.array(0, np.int8),
        "bq": np.array([10, -10], np.int32), "sb": np.array(0.25, np.float32), "c": np.ones(2, np.float32),
    }  # fmt: skip


def _mm(op: str = "MatMul", inputs: tuple[str, ...] = ("x", "wd"), out: str = "y", domain: str = "") -> Step:
    return Step("mm", domain, op, list(inputs), [out], {"transB": 0} if op == "Gemm" else {})


def test_a_matmul_on_dequantized_constants_becomes_one_group_step() -> None:
    wdq = Step("wdq", "", "DequantizeLinear", ["wq", "sw", "zw"], ["wd"])
    mm = _mm()
    mm.proto = helper.make_node("MatMul", ["x", "wd"], ["y"], name="mm")
    relu = Step("relu", "", "Relu", ["y"], ["z"])
    grouped = weight_groups.group_weights([wdq, mm, relu], _weight_constants(), {"z"})
    assert len(grouped) == 2 and grouped[1] is relu
    step = grouped[0]
    assert (step.name, step.domain, step.op_type, step.inputs, step.outputs) == ("mm", "", "MatMul", ["x"], ["y"])
    assert step.fused == ("wdq", "mm") and step.group == (wdq, mm) and step.proto is mm.proto
    assert mm.inputs == ["x", "wd"]  # the original step is kept as it was


def test_a_gemm_s_bias_dequantize_joins_the_group() -> None:
    wdq = Step("wdq", "ai.onnx", "DequantizeLinear", ["wq", "sw", "zw"], ["wd"])
    bdq = Step("bdq", "", "DequantizeLinear", ["bq", "sb"], ["bd"])
    gemm = _mm("Gemm", ("x", "wd", "bd"))
    (step,) = weight_groups.group_weights([wdq, bdq, gemm], _weight_constants(), {"y"})
    assert step.inputs == ["x"] and step.fused == ("wdq", "bdq", "mm") and step.group == (wdq, bdq, gemm)
    assert step.attrs == {"transB": 0}
    # a bias also read elsewhere, or kept, stays as a step too
    other = Step("other", "", "Relu", ["bd"], ["o"])
    grouped = weight_groups.group_weights([wdq, bdq, gemm, other], _weight_constants(), {"y", "o"})
    assert [s.name for s in grouped] == ["bdq", "mm", "other"] and grouped[1].fused == ("wdq", "bdq", "mm")
    grouped = weight_groups.group_weights([wdq, bdq, gemm], _weight_constants(), {"y", "bd"})
    assert [s.name for s in grouped] == ["bdq", "mm"] and grouped[1].fused == ("wdq", "bdq", "mm")
    # a float constant bias is no DequantizeLinear: the group has the weight only, and reads no constant
    (step,) = weight_groups.group_weights([wdq, _mm("Gemm", ("x", "wd", "c"))], _weight_constants(), {"y"})
    assert step.fused == ("wdq", "mm") and step.inputs == ["x"]
    # a bias that is the activation itself: read once in the merged step
    (step,) = weight_groups.group_weights([wdq, _mm("Gemm", ("x", "wd", "x"))], _weight_constants(), {"y"})
    assert step.inputs == ["x"]
    # a bias computed at run time is an input of the group
    relu = Step("r", "", "Relu", ["x"], ["rb"])
    grouped = weight_groups.group_weights([relu, wdq, _mm("Gemm", ("x", "wd", "rb"))], _weight_constants(), {"y"})
    assert grouped[1].inputs == ["x", "rb"] and grouped[1].fused == ("wdq", "mm")


def test_weights_that_stay_float_gemms() -> None:
    constants = _weight_constants()
    wdq = Step("wdq", "", "DequantizeLinear", ["wq", "sw", "zw"], ["wd"])

    def ungrouped(steps: list[Step], keep: set[str]) -> bool:
        return all(not s.group for s in weight_groups.group_weights(steps, constants, keep))

    assert not ungrouped([wdq, _mm()], {"y"})
    assert not ungrouped([wdq, _mm(domain="ai.onnx")], {"y"})
    assert ungrouped([wdq, _mm(), Step("r", "", "Relu", ["wd"], ["o"])], {"y", "o"})  # two readers
    assert ungrouped([wdq, _mm()], {"y", "wd"})  # the weights are asked for
    assert ungrouped([wdq, _mm(), Step("r", "", "Relu", ["y"], ["o"])], {"y", "o"})  # kept and read
    assert not ungrouped([wdq, _mm(), Step("r", "", "Relu", ["y"], ["o"])], {"o"})
    assert ungrouped([wdq, _mm(domain="com.microsoft")], {"y"})
    assert ungrouped([wdq, _mm("Conv")], {"y"})
    assert ungrouped([wdq, Step("mm", "", "MatMul", ["wd"], ["y"])], {"y"})  # one input
    assert ungrouped([wdq, _mm(inputs=("wd", "x"))], {"y"})  # the constant is the first operand
    assert ungrouped([Step("wdq", "", "DequantizeLinear", ["x", "sw", "zw"], ["wd"]), _mm(inputs=("c", "wd"))], {"y"})
    assert ungrouped([Step("wdq", "", "Relu", ["c"], ["wd"]), _mm()], {"y"})
    assert ungrouped([Step("wdq", "org.other", "DequantizeLinear", ["wq", "sw", "zw"], ["wd"]), _mm()], {"y"})
    ms = Step("wdq", "com.microsoft", "DequantizeLinear", ["wq", "sw", "zw"], ["wd"])
    assert not ungrouped([ms, _mm()], {"y"})  # onnxruntime's own DequantizeLinear on int8
    if ml_dtypes is not None:  # 4-bit weights exist as numpy arrays only with onnx >= 1.19
        int4 = {**constants, "w4": np.zeros((2, 2), ml_dtypes.int4)}
        ms4 = Step("wdq", "com.microsoft", "DequantizeLinear", ["w4", "sw"], ["wd"])
        assert all(not s.group for s in weight_groups.group_weights([ms4, _mm()], int4, {"y"}))  # no numpy type
        for domain in ("", "ai.onnx"):
            std4 = Step("wdq", domain, "DequantizeLinear", ["w4", "sw"], ["wd"])
            assert any(s.group for s in weight_groups.group_weights([std4, _mm()], int4, {"y"}))
    no_zp = Step("wdq", "", "DequantizeLinear", ["wq", "sw", ""], ["wd"])
    assert not ungrouped([no_zp, _mm()], {"y"})  # an empty optional input is no varying input


def test_a_group_runs_on_onnxruntime_as_its_own_model() -> None:
    """x @ (wq * 0.5) + bq * 0.25 worked by hand, on activations that onnxruntime's int8 blocks hold
    exactly (scale max|x| / 127): x = [1, 127] gives [0.5 + 190.5 + 2.5, -1 + 254 - 2.5]."""
    constants = _weight_constants()
    wdq = Step("wdq", "", "DequantizeLinear", ["wq", "sw", "zw"], ["wd"])
    bdq = Step("bdq", "", "DequantizeLinear", ["bq", "sb"], ["bd"], proto=helper.make_node(
        "DequantizeLinear", ["bq", "sb"], ["bd"], name="bdq", doc_string="the model's own node"))  # fmt: skip
    gemm = Step("mm", "", "Gemm", ["x", "wd", "bd"], ["y"], {"alpha": 1.0})
    (step,) = weight_groups.group_weights([wdq, bdq, gemm], constants, {"y"})
    initializers = {name: numpy_helper.from_array(value, name) for name, value in constants.items()}
    model = weight_groups.group_model(step.group, ["x"], {"x": np.float32}, initializers, {"": 17}, 8)
    assert [n.name for n in model.graph.node] == ["wdq", "bdq", "mm"] and model.graph.node[1] == bdq.proto
    assert model.graph.node[1].doc_string == "the model's own node" and model.graph.node[0].doc_string == ""
    assert model.graph.node[2].attribute[0].f == 1.0
    assert sorted(i.name for i in model.graph.initializer) == ["bq", "sb", "sw", "wq", "zw"]
    assert [i.name for i in model.graph.input] == ["x"] and model.graph.input[0].type.tensor_type.elem_type == 1
    assert [o.name for o in model.graph.output] == ["y"] and model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    runner = weight_groups.OnnxruntimeGroup(step, {"x": np.float32}, initializers, {"": 17}, 8, threads=1)
    assert list(runner._sessions) == [("<f4",)]  # built at once: the input type is known
    (y,) = runner([np.array([[1.0, 127.0]], np.float32)])
    np.testing.assert_array_equal(y, [[193.5, 250.5]])
    assert len(runner._sessions) == 1
    lazy = weight_groups.OnnxruntimeGroup(step, {}, initializers, {"": 17}, 8, threads=1)
    assert lazy._sessions == {}
    (y,) = lazy([np.array([[2.0, 0.0]], np.float32)])
    np.testing.assert_array_equal(y, [[3.5, -4.5]])
    assert list(lazy._sessions) == [("<f4",)]


def test_a_refused_group_is_named_in_one_line() -> None:
    import onnxruntime

    wdq = Step("wdq", "", "DequantizeLinear", ["wq", "sw", "zw"], ["wd"])
    (step,) = weight_groups.group_weights([wdq, _mm()], _weight_constants(), {"y"})
    types = {"wq": np.dtype(np.int8), "x": np.dtype(np.int16)}
    message = weight_groups.refusal(step, ["com.microsoft::MatMulNBits"], types, "onnxruntime-avx2", "onnxruntime-vnni")
    assert message == (
        "node 'mm' (ai.onnx::MatMul, int8 weights from DequantizeLinear 'wdq', activations int16): onnxruntime "
        f"{onnxruntime.__version__} runs it as com.microsoft::MatMulNBits, whose CPU-specific int8 block arithmetic "
        "the integer backend emulates only under this machine's preset 'onnxruntime-vnni', not 'onnxruntime-avx2'"
    )
    message = weight_groups.refusal(step, ["a", "b"], {}, "s", "h")
    assert "(ai.onnx::MatMul, ? weights from DequantizeLinear 'wdq'): onnxruntime" in message
    assert "runs it as a, b, whose" in message


def test_rewritten_outputs_are_empty_when_onnxruntime_cannot_load_the_model() -> None:
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"], domain="org.nowhere")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("org.nowhere", 1)])
    assert weight_groups.rewritten_outputs(model, {}) == {}
    plain = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    assert (
        weight_groups.rewritten_outputs(helper.make_model(plain, opset_imports=[helper.make_opsetid("", 17)]), {}) == {}
    )


# --- tables.py ---------------------------------------------------------------------------------

ISLAND_CONSTANTS = {
    "s": np.array(0.05, np.float32), "z": np.array(3, np.uint8), "six": np.array(6.0, np.float32),
    "vec": np.array([1.0, 2.0], np.float32), "s2": np.array(0.01, np.float32), "z2": np.array(0, np.uint8),
}  # fmt: skip


def _island(middle: Step | None = None) -> list[Step]:
    """``DequantizeLinear -> middle -> QuantizeLinear``."""
    middle = middle or Step("div", "", "Div", ["f", "six"], ["g"])
    return [_dq("dq", "x", "f", zp="z"), middle, _q("q", "g", "y", zp="z2", scale="s2")]


def _chains(steps: list[Step], keep: set[str] | None = None) -> list[list[int]]:
    return tables.find_chains(steps, ISLAND_CONSTANTS, {"y"} if keep is None else keep)


def test_a_float_island_is_one_chain() -> None:
    assert _chains(_island()) == [[0, 1, 2]]
    assert _chains(_island(Step("t", "ai.onnx", "Tanh", ["f"], ["g"]))) == [[0, 1, 2]]
    onnx_domain = _island()
    onnx_domain[0].domain = "ai.onnx"
    assert _chains(onnx_domain) == [[0, 1, 2]]
    assert _chains(_island(Step("c", "", "Cast", ["f"], ["g"], {"to": TensorProto.FLOAT16}))) == [[0, 1, 2]]
    assert _chains(_island(Step("m", "", "Max", ["f", "six", "f"], ["g"]))) == [[0, 1, 2]]  # f read twice


def test_steps_that_end_or_break_a_chain() -> None:
    assert _chains(_island(Step("c", "", "Cast", ["f"], ["g"], {"to": TensorProto.INT32}))) == []
    assert _chains(_island(Step("d", "", "Div", ["f", "vec"], ["g"]))) == []  # a constant of two values
    assert _chains(_island(Step("d", "", "Div", ["f", "other"], ["g"]))) == []  # a varying second operand
    assert _chains(_island(Step("c", "", "Conv", ["f", "six"], ["g"]))) == []
    assert _chains(_island(Step("t", "", "TopK", ["f", "six"], ["g", "i"]))) == []  # two outputs
    assert _chains(_island(Step("t", "", "Tanh", ["f"], ["g", "i"]))) == []
    assert _chains(_island(Step("t", "", "Tanh", ["f"], ["", "g"]))) == []  # its first output unnamed
    assert _chains(_island(Step("t", "", "Tanh", ["f"], [""]))) == []
    assert _chains(_island(Step("t", "org.other", "Tanh", ["f"], ["g"]))) == []
    assert _chains(_island(Step("c", "com.microsoft", "QLinearConv", ["f", "six"], ["g"]))) == []
    # the tensor between two steps asked for: the chain stops before it
    assert _chains(_island(), keep={"y", "g"}) == [[0, 1]]
    assert _chains(_island(), keep={"y", "f"}) == []
    # read by a step outside: the same
    assert _chains([*_island(), Step("r", "", "Relu", ["g"], ["o"])], keep={"y", "o"}) == [[0, 1]]


def test_a_chain_starts_at_a_dequantize_or_a_quantized_op_on_one_varying_tensor() -> None:
    relu_start = [Step("r", "", "Relu", ["x"], ["f"]), *_island()[1:]]
    assert _chains(relu_start) == []  # neither the Relu nor the Div reads an 8-bit tensor
    two_varying = [_dq("dq", "x", "f", zp="z", scale="live"), *_island()[1:]]
    assert _chains(two_varying) == []
    ms_dq = [Step("dq", "com.microsoft", "DequantizeLinear", ["x", "s", "z"], ["f"]), *_island()[1:]]
    assert _chains(ms_dq) == []  # not in QUANTIZED_ELEMENTWISE
    qadd = Step("a", "com.microsoft", "QLinearAdd", ["x", "s", "z", "c1", "s", "z", "s2", "z2"], ["f"])
    constants = {**ISLAND_CONSTANTS, "c1": np.array([5], np.uint8)}
    steps = [qadd, Step("t", "", "Tanh", ["f"], ["y"])]
    assert tables.find_chains(steps, constants, {"y"}) == [[0, 1]]
    lone = [_dq("dq", "x", "f", zp="z"), Step("c", "", "Conv", ["f", "six"], ["y"])]
    assert _chains(lone) == []  # a chain of one step is no table


def test_a_diamond_on_the_source_is_one_region() -> None:
    """``x * hardsigmoid(x)``: the last step reads the source and the group's own tensor."""
    constants = {**ISLAND_CONSTANTS, "c": np.array(1, np.uint8)}
    steps = [
        _dq("dq", "x", "f", zp="z"),
        Step("hs", "", "HardSigmoid", ["f"], ["h"]),
        _q("q", "h", "hq", zp="z2", scale="s2"),
        Step("mul", "com.microsoft", "QLinearMul", ["x", "s", "z", "hq", "s2", "z2", "s", "z"], ["y"]),
    ]
    assert tables.find_chains(steps, constants, {"y"}) == [[0, 1, 2, 3]]
    # a second reader of the source that is not in the group is skipped, not a break
    other = [*steps[:3], _dq("dq2", "x", "e", zp="z"), steps[3], Step("r", "", "Relu", ["e"], ["o"])]
    assert tables.find_chains(other, constants, {"y", "o"}) == [[0, 1, 2, 4], [3, 5]]


def test_a_chain_table_runs_the_steps_once_per_type_and_then_looks_up() -> None:
    """Steps ``f = x * 2`` (as int16) then ``y = f + c``: the table holds 2 * v + c for every byte v."""
    calls: list[str] = []

    def double(args: list) -> tuple:
        calls.append("double")
        assert args[1] is None  # an absent optional input
        return (args[0].astype(np.int16) * 2,)

    def add(args: list) -> tuple:
        calls.append("add")
        return (args[0] + args[1], "unused second output")

    steps = [Step("a", "", "Mul", ["x", ""], ["f"]), Step("b", "", "Add", ["f", "c"], ["y", "extra"])]
    table = tables.ChainTable(steps, [double, add])
    constants = {"c": np.int16(5)}
    assert tables.varying_input(steps[0], constants) == "x"
    x = np.array([[0, 1], [255, 128]], np.uint8)
    np.testing.assert_array_equal(table.apply(x, constants), [[5, 7], [515, 261]])
    np.testing.assert_array_equal(table.apply(x[::-1], constants), [[515, 261], [5, 7]])
    assert calls == ["double", "add"]  # the uint8 table was built once
    built = table.table(np.dtype(np.uint8), constants)
    assert built.shape == (256,) and built.flags.c_contiguous and built[3] == 11
    signed = np.array([-128, -1, 0, 127], np.int8)
    np.testing.assert_array_equal(table.apply(signed, constants), [-251, 3, 5, 259])
    assert calls == ["double", "add"] * 2 and set(table._tables) == {np.dtype(np.uint8), np.dtype(np.int8)}
    wide = np.array([1000, -3], np.int32)  # not 8-bit: the steps themselves
    np.testing.assert_array_equal(table.apply(wide, constants), [2005, -1])
    assert calls == ["double", "add"] * 3 and len(table._tables) == 2


def test_varying_input_is_the_one_non_constant_input() -> None:
    constants = {"s": np.ones(1)}
    assert tables.varying_input(Step("a", "", "Add", ["x", "s", ""], ["y"]), constants) == "x"
    assert tables.varying_input(Step("a", "", "Add", ["x", "x"], ["y"]), constants) == "x"
    assert tables.varying_input(Step("a", "", "Add", ["x", "w"], ["y"]), constants) is None
    assert tables.varying_input(Step("a", "", "Add", ["s", ""], ["y"]), constants) is None


def test_openblas_is_found_among_the_loaded_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first library (by path) of /proc/self/maps named openblas with a get/set pair of any of the
    known names; libraries that fail to load or lack the pair are passed over."""
    import ctypes
    import io

    maps = (
        "7f0-7f1 r-xp 0 08:01 1 /lib/libOpenBLAS.so.0\n"
        "7f1-7f2 r-xp 0 08:01 2 /lib/a_openblas_broken.so\n"
        "7f2-7f3 r-xp 0 08:01 3 /lib/a1_openblas_getter_only.so\n"
        "7f3-7f4 r-xp 0 08:01 4 /lib/0libc.so.6\n"
        "7f4-7f5 r-xp 0 08:01 5 /lib/0openblas.txt\n"
        "7f5-7f6 rw-p 0 00:00 0\n"
    )
    opened: list[str] = []

    def fake_open(path: str, encoding: str) -> io.StringIO:
        assert (path, encoding) == ("/proc/self/maps", "utf-8")
        return io.StringIO(maps)

    class Lib:
        def __init__(self, path: str) -> None:
            opened.append(path)
            if "broken" in path:
                raise OSError("cannot load")
            self.openblas_get_num_threads64_ = lambda: 3
            if "getter_only" not in path:
                self.openblas_set_num_threads64_ = lambda n: None

    monkeypatch.setattr(parallel, "open", fake_open, raising=False)
    monkeypatch.setattr(ctypes, "CDLL", Lib)
    found = parallel._BlasThreads()._find()
    assert found is not None and found[0]() == 3
    assert found[0].restype is ctypes.c_int
    # sorted by path, libc and the .txt passed over, the getter-only library loaded but not taken
    assert opened == ["/lib/a1_openblas_getter_only.so", "/lib/a_openblas_broken.so", "/lib/libOpenBLAS.so.0"]

    for names in (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                  ("openblas_get_num_threads", "openblas_set_num_threads")):  # fmt: skip

        class Named:
            def __init__(self, path: str, names: tuple[str, str] = names) -> None:
                setattr(self, names[0], lambda: 2)
                setattr(self, names[1], lambda n: None)

        monkeypatch.setattr(ctypes, "CDLL", Named)
        assert parallel._BlasThreads()._find()[0]() == 2

    monkeypatch.setattr(ctypes, "CDLL", lambda path: type("Nothing", (), {})())
    assert parallel._BlasThreads()._find() is None

    def unreadable(path: str, encoding: str) -> None:
        raise OSError("no /proc")

    monkeypatch.setattr(parallel, "open", unreadable, raising=False)
    assert parallel._BlasThreads()._find() is None


def test_numpy_s_openblas_is_found_by_its_scipy_name() -> None:
    found = parallel._BlasThreads()._find()
    if found is None:
        pytest.skip("numpy is not built against OpenBLAS here")
    assert found[0].__name__ in (
        "scipy_openblas_get_num_threads64_",
        "openblas_get_num_threads64_",
        "openblas_get_num_threads",
    )
    assert found[0]() >= 1


def test_blas_is_looked_for_once(monkeypatch: pytest.MonkeyPatch) -> None:
    blas = parallel._BlasThreads()
    looks: list[int] = []
    monkeypatch.setattr(blas, "_find", lambda: looks.append(1))
    for _ in range(3):
        with blas.single():
            pass
    assert looks == [1]


def test_a_quantize_without_zero_point_after_the_pair_is_no_redundant_pair() -> None:
    """``Q(zp int8) -> DQ -> Q'(no zero point: uint8 0) -> DQ'``: the second pair is not the first one's
    twin, and the session runs it as onnxruntime does (it raised a ValueError from a zip before)."""
    steps = [
        _q("q", "x", "t"),
        _dq("dq", "t", "d"),
        Step("q2", "", "QuantizeLinear", ["d", "s"], ["u"]),
        Step("dq2", "", "DequantizeLinear", ["u", "s"], ["y"]),
    ]
    assert _converted(steps, keep={"y"}) == {"t"}
    import onnxruntime as ort

    from pytest_qaccuracy.backend import IntegerSession

    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.int8(-3), "zp")]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["t"]),
        helper.make_node("DequantizeLinear", ["t", "s", "zp"], ["d"]),
        helper.make_node("QuantizeLinear", ["d", "s"], ["u"]),
        helper.make_node("DequantizeLinear", ["u", "s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = np.linspace(-8, 8, 10, dtype=np.float32).reshape(2, 5)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (got,) = IntegerSession(model).run(None, {"x": x})
    np.testing.assert_array_equal(got, want)


def test_a_group_session_is_built_with_the_group_s_threads_and_all_optimizations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[dict] = []
    real = weight_groups.make_session

    def spy(model: onnx.ModelProto, **kwargs: object) -> object:
        calls.append(kwargs)
        return real(model, **kwargs)

    monkeypatch.setattr(weight_groups, "make_session", spy)
    constants = _weight_constants()
    wdq = Step("wdq", "com.microsoft", "DequantizeLinear", ["wq", "sw", "zw"], ["wd"])
    (step,) = weight_groups.group_weights([wdq, _mm()], constants, {"y"})
    initializers = {name: numpy_helper.from_array(value, name) for name, value in constants.items()}
    model = weight_groups.group_model(
        step.group, ["x"], {"x": np.float32}, initializers, {"": 17, "com.microsoft": 1}, 8
    )
    assert model.graph.node[0].domain == "com.microsoft"  # a step without its node keeps its domain
    runner = weight_groups.OnnxruntimeGroup(step, {"x": np.float32}, initializers, {"": 17, "com.microsoft": 1}, 8, 3)
    assert calls == [{"providers": ("CPUExecutionProvider",), "threads": 3, "optimization": "all"}]
    (y,) = runner([np.array([[0.0, 127.0]], np.float32)])
    np.testing.assert_array_equal(y, [[190.5, 254.0]])  # 127 * [1.5, 2]

    calls.clear()
    plain = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    config = {"session.qdqisint8allowed": "1"}
    weight_groups.rewritten_outputs(helper.make_model(plain, opset_imports=[helper.make_opsetid("", 17)]), config)
    (kwargs,) = calls
    path = kwargs.pop("optimized_model_path")
    assert kwargs == {"providers": ("CPUExecutionProvider",), "threads": 1, "config": config}
    assert path.name == "optimized.onnx" and path.parent.name.startswith("qaccuracy-")
    assert not path.parent.exists()  # a temporary folder, removed


def test_the_host_probe_runs_one_thread_with_all_optimizations(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_qaccuracy import ort_session

    calls: list[dict] = []
    models: list[onnx.ModelProto] = []
    real = ort_session.make_session

    def spy(model: onnx.ModelProto, **kwargs: object) -> object:
        calls.append(kwargs)
        models.append(model)
        return real(model, **kwargs)

    monkeypatch.setattr(ort_session, "make_session", spy)
    assert host._matmul_integer(np.array([[2, 3]], np.uint8), np.array([[4], [5]], np.int8)) == 23
    assert calls == [{"providers": ("CPUExecutionProvider",), "threads": 1, "optimization": "all"}]
    (model,) = models
    onnx.checker.check_model(model, full_check=True)
    (node,) = model.graph.node
    assert (node.op_type, list(node.input), list(node.output)) == ("MatMulInteger", ["a", "b"], ["y"])
    assert model.ir_version == 8 and [(o.domain, o.version) for o in model.opset_import] == [("", 13)]
    assert [i.name for i in model.graph.initializer] == ["b"]
    y = model.graph.output[0].type.tensor_type
    assert y.elem_type == TensorProto.INT32 and [d.dim_value for d in y.shape.dim] == [1, 1]
    a = model.graph.input[0].type.tensor_type
    assert a.elem_type == TensorProto.UINT8 and [d.dim_value for d in a.shape.dim] == [1, 2]


def test_a_chain_table_is_flat_and_a_step_may_return_more_outputs_than_it_names() -> None:
    """A step broadcasting to (1, 256) still gives a 256-entry table; a kernel returning an output the
    node does not name (Dropout's mask) is fine."""

    def lift(args: list) -> tuple:
        return (args[0].astype(np.int16)[None, :] + 1, "mask")

    table = tables.ChainTable([Step("a", "", "Dropout", ["x"], ["y"])], [lift])
    got = table.table(np.dtype(np.uint8), {})
    assert got.shape == (256,) and got[255] == 256
    np.testing.assert_array_equal(table.apply(np.array([[3, 4]], np.uint8), {}), [[4, 5]])


def test_available_cores_falls_back_to_the_cpu_count_without_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(parallel.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 6)
    assert parallel.available_cores() == 6
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: None)  # unknown
    assert parallel.available_cores() == 1
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 0)
    assert parallel.available_cores() == 1


def test_a_straight_chain_is_taken_when_its_region_has_two_exits() -> None:
    """``h`` is read by the QuantizeLinear and by a Conv: the region leaves by two tensors, so the straight
    chain up to ``h`` is the table."""
    steps = [
        _dq("dq", "x", "f", zp="z"),
        Step("tanh", "", "Tanh", ["f"], ["g"]),
        Step("relu", "", "Relu", ["g"], ["h"]),
        _q("q", "h", "y", zp="z2", scale="s2"),
        Step("conv", "", "Conv", ["h", "six"], ["o"]),
    ]
    assert _chains(steps, keep={"y", "o"}) == [[0, 1, 2]]


def test_dequantized_weights_need_a_constant_per_tensor_scale() -> None:
    def with_weight_dq(scale: np.ndarray | None, zero_point: np.ndarray) -> list[str]:
        steps, constants = _float_conv(np.array([1.0], np.float32), np.array([1.0, 0.5], np.float32))
        constants.update({"wq": np.array([3, -4], np.int8), "zw": zero_point})
        if scale is not None:
            constants["sw"] = scale
        steps[1].inputs[1] = "wd"
        steps.insert(1, _dq("dqw", "wq", "wd", zp="zw", scale="sw"))
        return [s.name for s in _quantize_weights(steps, constants)]

    assert with_weight_dq(np.array(0.25, np.float32), np.array(0, np.int8)) == [
        "dqx",
        "dqw",
        "conv_bias_dq",
        "conv",
        "qy",
    ]
    assert with_weight_dq(None, np.array(0, np.int8)) == ["dqx", "dqw", "conv", "qy"]  # a scale computed at run time
    per_channel = np.array([0.25, 0.5], np.float32)
    assert with_weight_dq(per_channel, np.array(0, np.int8)) == ["dqx", "dqw", "conv", "qy"]  # read from the scale


def test_every_pair_is_looked_at_whatever_the_pairs_before_it() -> None:
    """Pairs left alone for each reason, then one converted: the pass goes on to the end."""
    constants = {**_pair_constants(), "zp8": np.array(5, np.uint8)}
    steps = [
        _q("q0", "x", "dangling"),  # read by nobody, not kept
        _q("q1", "x", "t1"),
        Step("r1", "", "Relu", ["t1"], ["o1"]),  # not a DequantizeLinear
        _q("q2", "x", "t2"),
        _dq("dq2", "t2", "d2"),
        Step("a2", "", "Relu", ["d2"], ["o2"]),
        Step("b2", "", "Relu", ["d2"], ["o3"]),  # the DequantizeLinear read twice
        _q("q3", "x", "t3"),
        _dq("dq3", "t3", "d3"),
        Step("id3", "", "Identity", ["d3"], ["i3"]),
        _q("q3b", "i3", "t3b"),
        _dq("dq3b", "t3b", "d3b"),  # a redundant pair ending on a kept tensor
        _q("q4", "x", "t4", zp="zp8"),  # uint8 already
        _q("q5", "x", "t5"),
        _dq("dq5", "t5", "d5"),
        Step("r5", "", "Relu", ["d5"], ["o5"]),
    ]
    assert _converted(steps, constants, keep={"o1", "o2", "o3", "d3b", "o5"}) == {"t3b", "t5"}


def test_a_sigmoid_times_its_input_is_one_region() -> None:
    """QOperator swish: ``QLinearMul(x, QLinearSigmoid(x))`` reads the source and every tensor of the group."""
    ms = "com.microsoft"
    steps = [
        Step("sig", ms, "QLinearSigmoid", ["x", "s", "z", "s2", "z2"], ["h"]),
        Step("mul", ms, "QLinearMul", ["x", "s", "z", "h", "s2", "z2", "s", "z"], ["y"]),
    ]
    assert _chains(steps) == [[0, 1]]


def test_tensor_types_leave_out_element_types_numpy_does_not_know() -> None:
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", 99, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [onnx.TensorProto(name="w", data_type=99, dims=[2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert tensor_types(model) == {"y": np.float32}
