"""Issue 18 in pytest: what a session prints about hostile or mismatched models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

HOSTILE = {"logits": "logits\x1b[2J", "relu2": "relu2\x1b]0;pwned\x07"}

MODULE = """
import pytest


@pytest.mark.qaccuracy(fp32="models/a.onnx", quantized="models/a.qdq.onnx", data="data/digits_test.npz")
def test_pair(qaccuracy):
    qaccuracy.check(min_cosine=0.9)
"""


def _rename(source, target, renames: dict[str, str]) -> None:
    model = onnx.load(str(source))
    graph = model.graph
    for node in graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    for value in [*graph.output, *graph.value_info]:
        value.name = renames.get(value.name, value.name)
    onnx.save(model, str(target))


def test_control_characters_in_tensor_names_are_escaped_in_the_summary(digits: pytest.Pytester) -> None:
    models = digits.path / "models"
    _rename(models / "digits_cnn.onnx", models / "a.onnx", HOSTILE)
    _rename(models / "digits_cnn.qdq.onnx", models / "a.qdq.onnx", HOSTILE)
    digits.makepyfile(test_hostile=MODULE)
    result = digits.runpytest()
    result.assert_outcomes(passed=1)
    text = result.stdout.str()
    assert "\x1b" not in text and "\x07" not in text
    assert "output 'logits\\x1b[2J'" in text
    summary = (digits.path / ".qaccuracy" / "summary.json").read_text()
    assert "logits\\u001b[2J" in summary  # JSON keeps the name exact


def _unrelated(fp32, target) -> None:
    """A model with ``fp32``'s input and output but nothing else in common: pool, flatten, Gemm."""
    source = onnx.load(str(fp32)).graph
    channels = source.input[0].type.tensor_type.shape.dim[1].dim_value
    classes = source.output[0].type.tensor_type.shape.dim[1].dim_value
    weights = np.random.default_rng(0).standard_normal((classes, channels)).astype(np.float32)
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("GlobalAveragePool", [source.input[0].name], ["p"]),
            onnx.helper.make_node("Flatten", ["p"], ["f"], axis=1),
            onnx.helper.make_node("Gemm", ["f", "w"], [source.output[0].name], transB=1),
        ],
        "unrelated",
        [source.input[0]],
        [source.output[0]],
        [onnx.numpy_helper.from_array(weights, "w")],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(target))


def test_a_quantized_model_not_derived_from_the_fp32_one_is_flagged_in_the_summary(digits: pytest.Pytester) -> None:
    models = digits.path / "models"
    (models / "a.onnx").write_bytes((models / "digits_cnn.onnx").read_bytes())
    _unrelated(models / "a.onnx", models / "a.qdq.onnx")
    digits.makepyfile(test_unrelated=MODULE)
    result = digits.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["a.qdq: FAILED *", "  warning: only 1 of 8 layers matched: are these the same model?"])


# -- the pytest side of the probe: one ERROR line and exit 4 before any test, the folder untouched --

GOOD = """
import pytest


PAIR = dict(fp32="models/digits_cnn.onnx", quantized="models/digits_cnn.qdq.onnx", data="data/digits_test.npz")


@pytest.mark.qaccuracy(**PAIR)
def test_a(qaccuracy):
    qaccuracy.check()
"""


def _blocker(root):
    (root / "blocker").write_text("a file where a folder should be")
    return [
        "--qaccuracy-artifacts-dir=blocker"
    ], "--qaccuracy-artifacts-dir {root}/blocker: is a file, expected a directory"


def _under_a_file(root):
    (root / "blocker").write_text("")
    return ["--qaccuracy-artifacts-dir=blocker/acc"], (
        "--qaccuracy-artifacts-dir {root}/blocker/acc: cannot be created, {root}/blocker is not a directory"
    )


