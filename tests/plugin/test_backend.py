"""Backend and scheme per pair, and the ``max_backend_steps`` agreement gate, on the digits models.

Measured on the bundled digits CNN (300 records; onnxruntime 1.31.1, CPU): the ``onnxruntime`` preset
is bit-exact on both the QDQ and QOperator models; ``power2`` differs first at the first conv's output
by up to 11 steps (87328 / 153600 elements) and at the logits by up to 41 steps; ``tflite`` differs by
at most 1 step, first at the same tensor (194 / 153600 elements).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_qaccuracy.backend.host import host_preset
from pytest_qaccuracy.plugin.pairs import PairSpec
from pytest_qaccuracy.plugin.schemes import BACKENDS
from pytest_qaccuracy.plugin.suite import load_suite

PRESETS = (
    "onnxruntime, onnxruntime-avx2, onnxruntime-vnni, onnxruntime-arm64, onnxruntime-arm64-neon, onnx-reference, "
    "tflite, tflite-single-rounding, tvm-upward, power2, glow"
)
FIRST_QDQ = "relu1_QuantizeLinear_Output"

#: The QDQ and QOperator pairs on the integer backend (onnxruntime scheme) and on onnxruntime.
INTEGER_MODULE = """
import pytest

FP32, DATA = "models/digits_cnn.onnx", "data/digits_test.npz"


@pytest.mark.qaccuracy(fp32=FP32, data=DATA, backend="integer", max_backend_steps=0)
@pytest.mark.parametrize("form", ["qdq", "qoperator"])
def test_integer(qaccuracy, form):
    qaccuracy.check(qaccuracy.pair(FP32, f"models/digits_cnn.{form}.onnx", name=form))


@pytest.mark.parametrize("form", ["qdq", "qoperator"])
def test_onnxruntime(qaccuracy, qaccuracy_pair, form):
    qaccuracy.check(qaccuracy_pair(FP32, f"models/digits_cnn.{form}.onnx", DATA, name=form))
"""

#: One test per (scheme, N): the gate with the default backend (onnxruntime).
GATE_MODULE = """
import pytest


@pytest.mark.qaccuracy(fp32="models/digits_cnn.onnx", quantized="models/digits_cnn.qdq.onnx",
                       data="data/digits_test.npz", name="qdq")
@pytest.mark.parametrize("scheme,steps", [("power2", 0), ("power2", 9), ("power2", 43), ("tflite", 0), ("tflite", 1)])
def test_gate(qaccuracy, scheme, steps):
    qaccuracy.check(qaccuracy.pair(scheme=scheme), max_backend_steps=steps)
"""

MARKED = """
import pytest


@pytest.mark.qaccuracy(fp32="models/digits_cnn.onnx", quantized="models/digits_cnn.qdq.onnx",
                       data="data/digits_test.npz", name="qdq"{keys})
def test_marked(qaccuracy):
    qaccuracy.check()
"""

#: A suite with one bit-exact integer pair and one pair gating a diverging scheme.
SUITE = """
[defaults]
fp32 = "models/digits_cnn.onnx"
data = "data/digits_test.npz"
backend = "integer"

[defaults.tolerances]
max_backend_steps = 0

[pairs.qoperator]
quantized = "models/digits_cnn.qoperator.onnx"

[pairs.qoperator.tolerances]
min_sqnr = 15.0

