"""Model loading, model pairs, graph helpers and fp32 <-> quantized tensor matching."""

from pytest_qaccuracy.model.loading import InputSpec, graph_inputs, load_model

__all__ = ["InputSpec", "graph_inputs", "load_model"]
