"""Fixtures of the sensitivity and calibration tests: the zoo's conv net and a damaged copy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper


def scaled_initializer(src: Path, dst: Path, name: str, factor: float) -> Path:
    """Copy a model with initializer ``name`` multiplied by ``factor`` (e.g. a weight's scale)."""
    model = onnx.load(str(src))
    for i, init in enumerate(model.graph.initializer):
        if init.name == name:
            value = numpy_helper.to_array(init) * np.asarray(factor, dtype=numpy_helper.to_array(init).dtype)
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(value, name))
            break
    else:
        raise KeyError(name)
    onnx.save(model, str(dst))
    return dst


@pytest.fixture(scope="session")
def damaged(zoo, tmp_path_factory) -> Path:
    """The zoo's QDQ model with conv3's weight scale multiplied by 40: conv3 alone ruins the output."""
    root = tmp_path_factory.mktemp("damaged")
    return scaled_initializer(zoo["qdq_u8"], root / "net.damaged.onnx", "w3_scale", 40.0)
