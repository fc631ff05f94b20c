"""The ARM64 presets, on any host, against onnxruntime's aarch64 wheel run on emulated ARM64 CPUs.

``goldens/onnxruntime-arm64/`` holds what onnxruntime 1.32.0 computed under qemu-aarch64 with a default
session on three CPU models (its README): ``neon`` (Cortex-A53: no dot product), ``dotprod``
(Neoverse-N1: sdot/udot) and ``i8mm`` (qemu's ``max``: smmla/ummla and SVE), for the 125 models of the x86
goldens and 106 ARM-only cases (QLinearAdd/Mul, extreme -128 values, pools, concat). Every preset must
reproduce them bit for bit. ``neon-ort1.29`` is onnxruntime 1.29.0 on the same Cortex-A53: the releases
before 1.30 pair int8 x int8 convolutions in int16 too (``Scheme.neon_int8_conv_pairs``); each record is
compared with the preset as its onnxruntime release computes (``for_onnxruntime``), whatever is installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from pytest_qaccuracy.backend import IntegerSession, Scheme, get_scheme, host
from pytest_qaccuracy.backend.kernels import neon
from pytest_qaccuracy.backend.neon_pairs import NotEmulated, gemm_correction
from pytest_qaccuracy.backend.scheme import for_onnxruntime
from pytest_qaccuracy.errors import InputError, QAccuracyError

GOLDENS = Path(__file__).parent / "goldens"
ARM = GOLDENS / "onnxruntime-arm64"
FAMILIES = {
    "neon": "onnxruntime-arm64-neon",
    "dotprod": "onnxruntime-arm64",
    "i8mm": "onnxruntime-arm64",
    "neon-ort1.29": "onnxruntime-arm64-neon",
}
MANIFESTS = {family: json.loads((ARM / f"manifest-{family}.json").read_text()) for family in FAMILIES}


def _recorded_preset(family: str) -> Scheme:
    """The family's preset as the onnxruntime release that recorded it computes."""
    major, minor = (int(part) for part in MANIFESTS[family]["onnxruntime"].split(".")[:2])
    return for_onnxruntime(get_scheme(FAMILIES[family]), (major, minor))


CASES = {case["case"]: case for case in MANIFESTS["dotprod"]["cases"]}


def _outputs(family: str) -> dict[str, np.ndarray]:
    with np.load(ARM / f"outputs-{family}.npz") as data:
        return {key: data[key] for key in data.files}


OUTPUTS = {family: _outputs(family) for family in FAMILIES}


def _emulate(name: str, preset: str | Scheme) -> dict[str, np.ndarray]:
    folder = GOLDENS / CASES[name]["folder"]
    feeds = dict(np.load(folder / "inputs.npz"))
    session = IntegerSession(str(folder / "model.onnx"), scheme=get_scheme(preset), threads=1)
    names = [o.name for o in session.get_outputs()]
    if not name.startswith("net"):
        return dict(zip(names, session.run(None, feeds), strict=True))
    records = next(iter(feeds.values())).shape[0]
    runs = [session.run(None, {k: v[i : i + 1] for k, v in feeds.items()}) for i in range(records)]
    return {n: np.concatenate([run[j] for run in runs]) for j, n in enumerate(names)}


def _mismatches(name: str, family: str, preset: str | Scheme) -> int:
    got = _emulate(name, preset)
    total = 0
    for output in CASES[name]["outputs"]:
        want = OUTPUTS[family][f"{name}/{output}"]
        assert got[output].dtype == want.dtype and got[output].shape == want.shape, output
        total += int(np.count_nonzero(got[output] != want))
    return total


