"""The ARM-only golden cases: ops and values where onnxruntime's ARM64 kernels may part from x86.

- QLinearAdd / QLinearMul (com.microsoft, and QDQ Add / Mul that onnxruntime fuses into them): MLAS's
  NEON kernels compute them in fixed point (add) and with a truncating conversion (mul); scale ratios
  inside and outside the fixed-point range, same shapes, a scalar on either side, broadcasting, tails.
- Integer GEMMs and convolutions on extreme values (``-128`` activations and weights, ``0`` for uint8
  activations): the NEON kernels without dot-product add two int8 products in int16 (``smull`` +
  ``smlal``), which only overflows when both products are ``(-128) * (-128)``.
- The other QOperator ops the backend runs (average pools, sigmoid, leaky relu, concat, softmax).
Written deterministically (one seed) by ``make_arm64_goldens.py cases``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS = "com.microsoft"
_rng = np.random.default_rng(20261128)


def _tt(dtype: type) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _model(nodes: list, inputs: list, inits: dict, outputs: list, opset: int = 13) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "case",
        [helper.make_tensor_value_info(n, _tt(d), s) for n, d, s in inputs],
        [helper.make_tensor_value_info(n, _tt(d), None) for n, d in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    ops = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=ops, ir_version=8)


def _q(dtype: type, shape: tuple, extreme: float = 0.0) -> np.ndarray:
    """Random 8-bit values; ``extreme``: the share set to the type's minimum."""
    info = np.iinfo(dtype)
    x = _rng.integers(info.min, info.max + 1, size=shape)
    if extreme:
        x = np.where(_rng.random(shape) < extreme, info.min, x)
    return x.astype(dtype)


