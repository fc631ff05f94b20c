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