def test_every_family_ran_every_case_on_its_cpu() -> None:
    x86 = json.loads((GOLDENS / "onnxruntime-avx2" / "manifest.json").read_text())["cases"]
    arm_only = json.loads((ARM / "cases" / "cases.json").read_text())
    assert len(CASES) == len(x86) + len(arm_only) == 231
    features = {family: set(m["cpu_features"]) for family, m in MANIFESTS.items()}
    assert "asimddp" not in features["neon"] and "asimddp" in features["dotprod"] and "i8mm" in features["i8mm"]
    assert features["neon-ort1.29"] == features["neon"]
    assert MANIFESTS["neon-ort1.29"]["onnxruntime"] == "1.29.0" and MANIFESTS["neon"]["onnxruntime"] == "1.32.0"
    for family, manifest in MANIFESTS.items():
        assert [c["case"] for c in manifest["cases"]] == list(CASES), family
        assert manifest["machine"] == "aarch64" and manifest["session"]["session_config"] == {}


def test_i8mm_computes_what_dotprod_computes() -> None:
    """smmla/ummla and sdot/udot both sum exactly: one preset serves both."""
    assert OUTPUTS["i8mm"].keys() == OUTPUTS["dotprod"].keys()
    assert all(np.array_equal(OUTPUTS["i8mm"][k], OUTPUTS["dotprod"][k]) for k in OUTPUTS["dotprod"])