[pairs.power2]
quantized = "models/digits_cnn.qdq.onnx"
scheme = "power2"
"""


def _artifact(root: Path, pair_id: str) -> dict:
    """The comparison JSON of the one artifact of ``pair_id`` (plus its summary.json entry)."""
    summary = json.loads((root / ".qaccuracy" / "summary.json").read_text())
    (entry,) = [p for p in summary["pairs"] if p["id"] == pair_id]
    comparison = json.loads((root / ".qaccuracy" / entry["artifacts"]["comparison"]).read_text())
    return {"summary": entry, "comparison": comparison}


def _pairs(root: Path) -> list[dict]:
    return json.loads((root / ".qaccuracy" / "summary.json").read_text())["pairs"]


def test_integer_backend_is_bit_exact_on_qdq_and_qoperator(digits: pytest.Pytester) -> None:
    digits.makepyfile(test_integer=INTEGER_MODULE)
    result = digits.runpytest("--junitxml=out.xml")
    result.assert_outcomes(passed=4)
    pairs = _pairs(digits.path)
    assert sorted((p["id"], p["backend"], p["scheme"]) for p in pairs) == [
        ("qdq", "integer", host_preset()),
        ("qdq", "onnxruntime", "onnxruntime"),
        ("qoperator", "integer", host_preset()),
        ("qoperator", "onnxruntime", "onnxruntime"),
    ]
    assert len({p["artifacts"]["comparison"] for p in pairs}) == 4  # one stem per backend
    for form in ("qdq", "qoperator"):
        integer, ort = (
            next(p for p in pairs if p["id"] == form and p["backend"] == b) for b in ("integer", "onnxruntime")
        )
        comparison = json.loads((digits.path / ".qaccuracy" / integer["artifacts"]["comparison"]).read_text())
        assert (comparison["backend"], comparison["scheme"]) == ("integer", host_preset())
        assert integer["outputs"] == ort["outputs"]  # bit-exact: every output metric identical
        assert integer["topk"] == ort["topk"]
        tensors = integer["agreement"]["tensors"]
        assert len(tensors) == 8 and integer["agreement"]["records"] == 300  # 7 8-bit ones and the output
        assert all(t["mismatches"] == 0 and t["max_steps"] == 0 for t in tensors)
        (gate,) = [c for c in integer["checks"] if c["check"] == "max_backend_steps"]
        assert gate["passed"] and gate["value"] == 0 and gate["threshold"] == 0
        assert ort["agreement"] is None and "key" in ort and "backend=" not in ort["key"]
        assert integer["key"] == ort["key"] + "|backend=integer"
    result.stdout.fnmatch_lines(
        [
            "qdq: PASSED (digits_cnn.qdq.onnx vs digits_cnn.onnx on digits_test.npz, 300 records)",
            "qdq: PASSED (digits_cnn.qdq.onnx vs digits_cnn.onnx, 300 records, backend integer, scheme",
            f"    {host_preset()})",  # wrapped at 100 columns
        ]
    )
    cases = {
        c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")}
        for c in ET.parse(digits.path / "out.xml").iter("testcase")
    }
    assert cases["test_integer[qoperator]"]["qaccuracy.agreement.max_steps"] == "0"
    assert cases["test_integer[qoperator]"]["qaccuracy.agreement.first_divergence"] == ""
    assert "qaccuracy.agreement.max_steps" not in cases["test_onnxruntime[qoperator]"]


def test_gate_fails_at_the_first_tensor_beyond_n(digits: pytest.Pytester) -> None:
    digits.makepyfile(test_gate=GATE_MODULE)
    result = digits.runpytest()
    result.assert_outcomes(passed=2, failed=3)
    result.stdout.fnmatch_lines(
        [
            "*_ test_gate[[]power2-0[]] _*",
            "E * integer emulation (power2) within 0 steps of onnxruntime: tensor "
            f"'{FIRST_QDQ}' (order 1) differs by up to 9 steps, 84366 / 153600 elements (54.9%) (pair 'qdq')",
            "E * Tolerance from: check() argument max_backend_steps=",
            "E * Next diverging tensors (> 0 steps):",
            "E * pool1_QuantizeLinear_Output (order 2): 9 steps, 30265 / 38400 elements",
        ]
    )
    # N = 9: the first conv is within tolerance, so the first divergence is the logits (43 steps).
    result.stdout.fnmatch_lines(
        [
            "*_ test_gate[[]power2-9[]] _*",
            "E * integer emulation (power2) within 9 steps of onnxruntime: tensor 'logits_QuantizeLinear_Output' "
            "(order 6) differs by up to 43 steps, 2936 / 3000 elements (97.9%) (pair 'qdq')",
            "E * Tolerance from: *",
            "E * Tensors that differ: 7 / 8; max 43 steps at 'logits_QuantizeLinear_Output' (300 records)",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*_ test_gate[[]tflite-0[]] _*",
            f"E * integer emulation (tflite) within 0 steps of onnxruntime: tensor '{FIRST_QDQ}' (order 1) "
            "differs by up to 1 step, 284 / 153600 elements (0.185%) (pair 'qdq')",
        ]
    )
    assert "Worst layers" not in result.stdout.str()  # the fp32 comparison says nothing about the gate
    assert "sensitivity" not in result.stdout.str()  # nor does a node ranking: no table for a gate failure
    # the gate measured each scheme once: one record per scheme, with the comparison on onnxruntime
    pairs = {p["scheme"]: p for p in _pairs(digits.path)}
    assert sorted(pairs) == ["power2", "tflite"]
    for scheme, pair in pairs.items():
        assert pair["backend"] == "onnxruntime"
        comparison = json.loads((digits.path / ".qaccuracy" / pair["artifacts"]["comparison"]).read_text())
        assert (comparison["backend"], comparison["scheme"]) == ("onnxruntime", None)
        assert pair["agreement"]["scheme"] == scheme
    verdicts = [
        (c["threshold"], c["value"], c["passed"])
        for c in pairs["power2"]["checks"]
        if c["check"] == "max_backend_steps"
    ]
    assert sorted(verdicts) == [(0.0, 9.0, False), (9.0, 43.0, False), (43.0, 43.0, True)]
    result.stdout.fnmatch_lines(["qdq: FAILED (* 300 records, backend onnxruntime, scheme", "    power2)"])  # wrapped
    result.stdout.fnmatch_lines(
        [
            "  failed 2 of 4 checks (agreement gate 2), worst first:",
            "    tensor 'relu1_QuantizeLinear_Output' (power2)   steps vs onnxruntime  9   <= 0  [[]1[]]",
            "    tensor 'logits_QuantizeLinear_Output' (power2)  steps vs onnxruntime  43  <= 9  [[]1[]]",
        ]
    )


def test_ini_and_command_line_routes(digits: pytest.Pytester) -> None:
    digits.makeini(
        "[pytest]\nqaccuracy_backend = integer\nqaccuracy_scheme = power2\nqaccuracy_max_backend_steps = 0\n"
    )
    digits.makepyfile(test_marked=MARKED.format(keys=", backend=None, scheme=None"))  # None: the ini's
    result = digits.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            f"E * integer emulation (power2) within 0 steps of onnxruntime: tensor '{FIRST_QDQ}' *",
            "E * Tolerance from: ini file tox.ini (qaccuracy_max_backend_steps)",
        ]
    )
    pair = _artifact(digits.path, "qdq")
    assert (pair["comparison"]["backend"], pair["comparison"]["scheme"]) == ("integer", "power2")
    assert pair["comparison"]["outputs"][0]["metrics"]["sqnr"] < 20  # power2 arithmetic reached the outputs

    result = digits.runpytest("--qaccuracy-scheme=tflite", "--qaccuracy-max-backend-steps=1")
    result.assert_outcomes(passed=1)
    pair = _artifact(digits.path, "qdq")
    assert (pair["summary"]["backend"], pair["summary"]["scheme"]) == ("integer", "tflite")
    (gate,) = [c for c in pair["summary"]["checks"] if c["check"] == "max_backend_steps"]
    assert gate["source"] == "command line --qaccuracy-max-backend-steps" and gate["value"] == 1

    result = digits.runpytest("--qaccuracy-backend=onnxruntime", "--qaccuracy-scheme=onnxruntime")
    result.assert_outcomes(passed=1)
    pair = _artifact(digits.path, "qdq")
    assert (pair["comparison"]["backend"], pair["comparison"]["scheme"]) == ("onnxruntime", None)


def test_marker_keys(digits: pytest.Pytester) -> None:
    digits.makeini("[pytest]\nqaccuracy_scheme = power2\n")  # the marker's scheme wins
    digits.makepyfile(test_marked=MARKED.format(keys=', backend="integer", scheme="tflite", max_backend_steps=0'))
    result = digits.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E * integer emulation (tflite) within 0 steps * differs by up to 1 step, *",
            "E * Tolerance from: marker @pytest.mark.qaccuracy(max_backend_steps=...)",
        ]
    )
    assert _artifact(digits.path, "qdq")["comparison"]["scheme"] == "tflite"


def test_suite_keys_and_item_order(digits: pytest.Pytester) -> None:
    digits.makefile(".toml", qaccuracy_backends=SUITE)
    result = digits.runpytest("--collect-only", "-q")
    assert [line for line in result.outlines if "::" in line] == [
        "qaccuracy_backends.toml::qoperator::min_cosine",
        "qaccuracy_backends.toml::qoperator::min_sqnr",
        "qaccuracy_backends.toml::qoperator::max_backend_steps",
        "qaccuracy_backends.toml::power2::min_cosine",
        "qaccuracy_backends.toml::power2::max_backend_steps",
    ]
    result = digits.runpytest("-v")
    result.assert_outcomes(passed=4, failed=1)
    # power2's outputs still pass min_cosine: only the gate sees that the arithmetic is not onnxruntime's
    result.stdout.fnmatch_lines(["*::power2::min_cosine PASSED*", "*::power2::max_backend_steps FAILED*"])
    result.stdout.fnmatch_lines(
        [
            "*_ qaccuracy: power2::max_backend_steps _*",
            f"integer emulation (power2) within 0 steps of onnxruntime: tensor '{FIRST_QDQ}' *(pair 'power2')",
            "Tolerance from: qaccuracy_backends.toml [defaults.tolerances]",
        ]
    )
    result.stdout.fnmatch_lines(["qoperator: PASSED (* backend integer,", f"    scheme {host_preset()})"])
    assert _artifact(digits.path, "qoperator")["comparison"]["backend"] == "integer"


BAD_OPTIONS = {
    "ini-scheme": (
        ("-o", "qaccuracy_scheme=tflit"),
        f"ERROR: qaccuracy_scheme: unknown scheme 'tflit' (presets: {PRESETS})",
    ),
    "cli-backend": (
        ("--qaccuracy-backend=gpu",),
        "ERROR: --qaccuracy-backend: unknown backend 'gpu' (known: onnxruntime, integer)",
    ),
    "ini-backend": (("-o", "qaccuracy_backend=Integer"), "ERROR: qaccuracy_backend: unknown backend 'Integer' *"),
    "cli-steps": (
        ("--qaccuracy-max-backend-steps=0.5",),
        "ERROR: --qaccuracy-max-backend-steps: expected an integer, got '0.5'",
    ),
    "ini-steps": (("-o", "qaccuracy_max_backend_steps=-1"), "ERROR: qaccuracy_max_backend_steps: must be >= 0, got -1"),
}


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
def test_bad_option_is_one_error_line_and_exit_4(pytester: pytest.Pytester, case: str) -> None:
    args, expected = BAD_OPTIONS[case]
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert len([line for line in result.errlines if line.startswith("ERROR:")]) == 1
    result.stderr.fnmatch_lines([expected])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_bad_marker_key_fails_naming_it(digits: pytest.Pytester) -> None:
    digits.makepyfile(test_marked=MARKED.format(keys=', scheme="tflit"'))
    result = digits.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*scheme: unknown scheme 'tflit' (presets: {PRESETS})"])
    assert "Traceback" not in result.stdout.str()


def test_bad_pair_argument_fails_naming_it(digits: pytest.Pytester) -> None:
    """A scheme given to ``qaccuracy.pair(...)`` is checked where it arrives: the test fails, one line."""
    digits.makepyfile(
        test_arg="""
