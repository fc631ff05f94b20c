"""Model loading, model pairs, graph helpers and fp32 <-> quantized tensor matching."""

from pytest_qaccuracy.model.graph import GraphView
from pytest_qaccuracy.model.loading import InputSpec, graph_inputs, load_model
from pytest_qaccuracy.model.matching import Matching, TensorMatch, match_tensors
from pytest_qaccuracy.model.pair import ModelPair
from pytest_qaccuracy.model.quant_params import QuantParams, detect_format, find_quant_params

__all__ = [
    "GraphView",
    "InputSpec",
    "Matching",
    "ModelPair",
    "QuantParams",
    "TensorMatch",
    "detect_format",
    "find_quant_params",
    "graph_inputs",
    "load_model",
    "match_tensors",
]