def _binary_cases() -> dict:
    cases = {}
    shapes = [
        ((2, 3, 37), (2, 3, 37)),
        ((4, 50), ()),
        ((), (3, 33)),
        ((2, 8, 5, 5), (1, 8, 1, 1)),
        ((1, 16, 7), (16, 1)),
    ]
    # (scale a, scale b, scale c): ratios inside MLAS's fixed-point range, at its edges and outside it
    scales = [
        (0.02, 0.03, 0.05),
        (0.1, 0.001, 0.04),
        (0.5, 0.5, 0.0021),
        (0.01, 0.01, 40.0),
        (0.003, 0.2, 0.2),
        (1.0, 0.75, 0.001),
    ]
    for dtype in (np.uint8, np.int8):
        tag = "u8" if dtype == np.uint8 else "s8"
        for op in ("QLinearAdd", "QLinearMul"):
            for i, ((sa, sb), (xs, ys, zs)) in enumerate(zip(shapes * 2, scales + scales[:4], strict=False)):
                info = np.iinfo(dtype)
                zp = [dtype(_rng.integers(info.min // 2, info.max // 2 + 1)) for _ in range(3)]
                a, b = _q(dtype, sa), _q(dtype, sb)
                node = helper.make_node(op, ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["y"], domain=MS)
                inits = {
                    "as": np.float32(xs),
                    "az": zp[0],
                    "bs": np.float32(ys),
                    "bz": zp[1],
                    "cs": np.float32(zs),
                    "cz": zp[2],
                }
                model = _model([node], [("a", dtype, list(sa)), ("b", dtype, list(sb))], inits, [("y", dtype)])
                cases[f"{op.lower()}_{tag}_{i:02d}"] = (model, {"a": a, "b": b})
            # the QDQ form, which onnxruntime fuses into the com.microsoft op at load time
            qdq = {"QLinearAdd": "Add", "QLinearMul": "Mul"}[op]
            for i, (xs, ys, zs) in enumerate(scales[:3]):
                zp = [dtype(_rng.integers(-20, 21) + (128 if dtype == np.uint8 else 0)) for _ in range(3)]
                nodes = [
                    helper.make_node("DequantizeLinear", ["a", "as", "az"], ["fa"]),
                    helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["fb"]),
                    helper.make_node(qdq, ["fa", "fb"], ["fy"]),
                    helper.make_node("QuantizeLinear", ["fy", "cs", "cz"], ["y"]),
                ]
                inits = {
                    "as": np.float32(xs),
                    "az": zp[0],
                    "bs": np.float32(ys),
                    "bz": zp[1],
                    "cs": np.float32(zs),
                    "cz": zp[2],
                }
                shape = (2, 4, 9, 9)
                model = _model(nodes, [("a", dtype, list(shape)), ("b", dtype, list(shape))], inits, [("y", dtype)])
                cases[f"qdq_{qdq.lower()}_{tag}_{i:02d}"] = (model, {"a": _q(dtype, shape), "b": _q(dtype, shape)})
    return cases


def _fma_cases() -> dict:
    """QLinearMul on every pair of 8-bit values, with scales (found by search) where one fused
    multiply-add and a multiply then an add round a few products differently."""
    cases = {}
    params = {
        np.uint8: (0.03363357111811638, 0.013395672664046288, 0.039308659732341766, 41, 125, 88),
        np.int8: (0.04383441060781479, 0.027911972254514694, 0.3317446708679199, 37, -17, -45),
    }
    for dtype, (sa, sb, sc, za, zb, zc) in params.items():
        info = np.iinfo(dtype)
        grid = np.arange(info.min, info.max + 1)
        a, b = np.repeat(grid, 256).astype(dtype).reshape(256, 256), np.tile(grid, 256).astype(dtype).reshape(256, 256)
        node = helper.make_node("QLinearMul", ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["y"], domain=MS)
        inits = {"as": np.float32(sa), "az": dtype(za), "bs": np.float32(sb), "bz": dtype(zb), "cs": np.float32(sc),
                 "cz": dtype(zc)}  # fmt: skip
        model = _model([node], [("a", dtype, [256, 256]), ("b", dtype, [256, 256])], inits, [("y", dtype)])
        cases[f"qlinearmul_fma_{'u8' if dtype == np.uint8 else 's8'}"] = (model, {"a": a, "b": b})
    return cases


def _gemm_cases() -> dict:
    """Extreme values: ``-128`` (int8) and ``0`` (uint8, -128 once MLAS flips it to int8) are common."""
    cases = {}
    for xt, wt in [(np.int8, np.int8), (np.uint8, np.int8), (np.uint8, np.uint8)]:
        tag = f"{np.dtype(xt).name[0]}8{np.dtype(wt).name[0]}8"
        for i, (m, k, n) in enumerate([(4, 64, 16), (7, 37, 9), (1, 200, 24)]):
            a = _q(xt, (m, k), 0.5) if xt == np.int8 else np.where(_rng.random((m, k)) < 0.5, 0, _q(xt, (m, k)))
            b = _q(wt, (k, n), 0.5)
            a, b = a.astype(xt), b.astype(wt)
            zp_a = np.array(0 if xt == np.int8 else 128, xt)
            zp_b = np.array(0 if wt == np.int8 else 128, wt)
            node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
            cases[f"extreme_matmulinteger_{tag}_{i:02d}"] = (
                _model([node], [("a", xt, [m, k])], {"b": b, "az": zp_a, "bz": zp_b}, [("y", np.int32)]),
                {"a": a},
            )
            node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
            inits = {
                "as": np.float32(0.02),
                "az": zp_a,
                "b": b,
                "bs": np.float32(0.004),
                "bz": zp_b,
                "ys": np.float32(40.0),
                "yz": np.array(0, xt),
            }
            cases[f"extreme_qlinearmatmul_{tag}_{i:02d}"] = (
                _model([node], [("a", xt, [m, k])], inits, [("y", xt)]),
                {"a": a},
            )
    convs = [
        (16, 16, 1, 3, 1, 9),
        (32, 8, 1, 1, 1, 6),
        (16, 16, 16, 3, 1, 9),
        (24, 24, 24, 3, 2, 11),
        (16, 32, 4, 3, 1, 7),
        (8, 8, 1, 5, 1, 8),
    ]
    for xt in (np.int8, np.uint8):
        tag = f"{np.dtype(xt).name[0]}8s8"
        for i, (cin, cout, group, k, s, hw) in enumerate(convs):
            for pc in (False, True):
                x = _q(xt, (1, cin, hw, hw), 0.5) if xt == np.int8 else _q(xt, (1, cin, hw, hw))
                if xt == np.uint8:
                    x = np.where(_rng.random(x.shape) < 0.5, 0, x).astype(xt)
                w = _q(np.int8, (cout, cin // group, k, k), 0.5)
                ws = _rng.uniform(0.002, 0.01, cout).astype(np.float32) if pc else np.float32(0.005)
                node = helper.make_node(
                    "QLinearConv",
                    ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                    ["y"],
                    group=group,
                    kernel_shape=[k, k],
                    strides=[s, s],
                    pads=[k // 2] * 4,
                )
                inits = {
                    "xs": np.float32(0.02),
                    "xz": np.array(0 if xt == np.int8 else 128, xt),
                    "w": w,
                    "ws": np.asarray(ws),
                    "wz": np.zeros(cout if pc else (), np.int8),
                    "ys": np.float32(30.0),
                    "yz": np.array(0, xt),
                    "b": _rng.integers(-5000, 5000, cout).astype(np.int32),
                }
                name = f"extreme_qlinearconv_{tag}_{'pc' if pc else 'pt'}_{i:02d}"
                cases[name] = (_model([node], [("x", xt, list(x.shape))], inits, [("y", xt)]), {"x": x})
    return cases


def _unary_cases() -> dict:
    cases = {}
    for dtype in (np.uint8, np.int8):
        tag = "u8" if dtype == np.uint8 else "s8"
        zx, zy = (dtype(130), dtype(120)) if dtype == np.uint8 else (dtype(3), dtype(-5))
        x = _q(dtype, (2, 8, 13, 13))
        common = {"xs": np.float32(0.05), "xz": np.array(zx), "ys": np.float32(0.04), "yz": np.array(zy)}
        specs = {
            "qlinearaveragepool": helper.make_node(
                "QLinearAveragePool",
                ["x", "xs", "xz", "ys", "yz"],
                ["y"],
                domain=MS,
                kernel_shape=[3, 3],
                strides=[2, 2],
                pads=[1, 1, 1, 1],
            ),
            "qlinearglobalaveragepool": helper.make_node(
                "QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, channels_last=0
            ),
            "qlinearsigmoid": helper.make_node("QLinearSigmoid", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS),
            "qlinearleakyrelu": helper.make_node(
                "QLinearLeakyRelu", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, alpha=0.1
            ),
        }
        for name, node in specs.items():
            inits = dict(common)
            if name == "qlinearsigmoid":
                inits["ys"], inits["yz"] = np.float32(1 / 256), np.array(dtype(0) if dtype == np.uint8 else dtype(-128))
            cases[f"{name}_{tag}"] = (_model([node], [("x", dtype, list(x.shape))], inits, [("y", dtype)]), {"x": x})
        b = _q(dtype, (2, 5, 13, 13))
        node = helper.make_node(
            "QLinearConcat", ["ys", "yz", "x", "xs", "xz", "b", "bs", "bz"], ["y"], domain=MS, axis=1
        )
        inits = {
            "ys": np.float32(0.06),
            "yz": np.array(zy),
            "xs": np.float32(0.05),
            "xz": np.array(zx),
            "bs": np.float32(0.03),
            "bz": np.array(zx),
        }
        model = _model([node], [("x", dtype, list(x.shape)), ("b", dtype, list(b.shape))], inits, [("y", dtype)])
        cases[f"qlinearconcat_{tag}"] = (model, {"x": x, "b": b})
    return cases


def write_cases(out: Path) -> None:
    """Write every case as ``out/<case>/model.onnx`` and ``inputs.npz``, and ``out/cases.json``."""
    out.mkdir(parents=True, exist_ok=True)
    listed = []
    for group in (_binary_cases, _gemm_cases, _unary_cases, _fma_cases):
        for name, (model, feeds) in group().items():
            folder = out / name
            folder.mkdir(exist_ok=True)
            onnx.save(model, folder / "model.onnx")
            np.savez_compressed(folder / "inputs.npz", **feeds)
            listed.append({"case": name, "ops": sorted({n.op_type for n in model.graph.node})})
    (out / "cases.json").write_text(json.dumps(listed, indent=1) + "\n")
    print(len(listed), "cases in", out)