def test_arg(qaccuracy):
    qaccuracy.pair("models/digits_cnn.onnx", "models/digits_cnn.qdq.onnx", "data/digits_test.npz", scheme="tflit")
"""
    )
    result = digits.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*scheme: unknown scheme 'tflit' (presets: {PRESETS})"])
    assert "Traceback" not in result.stdout.str()


def test_suite_pair_carries_its_checked_run_keys(tmp_path: Path) -> None:
    """A suite's backend, scheme and targets reach the pair as checked (targets split and deduplicated);
    a pair that sets none gets the options' values as they were read."""
    for name in ("m.onnx", "q.onnx", "d.npz"):
        (tmp_path / name).touch()
    suite = tmp_path / "qaccuracy_s.toml"
    suite.write_text(
        '[defaults]\nfp32 = "m.onnx"\ndata = "d.npz"\n[pairs.a]\nquantized = "q.onnx"\nscheme = "glow"\n'
        'targets = "tflite, power2 tflite"\n[pairs.b]\nquantized = "q.onnx"\n'
    )
    a, b = load_suite(suite, run={"backend": "integer", "scheme": "tflite", "targets": ("power2",)})
    assert (a.spec.backend, a.spec.scheme, a.spec.targets) == ("integer", "glow", ("tflite", "power2"))
    assert (b.spec.backend, b.spec.scheme, b.spec.targets) == ("integer", "tflite", ("power2",))