@pytest.mark.parametrize("family", ["neon", "dotprod", "neon-ort1.29"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_arm64_presets_are_bit_exact_with_the_recorded_goldens(name: str, family: str) -> None:
    assert _mismatches(name, family, _recorded_preset(family)) == 0


def test_releases_before_1_30_pair_int8_convolutions_without_dot_products() -> None:
    """onnxruntime 1.29 and 1.32 differ on the Cortex-A53 exactly where int8 x int8 convolutions (not
    depthwise) hold (-128) x (-128) pairs; the preset of either release misses the other's values there."""
    old, new = OUTPUTS["neon-ort1.29"], OUTPUTS["neon"]
    differing = {key.split("/")[0] for key in new if not np.array_equal(old[key], new[key])}
    assert differing and all(n.startswith("extreme_qlinearconv_i8s8_") for n in differing)
    assert _recorded_preset("neon-ort1.29").neon_int8_conv_pairs and not _recorded_preset("neon").neon_int8_conv_pairs
    for name in sorted(differing)[:2]:
        assert _mismatches(name, "neon-ort1.29", _recorded_preset("neon")) > 0
        assert _mismatches(name, "neon", _recorded_preset("neon-ort1.29")) > 0


def test_the_families_differ_and_arm_differs_from_x86() -> None:
    """The goldens tell the presets apart: without dot products GEMMs and u8 x s8 convolutions differ on
    -128 pairs; every ARM family adds in fixed point where x86 adds in float."""
    neon, dotprod = OUTPUTS["neon"], OUTPUTS["dotprod"]
    neon_only = {
        n for n in CASES if any(not np.array_equal(neon[f"{n}/{o}"], dotprod[f"{n}/{o}"]) for o in CASES[n]["outputs"])
    }
    assert neon_only and all(n.startswith("extreme_") for n in neon_only)
    assert any("matmulinteger" in n for n in neon_only) and any("qlinearconv_u8s8" in n for n in neon_only)
    for name in sorted(neon_only)[:4]:
        assert _mismatches(name, "neon", "onnxruntime-arm64") > 0
    x86_int8 = get_scheme("onnxruntime-vnni").replace(name="vnni-int8", qdq_int8_to_uint8=False)
    adds = [n for n in CASES if n.startswith(("qlinearadd", "qdq_add"))]
    differing = 0
    for name in adds:
        got = _emulate(name, "onnxruntime-arm64")["y"]
        x86 = IntegerSession(str(GOLDENS / CASES[name]["folder"] / "model.onnx"), scheme=x86_int8, threads=1).run(
            None, dict(np.load(GOLDENS / CASES[name]["folder"] / "inputs.npz"))
        )[0]
        differing += int(np.count_nonzero(got != x86))
    assert differing > 0


@pytest.mark.parametrize("name", ["qlinearmul_fma_u8", "qlinearmul_fma_s8"])
def test_arm64_mul_rounds_once_where_x86_rounds_twice(name: str) -> None:
    """On every 8-bit pair, with scales where it matters: x86's multiply-then-add moves a few products
    one step away from what every ARM64 CPU computed (one FMA)."""
    folder = GOLDENS / CASES[name]["folder"]
    feeds = dict(np.load(folder / "inputs.npz"))
    x86 = IntegerSession(str(folder / "model.onnx"), scheme=get_scheme("onnxruntime-vnni"), threads=1).run(None, feeds)[
        0
    ]
    for family in FAMILIES:
        want = OUTPUTS[family][f"{name}/y"]
        assert 0 < np.count_nonzero(x86 != want) < 16
        assert np.abs(x86.astype(np.int64) - want).max() == 1


def test_the_add_cases_take_both_of_mlas_paths() -> None:
    """Some recorded QLinearAdd cases have ratios inside the fixed-point range, some outside (float loop)."""
    paths = set()
    for name in (n for n in CASES if n.startswith(("qlinearadd", "qdq_add"))):
        model = onnx.load(GOLDENS / CASES[name]["folder"] / "model.onnx")
        init = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        f32 = np.float32
        ratios = f32(init["as"]) / f32(init["cs"]), f32(init["bs"]) / f32(init["cs"])
        paths.add(neon.add_parameters(*ratios) is None)
    assert paths == {True, False}


def test_add_parameters_follow_the_definition() -> None:
    """shift = 21 - floor(log2(max ratio)); the larger multiplier in [2**21, 2**22); outside: float."""
    shift, ma, mb = neon.add_parameters(np.float32(0.4), np.float32(0.1))
    assert shift == 21 + 2 and ma == round(0.4 * 2**23) and mb == round(np.float32(0.1) * 2.0**23)
    assert 2**21 <= ma < 2**22
    assert neon.add_parameters(np.float32(300.0), np.float32(1.0)) is None  # ratio >= 256
    assert neon.add_parameters(np.float32(2.0**-12), np.float32(2.0**-12)) is None  # shift 33 > 31


def test_gemm_wrap_counts_pairs_of_minus_128() -> None:
    """Against a plain loop over the (k, k + 8) pairs of each 16-deep block, wrapped to int16."""
    rng = np.random.default_rng(3)
    a = np.where(rng.random((5, 37)) < 0.6, 0, rng.integers(0, 256, (5, 37))).astype(np.uint8)
    b = np.where(rng.random((37, 4)) < 0.6, -128, rng.integers(-128, 128, (37, 4))).astype(np.int8)
    want = np.zeros((5, 4), np.int64)
    for m in range(5):
        for n in range(4):
            for k in range(0, 48, 16):
                for i in range(8):
                    p = [int(a[m, j]) - 128 if j < 37 else 0 for j in (k + i, k + i + 8)]
                    q = [int(b[j, n]) if j < 37 else 0 for j in (k + i, k + i + 8)]
                    exact = p[0] * q[0] + p[1] * q[1]
                    want[m, n] += (exact + 32768) % 65536 - 32768 - exact
    got = gemm_correction(a, b)
    assert got is not None and want.any()
    np.testing.assert_array_equal(got, want)
    assert gemm_correction(a, np.clip(b, -127, 127).astype(np.int8)) is None  # symmetric weights never wrap


def test_a_convolution_the_wrap_emulation_lacks_is_one_error_naming_node_and_op(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    w = np.full((2, 16, 3), -128, np.int8)
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], name="conv1d")
    inits = {"xs": np.float32(0.1), "xz": np.uint8(128), "w": w, "ws": np.float32(0.1), "wz": np.int8(0),
             "ys": np.float32(10.0), "yz": np.uint8(128)}  # fmt: skip
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 16, 8])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )  # fmt: skip
    path = tmp_path / "conv1d.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    feeds = {"x": np.zeros((1, 16, 8), np.uint8)}
    IntegerSession(str(path), scheme=get_scheme("onnxruntime-arm64"), threads=1).run(None, feeds)  # exact: fine
    with pytest.raises(QAccuracyError) as caught:
        IntegerSession(str(path), scheme=get_scheme("onnxruntime-arm64-neon"), threads=1).run(None, feeds)
    message = str(caught.value)
    assert "node 'conv1d'" in message and "QLinearConv" in message and NotEmulated.__name__ in message
    assert "\n" not in message


