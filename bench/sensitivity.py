"""Benchmark: node sensitivity with work reuse against the naive way (one whole model per node).

Builds a residual conv net (>= 50 nodes), quantizes it with onnxruntime (QDQ), and times
single-node and leave-one-out sensitivity with ``strategy="naive"`` (rebuild the partial model,
open a session, run every record, per node) and ``strategy="reuse"`` (fp32 / quantized activations
computed once per batch, only dirty subgraphs run, experiments packed into few sessions). Results
must be identical. Peak RSS is measured in a child process per run.

    python bench/sensitivity.py [--records 64] [--blocks 12] [--shapes 32x16,8x32] [--write-docs]
    python bench/sensitivity.py --mobile-bound   # the reuse bound on a MobileNetV2-style detector
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def resnet(path: Path, blocks: int = 12, channels: int = 16, size: int = 32, seed: int = 0) -> Path:
    """A residual conv net: stem conv, ``blocks`` x (Conv-Relu-Conv-Add-Relu), GAP, Flatten, Gemm."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def weight(name: str, shape: tuple[int, ...], scale: float) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    c = channels
    x = "x"
    nodes.append(
        helper.make_node(
            "Conv", [x, weight("w0", (c, 3, 3, 3), 0.3), weight("b0", (c,), 0.1)], ["s0"], pads=[1] * 4, name="stem"
        )
    )
    nodes.append(helper.make_node("Relu", ["s0"], ["h0"], name="stem_relu"))
    h = "h0"
    for b in range(blocks):
        w1 = weight(f"w{b}a", (c, c, 3, 3), 0.6 / np.sqrt(9 * c))
        w2 = weight(f"w{b}b", (c, c, 3, 3), 0.6 / np.sqrt(9 * c))
        nodes += [
            helper.make_node("Conv", [h, w1, weight(f"b{b}a", (c,), 0.05)], [f"c{b}a"], pads=[1] * 4, name=f"conv{b}a"),
            helper.make_node("Relu", [f"c{b}a"], [f"r{b}a"], name=f"relu{b}a"),
            helper.make_node(
                "Conv", [f"r{b}a", w2, weight(f"b{b}b", (c,), 0.05)], [f"c{b}b"], pads=[1] * 4, name=f"conv{b}b"
            ),
            helper.make_node("Add", [f"c{b}b", h], [f"a{b}"], name=f"add{b}"),
            helper.make_node("Relu", [f"a{b}"], [f"h{b + 1}"], name=f"relu{b}b"),
        ]
        h = f"h{b + 1}"
    nodes += [
        helper.make_node("GlobalAveragePool", [h], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flat"),
        helper.make_node(
            "Gemm", ["flat", weight("wg", (10, c), 0.5), weight("bg", (10,), 0.1)], ["logits"], transB=1, name="gemm"
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "bench_resnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def prepare(root: Path, records: int, blocks: int, size: int, channels: int = 16) -> dict[str, Path]:
    import h5py

    sys.path.insert(0, str(ROOT / "tests"))
    import modelzoo

    logging.getLogger().setLevel(logging.ERROR)
    fp32 = resnet(root / "bench.onnx", blocks=blocks, channels=channels, size=size)
    rng = np.random.default_rng(1)
    calib = rng.standard_normal((8, 1, 3, size, size)).astype(np.float32)
    quant = modelzoo.quantize(fp32, root / "bench.qdq.onnx", calib)
    data = root / "bench.h5"
    with h5py.File(data, "w") as f:
        for i in range(records):
            f.create_dataset(f"value/{i}/0", data=rng.standard_normal((3, size, size)).astype(np.float32))
    return {"fp32": fp32, "quantized": quant, "data": data}


def work_bound(paths: dict[str, Path], mode: str) -> float:
    """The speedup reuse could reach if time were proportional to arithmetic: the naive models' cost
    over the dirty nodes' cost (plus the cached configuration's one run, for leave-one-out).

    A node's cost is its output elements per record, times the multiply-adds per output element for
    Conv/Gemm/MatMul (from the weight shape); shapes from onnx shape inference. This bounds what
    skipping clean nodes can give on a model: an experiment must recompute everything downstream of
    its node.
    """
    from pytest_qaccuracy.analysis.partial import QdqGraph, dirty_nodes
    from pytest_qaccuracy.analysis.sensitivity import node_experiments, sensitivity_cache
    from pytest_qaccuracy.model import ModelPair

    pair = ModelPair(paths["fp32"], paths["quantized"])
    qg = QdqGraph(pair.quantized, pair.fp32)
    inferred = onnx.shape_inference.infer_shapes(pair.quantized)
    shapes = {
        v.name: [d.dim_value or 1 for d in v.type.tensor_type.shape.dim]
        for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]
    }
    shapes.update({t.name: list(t.dims) for t in pair.quantized.graph.initializer})

    def shape(name: str) -> list[int]:  # partial models rename tensors "<name>::<role>"
        return shapes.get(name.split("::")[0], [1])

    def cost(node: onnx.NodeProto) -> float:
        elements = float(np.prod(shape(node.output[0])))
        if node.op_type in ("Conv", "Gemm", "MatMul") and len(node.input) > 1:
            w = shape(node.input[1])
            per_output = np.prod(w[1:]) if node.op_type == "Conv" else (w[0] if w else 1)
            elements *= float(per_output)
        return elements

    constants = {t.name for t in qg.model.graph.initializer} | set(qg.float_weights)
    cached, _ = qg.wiring(frozenset() if sensitivity_cache(mode) == "float" else qg.all_edges)
    chosen = [n for n in qg.nodes if n.edges("node")]
    naive = reuse = 0.0
    for experiment in node_experiments(qg, chosen, mode):
        nodes, _ = qg.wiring(experiment.enabled)
        naive += sum(cost(n) for n in nodes)
        reuse += sum(cost(n) for n in dirty_nodes(nodes, cached, constants)[0])
    if sensitivity_cache(mode) == "quantized":
        reuse += sum(cost(n) for n in cached)  # the quantized configuration runs once per batch
    return naive / reuse


def run_once(paths: dict[str, str], mode: str, strategy: str, batch_size: int, threads: int) -> dict:
    """One timed sensitivity run (in this process); returns timing, peak RSS and the node metrics."""
    from pytest_qaccuracy.analysis.sensitivity import node_sensitivity
    from pytest_qaccuracy.model import ModelPair
    from pytest_qaccuracy.runtime import RuntimeOptions

    pair = ModelPair(paths["fp32"], paths["quantized"])
    start = time.perf_counter()
    result = node_sensitivity(
        pair,
        paths["data"],
        mode=mode,
        metrics="cosine,mse",
        options=RuntimeOptions(batch_size=batch_size, threads=threads),
        strategy=strategy,
    )
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "nodes": {n.node: n.metrics for n in result.nodes},
        "fp32_nodes": len(pair.fp32.graph.node),
        "qdq_nodes": len(pair.quantized.graph.node),
    }


def child(paths: dict[str, Path], mode: str, strategy: str, batch_size: int, threads: int) -> dict:
    args = [
        sys.executable,
        __file__,
        "--child",
        json.dumps({k: str(v) for k, v in paths.items()}),
        mode,
        strategy,
        str(batch_size),
        str(threads),
    ]
    out = subprocess.run(args, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def best(paths: dict[str, Path], mode: str, strategy: str, batch_size: int, threads: int, repeat: int) -> dict:
    """The fastest of ``repeat`` child runs (the machine may be shared), with the largest peak RSS seen."""
    runs = [child(paths, mode, strategy, batch_size, threads) for _ in range(max(1, repeat))]
    fastest = min(runs, key=lambda r: r["seconds"])
    return {**fastest, "peak_rss_mb": max(r["peak_rss_mb"] for r in runs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument(
        "--shapes", default="32x16,8x32", help="comma-separated SIZExCHANNELS: image size and conv channels"
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the fastest counts")
    parser.add_argument("--modes", default="single,leave-one-out")
    parser.add_argument("--write-docs", action="store_true", help="append the figures to docs/performance.md")
    parser.add_argument("--threads", default="1,0", help="comma-separated onnxruntime thread settings (0: all cores)")
    parser.add_argument(
        "--mobile-bound",
        action="store_true",
        help="only print the arithmetic bound on netzoo.mobile_detector (64x64) and exit",
    )
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mobile_bound:
        return print_mobile_bound(args.modes.split(","))
    if args.child:
        paths, mode, strategy, batch, threads = args.child
        print(json.dumps(run_once(json.loads(paths), mode, strategy, int(batch), int(threads))))
        return 0
    rows = []
    for shape in args.shapes.split(","):
        size, channels = (int(v) for v in shape.split("x"))
        with tempfile.TemporaryDirectory() as tmp:
            paths = prepare(Path(tmp), args.records, args.blocks, size, channels)
            for threads, mode in itertools.product(args.threads.split(","), args.modes.split(",")):
                naive = best(paths, mode, "naive", args.batch_size, int(threads), args.repeat)
                reuse = best(paths, mode, "reuse", args.batch_size, int(threads), args.repeat)
                diff = max(
                    abs(naive["nodes"][n][m] - reuse["nodes"][n][m]) for n in naive["nodes"] for m in naive["nodes"][n]
                )
                bound = work_bound(paths, mode)
                rows.append((shape, threads, mode, naive, reuse, diff, bound))
                speedup = naive["seconds"] / reuse["seconds"]
                print(
                    f"{shape} threads={threads} {mode}: "
                    f"naive {naive['seconds']:.2f} s ({naive['peak_rss_mb']:.0f} MB), "
                    f"reuse {reuse['seconds']:.2f} s ({reuse['peak_rss_mb']:.0f} MB), speedup {speedup:.1f}x "
                    f"(arithmetic bound {bound:.1f}x), max |diff| {diff:.3g}, {len(naive['nodes'])} quantized nodes"
                )
    if args.write_docs:
        write_docs(rows, args)
    return 0


def print_mobile_bound(modes: list[str]) -> int:
    """The arithmetic bound of reuse on a MobileNetV2-style detector (``bench/netzoo.py``)."""
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "bench"))
    import modelzoo
    import netzoo

    logging.getLogger().setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = netzoo.mobile_detector(Path(tmp) / "mobile.onnx", size=64)
        calib = np.random.default_rng(1).standard_normal((4, 1, 3, 64, 64)).astype(np.float32)
        quant = modelzoo.quantize(fp32, Path(tmp) / "mobile.qdq.onnx", calib)
        for mode in modes:
            bound = work_bound({"fp32": fp32, "quantized": quant}, mode)
            print(f"netzoo.mobile_detector {mode}: arithmetic bound {bound:.2f}x")
    return 0


def write_docs(rows, args) -> None:
    import platform

    from pytest_qaccuracy.atomic import atomic_write_text

    path = ROOT / "docs" / "performance.md"
    text = path.read_text() if path.exists() else "# Performance\n"
    first = rows[0][3]
    lines = [
        "",
        "## Sensitivity",
        "",
        f"`python bench/sensitivity.py --records {args.records} --blocks {args.blocks} --shapes {args.shapes} "
        f"--threads {args.threads} --batch-size {args.batch_size} --repeat {args.repeat}` "
        f"(fastest of {args.repeat} runs; {platform.machine()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[1]:.1f} over the last 5 minutes of the run, "
        "each run in its own process; threads 0 = onnxruntime's default, all cores). "
        f"The model is a residual conv net of {first['fp32_nodes']} nodes ({first['qdq_nodes']} in QDQ form, "
        f"{len(first['nodes'])} quantized nodes), quantized by onnxruntime (uint8/int8 QDQ); {args.records} "
        "records of 3xSIZExSIZE; metrics cosine and mse on the output. *naive*: per node, build the partial "
        "model, open a session, run every record through the whole model (fp32 outputs computed once); "
        '*reuse*: `node_sensitivity(..., strategy="reuse")`.',
        "",
        "| SIZExCHANNELS | threads | mode | naive (s) | reuse (s) | speedup | arithmetic bound | naive peak RSS (MB) "
        "| reuse peak RSS (MB) | max abs difference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shape, threads, mode, naive, reuse, diff, bound in rows:
        speedup = naive["seconds"] / reuse["seconds"]
        lines.append(
            f"| {shape} | {threads} | {mode} | {naive['seconds']:.2f} | {reuse['seconds']:.2f} | {speedup:.1f}x "
            f"| {bound:.1f}x "
            f"| {naive['peak_rss_mb']:.0f} | {reuse['peak_rss_mb']:.0f} | {diff:.3g} |"
        )
    lines += [
        "",
        "Both strategies give identical numbers (max abs difference 0 on every node and metric). **The "
        "project's goal of 5x over naive is not met, and cannot be by recomputing only what changes**: an experiment "
        "must still run everything downstream of its node (its input differs there). The *arithmetic bound* "
        "column is the speedup that skipping clean nodes allows if time were proportional to arithmetic "
        "(`work_bound`: the naive models' cost over the dirty nodes' cost, a node's cost being its multiply-"
        "adds or output elements): about 2x here, and 2.15x on `netzoo.mobile_detector` (110 nodes, "
        "MobileNetV2-style detector with a top-down head; `--mobile-bound`), since most quantized nodes sit "
        "in the trunk that every output depends on. Measured speedups above the bound come from what naive "
        "pays per node beyond arithmetic (model rebuilds, session creation, per-run overhead on small "
        "tensors). Reuse holds more memory than naive (one session per pack of 256 nodes, bounded to 1 GiB of"
        " initializers, and one batch of cached activations); neither grows with the number of records. "
        "Timings swing with the machine's load.",
    ]
    section = "\n".join(lines[1:]) + "\n"
    if "\n## Sensitivity\n" in text:  # replace this bench's own section, leave the others alone
        head, _, rest = text.partition("\n## Sensitivity\n")
        tail = rest[rest.index("\n## ") :] if "\n## " in rest else ""
        text = head.rstrip("\n") + "\n\n" + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    atomic_write_text(path, text)


if __name__ == "__main__":
    raise SystemExit(main())
