"""The same model files on every CPU family's preset: output SQNR against fp32, and where they part.

For each corpus model and quantized variant (``scripts/build_corpus.py``; ``QACCURACY_CORPUS_DIR`` or
``--corpus``), runs the fp32 model on onnxruntime and the quantized one on the integer backend with
each preset (x86 AVX2, x86 VNNI, ARM64 with and without dot products: each CPU family's default
onnxruntime session, emulated on this host), record by record over ``--records`` test records, and
prints a Markdown table: the SQNR of the float outputs against fp32 per preset (with, for the ARM64
presets, how many output values differ from the x86 VNNI preset's), and the op types where the
ARM64 presets' tensors first part from the x86 VNNI preset's (a node whose output differs while every
input it reads is equal), with how many nodes:

    QACCURACY_CORPUS_DIR=/work/main/.corpus python bench/cpu_families.py --records 4
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

PRESETS = ("onnxruntime-avx2", "onnxruntime-vnni", "onnxruntime-arm64", "onnxruntime-arm64-neon")
VARIANTS = ("qdq_u8s8", "qdq_s8s8_pc", "qop_u8s8")


def _sqnr(want: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((want.astype(np.float64) - got.astype(np.float64)) ** 2))
    signal = float(np.sum(want.astype(np.float64) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(signal / noise)


def _floats(values: list) -> np.ndarray:
    """Every float output of a run, flattened into one float64 vector."""
    arrays = [np.asarray(v) for v in values]
    return np.concatenate([a.astype(np.float64).reshape(-1) for a in arrays if a.dtype.kind == "f"])


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def _first_parting(
    model: onnx.ModelProto, ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]
) -> set[tuple[str, str]]:
    """``(op type, node)`` of the nodes whose output differs while every input it reads is equal (QDQ: the
    op a QuantizeLinear closes; an input fused away is read through its DequantizeLinear; a node with an
    input neither run reports is left out)."""
    producers = _producers(model)
    constants = {i.name for i in model.graph.initializer}

    def equal(name: str) -> bool | None:
        while name not in ours or name not in theirs:
            if name in constants or not name:
                return True
            node = producers.get(name)
            if node is None or node.op_type != "DequantizeLinear":
                return None
            name = node.input[0]
        return bool(np.array_equal(ours[name], theirs[name]))

    found: set[tuple[str, str]] = set()
    for node in model.graph.node:
        outs = [o for o in node.output if o in ours and o in theirs]
        if not outs or all(np.array_equal(ours[o], theirs[o]) for o in outs):
            continue
        reads = node.input
        if node.op_type == "QuantizeLinear" and node.input[0] in producers:
            node = producers[node.input[0]]  # the op the QDQ group runs
            reads = node.input
        if all(equal(i) for i in reads):
            found.add((node.op_type, node.name))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=os.environ.get("QACCURACY_CORPUS_DIR", ".corpus"))
    parser.add_argument("--records", type=int, default=4, help="test records per model")
    parser.add_argument("--models", default="", help="comma-separated model names (default: all)")
    args = parser.parse_args()

    from pytest_qaccuracy.backend import IntegerSession
    from pytest_qaccuracy.data import bind_dataset, load_dataset
    from pytest_qaccuracy.model.loading import graph_inputs, load_model
    from pytest_qaccuracy.ort_session import make_session

    corpus = Path(args.corpus)
    names = args.models.split(",") if args.models else sorted(p.name for p in corpus.iterdir() if p.is_dir())
    print("| model | variant | " + " | ".join(PRESETS) + " | ARM64 parts from x86 VNNI at |")
    print("|---|---|" + "---|" * len(PRESETS) + "---|")
    for name in names:
        folder = corpus / name
        test = next((p for p in folder.iterdir() if p.stem == "test"), None)
        if test is None:
            continue
        fp32 = make_session(str(folder / "fp32.onnx"))
        for variant in VARIANTS:
            path = folder / f"{variant}.onnx"
            if not path.exists():
                continue
            model = load_model(str(path))
            sessions = {preset: IntegerSession(str(path), preset) for preset in PRESETS}
            outputs = {preset: [] for preset in PRESETS}
            reference, parted = [], set()
            dataset = load_dataset(test)
            try:
                for index, batch in enumerate(bind_dataset(dataset, graph_inputs(model)).iter_batches(1)):
                    if index >= args.records:
                        break
                    feeds = batch.stacked()
                    reference.append(_floats(fp32.run(None, feeds)))
                    tensors = {}
                    for preset, session in sessions.items():
                        seen: dict[str, np.ndarray] = {}
                        got = session.run(None, feeds, on_tensor=lambda n, v, seen=seen: seen.__setitem__(n, v))
                        outputs[preset].append(_floats(got))
                        tensors[preset] = seen
                    for arm in ("onnxruntime-arm64", "onnxruntime-arm64-neon"):
                        parted |= _first_parting(model, tensors[arm], tensors["onnxruntime-vnni"])
            finally:
                dataset.close()
            want = np.concatenate(reference)
            cells = []
            vnni = np.concatenate(outputs["onnxruntime-vnni"])
            for preset in PRESETS:
                got = np.concatenate(outputs[preset])
                moved = f" ({int(np.count_nonzero(got != vnni))} / {got.size} differ)" if "arm64" in preset else ""
                cells.append(f"{_sqnr(want, got):.2f} dB{moved}")
            counts = Counter(op for op, _ in parted)
            where = ", ".join(f"{op} ({count})" for op, count in sorted(counts.items()))
            if not where:
                moved = any(np.count_nonzero(np.concatenate(outputs[p]) != vnni) for p in PRESETS if "arm64" in p)
                where = "not located (a node's inputs not reported)" if moved else "nowhere"
            print(f"| {name} | {variant} | " + " | ".join(cells) + f" | {where} |", flush=True)


if __name__ == "__main__":
    main()