def test_the_depthwise_tap_pairs_are_what_the_goldens_need() -> None:
    """Without the int16 tap pairs of MLAS's depthwise kernels, the -128-heavy depthwise cases part from
    every ARM64 family: 9-tap kernels on 16 channels pair taps two apart, on 24 channels neighbours."""
    exact = get_scheme("onnxruntime-arm64").replace(name="exact-depthwise", depthwise_pair_wrap=False)
    for name in ("extreme_qlinearconv_i8s8_pc_02", "extreme_qlinearconv_u8s8_pc_02", "extreme_qlinearconv_i8s8_pc_03"):
        folder = GOLDENS / CASES[name]["folder"]
        got = IntegerSession(str(folder / "model.onnx"), scheme=exact, threads=1).run(
            None, dict(np.load(folder / "inputs.npz"))
        )
        assert np.count_nonzero(got[0] != OUTPUTS["dotprod"][f"{name}/y"]) > 0, name


def test_a_depthwise_variant_the_emulation_lacks_is_one_error(tmp_path: Path) -> None:
    """12 channels (not a multiple of 8: not measured) with -128 weights on neighbouring taps."""
    from onnx import TensorProto, helper

    w = np.full((12, 1, 3, 3), -128, np.int8)
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], name="dw", group=12)
    inits = {"xs": np.float32(0.1), "xz": np.int8(0), "w": w, "ws": np.float32(0.1), "wz": np.int8(0),
             "ys": np.float32(10.0), "yz": np.int8(0)}  # fmt: skip
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.INT8, [1, 12, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )  # fmt: skip
    path = tmp_path / "dw.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    feeds = {"x": np.full((1, 12, 6, 6), -128, np.int8)}
    IntegerSession(str(path), scheme=get_scheme("onnxruntime-vnni"), threads=1).run(None, feeds)  # x86: exact
    for preset in ("onnxruntime-arm64", "onnxruntime-arm64-neon"):
        with pytest.raises(QAccuracyError) as caught:
            IntegerSession(str(path), scheme=get_scheme(preset), threads=1).run(None, feeds)
        message = str(caught.value)
        assert "node 'dw'" in message and "QLinearConv" in message and "12 channels" in message
        assert "\n" not in message


def test_an_unknown_preset_lists_the_arm64_ones() -> None:
    with pytest.raises(InputError, match="unknown scheme 'onnxruntime-arm'") as caught:
        get_scheme("onnxruntime-arm")
    assert "onnxruntime-arm64, onnxruntime-arm64-neon" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("value", "preset"), [(262144, "onnxruntime-arm64"), (-262144, "onnxruntime-arm64-neon")])
def test_the_probe_on_arm64_reads_the_wrap(monkeypatch: pytest.MonkeyPatch, value: int, preset: str) -> None:
    """On an ARM64 machine the probe's second MatMulInteger names the family (live: .ci/arm64)."""
    monkeypatch.delenv(host.ENV_OVERRIDE, raising=False)
    monkeypatch.setattr(host.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(host, "arm64_probe", lambda: value)
    host.host_preset.cache_clear()
    try:
        assert host.host_preset() == preset
        host.host_preset.cache_clear()
        monkeypatch.setattr(host, "arm64_probe", lambda: 7)
        with pytest.raises(QAccuracyError, match=r"gave 7 .* set QACCURACY_HOST_PRESET"):
            host.host_preset()
    finally:
        host.host_preset.cache_clear()