def _foreign_folder(root):
    (root / "out" / "baselines").mkdir(parents=True)
    return ["--qaccuracy-artifacts-dir=out"], (
        "--qaccuracy-artifacts-dir {root}/out: holds baselines/, not written by pytest-qaccuracy; the folder is "
        "replaced as a whole each time its artifacts are written: move them or choose a folder of its own"
    )


def _the_project(root):
    root.joinpath("tox.ini").write_text("[pytest]\nqaccuracy_artifacts_dir = .\n")
    return [], "qaccuracy_artifacts_dir {root}: holds {root}; artifacts need a folder of their own"


def _bad_ini(root):
    root.joinpath("tox.ini").write_text("[pytest]\nqaccuracy_min_cosine = high\n")
    return [], "qaccuracy_min_cosine: expected a number, got 'high'"


OPTION_CASES = {
    "artifacts dir is a file": _blocker,
    "artifacts dir under a file": _under_a_file,
    "artifacts dir holds a folder of the user's": _foreign_folder,
    "artifacts dir is the project": _the_project,
    "ini value not a number": _bad_ini,
}


@pytest.mark.parametrize("name", OPTION_CASES)
def test_a_bad_option_is_one_error_line_and_exit_4_before_any_test(digits: pytest.Pytester, name: str) -> None:
    digits.makepyfile(test_good=GOOD)
    args, message = OPTION_CASES[name](digits.path)
    before = sorted(p.relative_to(digits.path).as_posix() for p in digits.path.rglob("*"))
    result = digits.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.strip()]
    assert errors == ["ERROR: " + message.replace("{root}", str(digits.path))]
    assert "Traceback" not in result.stdout.str() and "test_a" not in result.stdout.str()
    after = sorted(
        p.relative_to(digits.path).as_posix() for p in digits.path.rglob("*") if "__pycache__" not in p.parts
    )
    assert after == [p for p in before if "__pycache__" not in p]


BAD_PAIRS = """
import pytest

DATA, FP32 = "data/digits_test.npz", "models/digits_cnn.onnx"


def test_empty_model(qaccuracy, qaccuracy_pair):
    qaccuracy.check(qaccuracy_pair(FP32, "models/empty.onnx", DATA))


def test_bad_shape(qaccuracy, qaccuracy_pair):
    qaccuracy.check(qaccuracy_pair(FP32, "models/digits_cnn.qdq.onnx", "data/shape.npz"))


def test_huge_header(qaccuracy, qaccuracy_pair):
    qaccuracy.check(qaccuracy_pair(FP32, "models/digits_cnn.qdq.onnx", "data/huge.npz"))
"""


def test_bad_models_and_data_fail_their_test_with_one_line(digits: pytest.Pytester) -> None:
    import io
    import zipfile

    from numpy.lib import format as npy_format

    (digits.path / "models" / "empty.onnx").write_bytes(b"")
    np.savez(digits.path / "data" / "shape.npz", x=np.zeros((4, 1, 4, 4), np.float32))
    header = io.BytesIO()
    npy_format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (4_000_000_000, 64)})
    with zipfile.ZipFile(digits.path / "data" / "huge.npz", "w") as archive:
        archive.writestr("x.npy", header.getvalue() + b"\0" * 64)
    digits.makepyfile(test_bad=BAD_PAIRS)
    result = digits.runpytest("--qaccuracy-no-artifacts")
    result.assert_outcomes(failed=3)
    for test, (kind, message) in {
        "test_empty_model": ("ModelError", "*/models/empty.onnx: empty file, not an ONNX model"),
        "test_bad_shape": ("DataError", "shape.npz: record 0, input 'x': shape (1, 4, 4) does not match *"),
        "test_huge_header": ("DataError", "huge.npz: array 'x': the header declares shape (4000000000, 64) float32 *"),
    }.items():
        result.stdout.fnmatch_lines([f"FAILED test_bad.py::{test} - Failed: {kind}: *"])
        result.stdout.fnmatch_lines([f"{kind}: {message}"])
    assert "Traceback" not in result.stdout.str() and "INTERNALERROR" not in result.stdout.str()
