"""Build the example suites' models and data: a small CNN on scikit-learn's 8x8 digits.

Dev-only tools (not dependencies of pytest-qaccuracy): ``pip install torch scikit-learn``.
Run from the repository root: ``python scripts/train_digits.py``. It writes, under
``example_suites/``:

- ``data/digits_test.npz``: 300 held-out digits (``x``: (300, 1, 8, 8) float32, ``labels``: int64);
- ``data/digits_calib.npz``: 100 training digits used to calibrate the quantized models;
- ``models/digits_cnn.onnx``: the fp32 CNN (Conv-Relu-MaxPool x2, Gemm), built with onnx.helper
  from the trained weights, so no ONNX exporter is needed;
- ``models/digits_cnn.qdq.onnx`` and ``models/digits_cnn.qoperator.onnx``: static int8 quantization
  by onnxruntime in QDQ and QOperator form;
- ``models/digits_cnn.broken.onnx``: a deliberately bad quantization, calibrated on inputs scaled
  by 0.02, so every activation range is far too narrow and saturates.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from sklearn.datasets import load_digits

ROOT = Path(__file__).resolve().parent.parent / "example_suites"
SEED = 0
TEST, CALIB = 300, 100


class DigitsCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def load() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, np.newaxis]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(x))
    x, y = x[order], y[order]
    return x[:-TEST], y[:-TEST], x[-TEST:], y[-TEST:]


def train(x: np.ndarray, y: np.ndarray) -> DigitsCNN:
    torch.manual_seed(SEED)
    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    for _epoch in range(40):
        for batch in torch.randperm(len(xs)).split(64):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xs[batch]), ys[batch])
            loss.backward()
            optimizer.step()
    return model.eval()


def to_onnx(model: DigitsCNN, path: Path) -> None:
    def init(name: str, tensor: torch.Tensor) -> onnx.TensorProto:
        return numpy_helper.from_array(tensor.detach().numpy().astype(np.float32), name)

    inits = [
        init("conv1.weight", model.conv1.weight),
        init("conv1.bias", model.conv1.bias),
        init("conv2.weight", model.conv2.weight),
        init("conv2.bias", model.conv2.bias),
        init("fc.weight", model.fc.weight),
        init("fc.bias", model.fc.bias),
    ]
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]}
    nodes = [
        helper.make_node("Conv", ["x", "conv1.weight", "conv1.bias"], ["conv1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        helper.make_node("MaxPool", ["relu1"], ["pool1"], name="pool1", **pool),
        helper.make_node("Conv", ["pool1", "conv2.weight", "conv2.bias"], ["conv2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
        helper.make_node("MaxPool", ["relu2"], ["pool2"], name="pool2", **pool),
        helper.make_node("Flatten", ["pool2"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "digits_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="train_digits.py")
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))


class Reader(CalibrationDataReader):
    def __init__(self, x: np.ndarray) -> None:
        self._items = iter([{"x": record[np.newaxis]} for record in x])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._items, None)


def quantize(fp32: Path, out: Path, calib: np.ndarray, fmt: QuantFormat, reduce_range: bool = True) -> None:
    quantize_static(
        str(fp32),
        str(out),
        Reader(calib),
        quant_format=fmt,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        # 7-bit weights: no u8 x s8 pair can saturate on x86 CPUs without VNNI, so onnxruntime gives the
        # same results on every x86 CPU and the example suite's figures hold on both families (docs/cpus.md)
        reduce_range=reduce_range,
    )


def main() -> None:
    (ROOT / "data").mkdir(parents=True, exist_ok=True)
    (ROOT / "models").mkdir(parents=True, exist_ok=True)
    x_train, y_train, x_test, y_test = load()
    model = train(x_train, y_train)
    with torch.no_grad():
        accuracy = (model(torch.from_numpy(x_test)).argmax(1).numpy() == y_test).mean()
    print(f"fp32 test accuracy: {accuracy:.4f}")
    calib = x_train[:CALIB]
    np.savez_compressed(ROOT / "data" / "digits_test.npz", x=x_test, labels=y_test)
    np.savez_compressed(ROOT / "data" / "digits_calib.npz", x=calib, labels=y_train[:CALIB])
    fp32 = ROOT / "models" / "digits_cnn.onnx"
    to_onnx(model, fp32)
    quantize(fp32, ROOT / "models" / "digits_cnn.qdq.onnx", calib, QuantFormat.QDQ)
    quantize(fp32, ROOT / "models" / "digits_cnn.qoperator.onnx", calib, QuantFormat.QOperator)
    quantize(fp32, ROOT / "models" / "digits_cnn.broken.onnx", calib * 0.02, QuantFormat.QDQ)
    # 8-bit weights, for the deployment-targets example: they saturate on x86 CPUs without VNNI
    quantize(fp32, ROOT / "models" / "digits_cnn.qdq_w8.onnx", calib, QuantFormat.QDQ, reduce_range=False)


if __name__ == "__main__":
    main()
