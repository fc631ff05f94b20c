"""Helpers of the corpus tests: the built models, the command line in-process, nodes and layers to analyse."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import build_corpus

MODEL_NAMES = [m.name for m in build_corpus.MODELS]
VARIANTS = list(build_corpus.VARIANTS)
#: PaddleOCR's exports keep opset 11 (cls) and 12 (det, rec)
OPSET_BEFORE_13 = ("ppocr_cls", "ppocr_det", "ppocr_rec")
Q_DQ = ("QuantizeLinear", "DequantizeLinear")


@dataclass(frozen=True)
class Entry:
    """One built model: its folder and ``model.json``."""

    name: str
    folder: Path
    info: dict

    @property
    def fp32(self) -> Path:
        return self.folder / "fp32.onnx"

    def model(self, variant: str) -> Path:
        return self.folder / f"{variant}.onnx"

    def data(self, split: str = "test") -> Path:
        return self.folder / self.info["data"][split]


def run_cli(argv: list[object], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``qaccuracy ARGV`` in this process: exit code, stdout, stderr."""
    from pytest_qaccuracy.cli import main

    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def quantized_nodes(qdq: Path) -> list[str]:
    """Names of the compute nodes of a QDQ model that read a DequantizeLinear output, in graph order."""
    import onnx

    graph = onnx.load(str(qdq), load_external_data=False).graph
    dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    return [n.name for n in graph.node if n.op_type not in Q_DQ and any(i in dequantized for i in n.input)]


def spread(names: list[str], count: int) -> list[str]:
    """``count`` names evenly spread over ``names`` (first and last included)."""
    if len(names) <= count:
        return names
    return [names[round(i * (len(names) - 1) / (count - 1))] for i in range(count)]


def _ancestors(qdq: Path, node_name: str) -> set[str]:
    """Names of the nodes that ``node_name`` depends on in the QDQ graph."""
    import onnx

    graph = onnx.load(str(qdq), load_external_data=False).graph
    producer = {out: n for n in graph.node for out in n.output}
    stack = [next(n for n in graph.node if n.name == node_name)]
    seen: set[str] = set()
    while stack:
        for name in stack.pop().input:
            node = producer.get(name)
            if node is not None and node.name not in seen:
                seen.add(node.name)
                stack.append(node)
    return seen


def layer_of(entry: Entry) -> tuple[str, list[str]]:
    """An fp32 node about two thirds into the quantized graph (a Conv, MatMul or Gemm where there is one)
    whose output sensitivity is measured at, and up to 4 quantized nodes it depends on, to analyse."""
    import onnx

    from pytest_qaccuracy.model import ModelPair
    from pytest_qaccuracy.model.cut import measurable

    qdq = entry.model("qdq_u8s8")
    graph = onnx.load(str(entry.fp32), load_external_data=False).graph
    fp32_nodes = {n.name: n.op_type for n in graph.node}
    table = measurable(ModelPair(entry.fp32, qdq))
    matched = {n.name for n in graph.node if any(o in table for o in n.output)}
    nodes = [n for n in quantized_nodes(qdq) if n in fp32_nodes]
    heavy = [i for i, n in enumerate(nodes) if n in matched and fp32_nodes[n] in ("Conv", "MatMul", "Gemm") and i > 0]
    heavy = heavy or [i for i, n in enumerate(nodes) if n in matched and i > 0]
    index = min(heavy, key=lambda i: abs(i - 2 * len(nodes) // 3)) if heavy else 2 * len(nodes) // 3
    before = _ancestors(qdq, nodes[index])
    return nodes[index], spread([n for n in nodes[:index] if n in before], 4)
