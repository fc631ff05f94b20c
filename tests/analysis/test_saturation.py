"""The saturation report against pair sums counted here by brute force, and its command and check."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from pair_ways import force_way, recorded

from pytest_qaccuracy.analysis.saturation import measure_saturation
from pytest_qaccuracy.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "example_suites"


def _conv_model(w: np.ndarray, pads: int) -> bytes:
    """One uint8 QLinearConv with int8 weights ``w``; its output is a graph output."""
    inits = [
        numpy_helper.from_array(np.float32(0.02), "xs"),
        numpy_helper.from_array(np.uint8(0), "xzp"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.float32(0.01), "ws"),
        numpy_helper.from_array(np.int8(0), "wzp"),
        numpy_helper.from_array(np.float32(40.0), "ys"),
        numpy_helper.from_array(np.uint8(128), "yzp"),
    ]
    node = helper.make_node(
        "QLinearConv", ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp"], ["y"], name="conv", pads=[pads] * 4
    )
    graph = helper.make_graph(
        [node],
        "one_conv",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [None, w.shape[1], 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _brute_force(x: np.ndarray, w: np.ndarray, pads: int) -> tuple[int, int, np.ndarray]:
    """(pair sums, saturated, saturated per record) in onnxruntime's (tap, channel) reduction order."""
    n, c = x.shape[:2]
    m, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.int64), [(0, 0), (0, 0), (pads, pads), (pads, pads)])
    oh, ow = xp.shape[2] - kh + 1, xp.shape[3] - kw + 1
    columns = np.stack(
        [xp[:, ch, i : i + oh, j : j + ow] for i in range(kh) for j in range(kw) for ch in range(c)], axis=-1
    )  # (n, oh, ow, K)
    weights = w.transpose(2, 3, 1, 0).reshape(-1, m).astype(np.int64)  # (K, m), same order
    k = weights.shape[0]
    if k % 2:
        columns = np.concatenate([columns, np.zeros((*columns.shape[:-1], 1), np.int64)], axis=-1)
        weights = np.concatenate([weights, np.zeros((1, m), np.int64)])
    products = columns[..., :, None] * weights  # (n, oh, ow, K, m)
    sums = products[..., 0::2, :] + products[..., 1::2, :]
    saturated = (sums > 32767) | (sums < -32768)
    return sums[0].size * n, int(saturated.sum()), saturated.reshape(n, -1).sum(axis=1)