@pytest.mark.parametrize(
    "line,expected",
    [
        ('scheme = "tflit"', f"pairs.power2.scheme: unknown scheme 'tflit' (presets: {PRESETS})"),
        ('backend = "gpu"', "pairs.power2.backend: unknown backend 'gpu' (known: onnxruntime, integer)"),
        ("scheme = 2", "pairs.power2.scheme: unknown scheme 2 (presets: *)"),
    ],
)
def test_bad_suite_key_is_a_collection_error(digits: pytest.Pytester, line: str, expected: str) -> None:
    digits.makefile(".toml", qaccuracy_bad=SUITE.replace('scheme = "power2"', line))
    result = digits.runpytest()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*ERROR collecting qaccuracy_bad.toml*", f"qaccuracy_bad.toml: {expected}"])


def test_bad_suite_gate_value(digits: pytest.Pytester) -> None:
    digits.makefile(".toml", qaccuracy_bad=SUITE.replace("max_backend_steps = 0", "max_backend_steps = 1.5"))
    result = digits.runpytest()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        ["qaccuracy_bad.toml: pairs.qoperator.tolerances.max_backend_steps: expected an integer*"]
    )


def test_xdist_summary_matches_serial(digits: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    digits.makefile(".toml", qaccuracy_backends=SUITE)
    digits.makepyfile(test_gate=GATE_MODULE)
    serial = digits.runpytest_subprocess("--qaccuracy-artifacts-dir=serial", "-p", "no:randomly")
    parallel = digits.runpytest_subprocess("-n", "2", "--qaccuracy-artifacts-dir=parallel")
    serial.assert_outcomes(passed=6, failed=4)
    parallel.assert_outcomes(passed=6, failed=4)

    def block(result: pytest.RunResult) -> list[str]:
        lines = result.outlines
        start = next(i for i, line in enumerate(lines) if "quantization accuracy summary" in line)
        return lines[start : next(i for i in range(start, len(lines)) if "pairs passed" in lines[i])]

    assert block(serial) == block(parallel)
    assert any("tensor 'relu1_QuantizeLinear_Output' (power2)" in line for line in block(parallel))

    def summary(folder: str) -> dict:
        document = json.loads((digits.path / folder / "summary.json").read_text())
        document.pop("created")
        for pair in document["pairs"]:  # what each pair's analysis took is the run's own
            (pair["sensitivity"] or {}).pop("seconds", None)
        return document

    first, second = summary("serial"), summary("parallel")
    assert first == second
    assert sum(p["agreement"] is not None for p in first["pairs"]) == 4


def test_names_match_the_library() -> None:
    from pytest_qaccuracy.presets import NAMES
    from pytest_qaccuracy.runtime import BACKENDS as LIBRARY_BACKENDS

    assert ", ".join(NAMES) == PRESETS
    assert tuple(LIBRARY_BACKENDS) == BACKENDS


def test_backend_and_scheme_are_part_of_a_pair_key(tmp_path: Path) -> None:
    paths = [tmp_path / name for name in ("m.onnx", "m.int8.onnx", "d.npz")]
    default = PairSpec("p", *paths)
    assert default.key(tmp_path) == "p|m.onnx|m.int8.onnx|d.npz"  # unchanged: old stems and baselines hold
    assert PairSpec("p", *paths, backend="integer").key(tmp_path).endswith("|d.npz|backend=integer")
    assert PairSpec("p", *paths, scheme="tflite").key(tmp_path).endswith("|d.npz|scheme=tflite")
    assert len({default, PairSpec("p", *paths, backend="integer"), PairSpec("p", *paths, scheme="glow")}) == 3


@pytest.mark.parametrize("scheme", ["onnxruntime", "tflite"])
def test_gate_on_a_float_model_compares_its_float_tensors(digits: pytest.Pytester, scheme: str) -> None:
    """No 8-bit tensor: the gate compares the tensors the checks read, in units in the last place. The
    host's preset runs float ops on onnxruntime (equal); another scheme's numpy float convolution is
    not onnxruntime's (issue 32)."""
    keys = f", scheme={scheme!r}, max_backend_steps=3"
    digits.makepyfile(test_marked=MARKED.format(keys=keys).replace("digits_cnn.qdq", "digits_cnn"))
    result = digits.runpytest("-rA")
    if scheme == "onnxruntime":
        result.assert_outcomes(passed=1)
        return
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E * integer emulation (tflite) within 3 steps of onnxruntime: "
            "tensor 'conv1' (order 0) differs by up to * ulps, * elements (*) (pair 'qdq')"
        ]
    )