@pytest.mark.parametrize("sums", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("way", ["sparse", "dense", "dense-blocks"])
@pytest.mark.parametrize(("channels", "pads"), [(4, 1), (3, 0)])  # even: pairs within a tap; odd: across
def test_counts_match_brute_force(
    tmp_path: Path, channels: int, pads: int, way: str, sums: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ways of computing the correction count the same saturated pair sums, with the exact sums
    in numpy or in onnxruntime (``sums``: the dense correction is then made chunk by chunk)."""
    from pytest_qaccuracy.backend.kernels import conv_ort

    if sums == "onnxruntime":  # every convolution's sums in onnxruntime
        monkeypatch.setattr(conv_ort, "MIN_MACS", 0)

    taken = force_way(monkeypatch, way)
    rng = np.random.default_rng(channels)
    sign = rng.choice([-1, 1], size=(5, 1, 1, 1))
    w = np.clip(sign * rng.integers(30, 129, size=(5, channels, 3, 3)), -128, 127).astype(np.int8)
    x = rng.integers(0, 256, size=(7, channels, 6, 6)).astype(np.uint8)
    data = tmp_path / "data.npz"
    np.savez(data, x=x)
    report = measure_saturation(_conv_model(w, pads), data, batch_size=3)
    total, saturated, per_record = _brute_force(x, w, pads)
    (layer,) = report.layers
    assert (layer.node, layer.pairs, layer.saturated) == ("conv", total, saturated)
    assert saturated > 0 and report.records == 7
    assert (layer.worst_record, layer.worst_record_saturated) == (int(np.argmax(per_record)), int(per_record.max()))
    assert layer.tensor == "y" and 0 < layer.differing <= layer.elements == 7 * 5 * (6 + 2 * pads - 2) ** 2
    assert report.outputs["y"] is not None  # the saturated run differs from the exact one
    assert taken and set(taken) == {recorded(way)}


def test_the_command_reports_and_gates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "saturation.json"
    args = ["saturation", str(EXAMPLES / "models" / "digits_cnn.qdq_w8.onnx"), "--data"]
    args += [str(EXAMPLES / "data" / "digits_test.npz"), "--json", str(out)]
    assert main([*args, "--max-saturated", "0.01"]) == 0
    assert main([*args, "--max-saturated", "0"]) == 1
    printed = capsys.readouterr()
    assert "conv1   18895 / 768000" in printed.out and "output 'logits' on onnxruntime-avx2: SQNR 23.4" in printed.out
    assert "more than --max-saturated 0" in printed.err
    document = json.loads(out.read_text())
    assert document["saturated"] == 18895 and document["layers"][0]["worst_record"] == 26
    seven_bit = ["saturation", str(EXAMPLES / "models" / "digits_cnn.qdq.onnx"), "--data"]
    assert main([*seven_bit, str(EXAMPLES / "data" / "digits_test.npz"), "--max-saturated", "0"]) == 0
    assert "identical to the exact run" in capsys.readouterr().out


def test_remedies_on_a_qoperator_conv(tmp_path: Path) -> None:
    """7-bit weights cannot saturate; u8 weights (w + 128) compute exactly what exact sums give; a
    QOperator model cannot leave a layer in float."""
    from pytest_qaccuracy.analysis.saturation import check_remedies

    rng = np.random.default_rng(9)
    sign = rng.choice([-1, 1], size=(5, 1, 1, 1))
    w = np.clip(sign * rng.integers(30, 129, size=(5, 4, 3, 3)), -128, 127).astype(np.int8)
    data = tmp_path / "data.npz"
    np.savez(data, x=rng.integers(0, 256, size=(6, 4, 6, 6)).astype(np.uint8))
    model = _conv_model(w, 1)
    report = measure_saturation(model, data)
    assert report.saturated > 0 and report.outputs["y"] is not None
    remedies = {r.name: r for r in check_remedies(model, data, report)}
    assert remedies["7-bit weights"].saturated == 0
    assert remedies["u8 weights"].saturated == 0 and remedies["u8 weights"].outputs == {"y": None}
    assert remedies["worst layers in float"].saturated is None
    assert remedies["worst layers in float"].note == "QDQ models only"


def test_the_command_checks_the_remedies_on_a_qdq_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "saturation.json"
    model = str(EXAMPLES / "models" / "digits_cnn.qdq_w8.onnx")
    assert main(["saturation", model, "--data", str(EXAMPLES / "data" / "digits_test.npz"), "--json", str(out)]) == 0
    assert "remedies, each applied to the model and run on onnxruntime-avx2" in capsys.readouterr().out
    remedies = {r["name"]: r for r in json.loads(out.read_text())["remedies"]}
    assert all(r["saturated"] == 0 for r in remedies.values())
    assert remedies["u8 weights"]["outputs_sqnr_vs_exact"] == {"logits": None}
    # both change the model, both bring the AVX2 run closer to exact sums than 23.4 dB
    assert remedies["7-bit weights"]["outputs_sqnr_vs_exact"]["logits"] > 25
    assert remedies["worst layers in float"]["outputs_sqnr_vs_exact"]["logits"] > 25
    assert remedies["worst layers in float"]["how"] == "nodes_to_exclude=['conv1']"


def _neon_brute_force(columns: np.ndarray, weights: np.ndarray) -> tuple[int, np.ndarray]:
    """(pair sums, wrapped per record) of ARM64's NEON kernels without dot products: uint8 inputs flipped
    to int8 (``x - 128``), two products ``(k, k + 8)`` of each 16-deep block added in int16.

    ``columns``: ``(n, positions, K)`` uint8 inputs in the kernel's reduction order; ``weights``: ``(K, m)``."""
    n, _, k = columns.shape
    padded = -(-k // 16) * 16  # the packed reduction axis holds zeros beyond K
    a = np.zeros((*columns.shape[:2], padded), np.int64)
    a[..., :k] = columns.astype(np.int64) - 128
    b = np.zeros((padded, weights.shape[1]), np.int64)
    b[:k] = weights
    products = a[..., :, None] * b  # (n, positions, K16, m)
    blocks = products.reshape(*products.shape[:2], padded // 16, 2, 8, b.shape[1])
    sums = blocks[:, :, :, 0] + blocks[:, :, :, 1]
    wrapped = (sums > 32767) | (sums < -32768)
    return sums[0].size * n, wrapped.reshape(n, -1).sum(axis=1)


def test_arm64_neon_wraps_counted_against_brute_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--preset onnxruntime-arm64-neon``: int16 pairs that wrap (both products (-128) x (-128)) are
    counted per node and record as a brute-force int16 sum finds them, against exact sums."""
    rng = np.random.default_rng(37)
    channels, pads = 8, 1
    w = rng.choice(np.array([-128, -128, -50, 3, 90], np.int8), size=(6, channels, 3, 3)).astype(np.int8)
    x = np.where(rng.random((5, channels, 6, 6)) < 0.5, 0, rng.integers(1, 256, (5, channels, 6, 6))).astype(np.uint8)
    data = tmp_path / "data.npz"
    np.savez(data, x=x)
    model = tmp_path / "conv.onnx"
    model.write_bytes(_conv_model(w, pads).SerializeToString())
    report = measure_saturation(model, data, batch_size=2, preset="onnxruntime-arm64-neon")
    xp = np.pad(x, [(0, 0), (0, 0), (pads, pads), (pads, pads)])  # the zero point, 0, pads
    columns = np.stack(
        [xp[:, ch, i : i + 6, j : j + 6] for i in range(3) for j in range(3) for ch in range(channels)], axis=-1
    ).reshape(5, 36, -1)  # (n, positions, K) in the (kh, kw, cin) order
    total, per_record = _neon_brute_force(columns, w.transpose(2, 3, 1, 0).reshape(-1, 6).astype(np.int64))
    (layer,) = report.layers
    assert (layer.node, layer.pairs, layer.saturated) == ("conv", total, int(per_record.sum()))
    assert layer.saturated > 0 and report.effect == "wrap" and report.exact == "onnxruntime-arm64-neon with exact sums"
    assert (layer.worst_record, layer.worst_record_saturated) == (int(np.argmax(per_record)), int(per_record.max()))
    assert report.outputs["y"] is not None and layer.differing > 0

    out = tmp_path / "wraps.json"
    args = ["saturation", str(model), "--data", str(data), "--preset", "onnxruntime-arm64-neon", "--json", str(out)]
    assert main([*args, "--max-saturated", "0"]) == 1
    printed = capsys.readouterr()
    assert "wrapped pair sums" in printed.out and f"conv    {layer.saturated} / {total}" in printed.out
    assert "pair sums wrap on onnxruntime-arm64-neon, more than --max-saturated 0" in printed.err
    document = json.loads(out.read_text())
    assert document["effect"] == "wrap" and document["saturating_preset"] == "onnxruntime-arm64-neon"
    remedies = {r["name"]: r for r in document["remedies"]}
    assert set(remedies) == {"symmetric weights", "worst layers in float"}
    assert remedies["symmetric weights"]["saturated"] == 0  # -127 x -128 cannot reach 32768 twice
    # the dot-product CPUs sum this convolution exactly: no layer pairs there (depthwise ones do)
    dotprod = measure_saturation(model, data, preset="onnxruntime-arm64")
    assert dotprod.layers == () and dotprod.outputs == {"y": None}


def test_arm64_neon_gemm_wraps_counted_against_brute_force(tmp_path: Path) -> None:
    """A QLinearMatMul with int8 activations: pairs (k, k + 8) of each block of 16 (K = 20: padded)."""
    rng = np.random.default_rng(38)
    k, m = 20, 4
    w = rng.choice(np.array([-128, -128, 7, 100], np.int8), size=(k, m)).astype(np.int8)
    x = rng.choice(np.array([-128, -128, -3, 60], np.int8), size=(9, k)).astype(np.int8)
    inits = [
        numpy_helper.from_array(np.float32(0.05), "xs"),
        numpy_helper.from_array(np.int8(0), "xzp"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.float32(0.01), "ws"),
        numpy_helper.from_array(np.int8(0), "wzp"),
        numpy_helper.from_array(np.float32(30.0), "ys"),
        numpy_helper.from_array(np.int8(0), "yzp"),
    ]
    node = helper.make_node("QLinearMatMul", ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp"], ["y"], name="mm")
    graph = helper.make_graph(
        [node],
        "one_matmul",
        [helper.make_tensor_value_info("x", TensorProto.INT8, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    data = tmp_path / "data.npz"
    np.savez(data, x=x)
    report = measure_saturation(model, data, batch_size=4, preset="onnxruntime-arm64-neon")
    # int8 activations are not flipped: the brute force's x - 128 undone
    total, per_record = _neon_brute_force((x.astype(np.int64) + 128)[:, None, :], w.astype(np.int64))
    (layer,) = report.layers
    assert (layer.pairs, layer.saturated) == (total, int(per_record.sum())) and layer.saturated > 0
    assert layer.worst_record_saturated == int(per_record.max())


def test_a_preset_without_pair_overflow_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["saturation", str(EXAMPLES / "models" / "digits_cnn.qdq.onnx"), "--data"]
    assert main([*args, str(EXAMPLES / "data" / "digits_test.npz"), "--preset", "onnxruntime-vnni"]) == 2
    err = capsys.readouterr().err
    assert "no pair sums overflow on preset 'onnxruntime-vnni'" in err
    assert "onnxruntime-avx2, onnxruntime-arm64-neon, onnxruntime-arm64" in err
