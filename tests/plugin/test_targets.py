"""Deployment targets: a pair's output checks on several CPU families, side by side.

The 8-bit-weight digits model saturates u8 x s8 pairs on x86 CPUs without VNNI: its output SQNR is
37.1 dB with exact sums and 23.4 dB with int16 pairs, on whichever machine runs the test (this machine's
own target runs on onnxruntime, the other on the integer backend; both are bit-exact with their CPUs).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_qaccuracy.backend.host import host_preset

TARGETS_SUITE = """
[pairs.w8]
fp32 = "models/digits_cnn.onnx"
quantized = "models/digits_cnn.qdq_w8.onnx"
data = "data/digits_test.npz"
targets = ["onnxruntime-avx2", "onnxruntime-vnni"]

[pairs.w8.tolerances]
min_sqnr = {threshold}
"""


def _kind(target: str) -> str:
    return "onnxruntime" if target == host_preset() else "emulated"


def _label(target: str) -> str:
    """How a check of output 'logits' on ``target`` is named: the host's own target is the pair itself."""
    return "output 'logits'" if target == host_preset() else f"output 'logits' on {target}"


def test_a_target_that_saturates_fails_by_name_and_both_show_side_by_side(digits: pytest.Pytester) -> None:
    digits.makefile(".toml", qaccuracy_w8=TARGETS_SUITE.format(threshold=30.0) + "max_lsb = 1000\n")
    result = digits.runpytest("--junitxml=out.xml", "--qaccuracy-sensitivity=off")
    # min_sqnr fails on the AVX2 target; min_cosine before it and max_lsb after it pass on both, and the
    # target's verdict stays FAIL
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(
        [
            f"sqnr 23.4* dB < 30 dB for {_label('onnxruntime-avx2')} (pair 'w8')",
            "Tolerance from: qaccuracy_w8.toml [[]pairs.w8.tolerances[]]",
            "",
            "Worst records (sqnr):",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "  deployment targets:",
            f"    output    metric * onnxruntime-avx2 ({_kind('onnxruntime-avx2')}) * "
            f"onnxruntime-vnni ({_kind('onnxruntime-vnni')})",
            "*",
            "    logits    cosine           0.998*0.9999*",
            "    logits    sqnr             23.4*37.1*",
            "              checks           FAIL * pass",
        ]
    )
    summary = json.loads((digits.path / ".qaccuracy" / "summary.json").read_text())
    targets = summary["pairs"][0]["targets"]
    assert sorted(targets) == ["onnxruntime-avx2", "onnxruntime-vnni"]
    assert round(targets["onnxruntime-avx2"]["outputs"]["logits"]["sqnr"], 1) == 23.4
    assert round(targets["onnxruntime-vnni"]["outputs"]["logits"]["sqnr"], 1) == 37.1
    assert (targets["onnxruntime-avx2"]["passed"], targets["onnxruntime-vnni"]["passed"]) == (False, True)
    for name, entry in targets.items():
        assert entry["backend"] == ("onnxruntime" if name == host_preset() else "integer")
    checks = summary["pairs"][0]["checks"]
    failed = [c for c in checks if not c["passed"]]
    assert [c["target"] for c in failed] == [_label("onnxruntime-avx2")]
    case = next(c for c in ET.parse(digits.path / "out.xml").iter("testcase") if "min_sqnr" in c.get("name", ""))
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}  # of the failing item
    assert properties["qaccuracy.target.onnxruntime-avx2.passed"] == "false"
    assert properties["qaccuracy.target.onnxruntime-vnni.logits.sqnr"].startswith("37.1")
    report = (digits.path / ".qaccuracy" / "report.html").read_text()
    assert "Deployment targets" in report and "onnxruntime-avx2 (" in report


def test_the_sensitivity_analysis_does_not_aim_at_another_target(digits: pytest.Pytester) -> None:
    """The analysis runs the pair's own backend: a failure on another target gets no exclusion list.

    Only the AVX2 target fails: on a VNNI host that is another target; on an AVX2 host it is the host's
    own, and the analysis then aims at it.
    """
    digits.makefile(".toml", qaccuracy_w8=TARGETS_SUITE.format(threshold=30.0))
    result = digits.runpytest()
    if host_preset() == "onnxruntime-avx2":
        result.stdout.fnmatch_lines(["*target sqnr >= 30 (failed min_sqnr on output 'logits'): nodes_to_exclude=*"])
    else:
        assert "nodes_to_exclude=" not in result.stdout.str()
        result.stdout.fnmatch_lines(["*no exclusion list suggested*"])


def test_targets_from_the_ini_apply_to_marked_pairs_and_pass(digits: pytest.Pytester) -> None:
    digits.makeini("[pytest]\nqaccuracy_targets = onnxruntime-avx2, onnxruntime-vnni\n")
    digits.makepyfile(
        """
        import pytest

        @pytest.mark.qaccuracy(fp32="models/digits_cnn.onnx", quantized="models/digits_cnn.qdq.onnx",
                               data="data/digits_test.npz", min_sqnr=25)
        def test_x(qaccuracy):
            qaccuracy.check()
        """
    )
    result = digits.runpytest()
    result.assert_outcomes(passed=1)
    # 7-bit weights: both targets give the same figures (30.5 dB); a passing pair shows its verdict line only
    targets = json.loads((digits.path / ".qaccuracy" / "summary.json").read_text())["pairs"][0]["targets"]
    assert {name: round(run["outputs"]["logits"]["sqnr"], 2) for name, run in targets.items()} == {
        "onnxruntime-avx2": 30.47,
        "onnxruntime-vnni": 30.47,
    }
    assert not any("deployment targets:" in line for line in result.outlines)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ("-o", "qaccuracy_targets=onnxruntime-avx512"),
            "ERROR: qaccuracy_targets: unknown scheme 'onnxruntime-avx512' *",
        ),
        (("--qaccuracy-targets=tflite,nope",), "ERROR: --qaccuracy-targets: unknown scheme 'nope' *"),
        (
            ("--qaccuracy-targets=onnxruntime-arm64@1.10",),
            "ERROR: --qaccuracy-targets: 'onnxruntime-arm64@1.10': onnxruntime releases before 1.18 are not emulated",
        ),
        (("-o", "qaccuracy_scheme=tflite@1.28"), "ERROR: qaccuracy_scheme: 'tflite@1.28': only onnxruntime's *"),
    ],
)
def test_an_unknown_target_is_one_error_line(pytester: pytest.Pytester, args: tuple[str, ...], expected: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])


def test_an_unknown_target_in_a_suite_is_a_collection_error(digits: pytest.Pytester) -> None:
    digits.makefile(".toml", qaccuracy_w8=TARGETS_SUITE.format(threshold=30.0).replace("onnxruntime-vnni", "vnni"))
    result = digits.runpytest()
    result.stdout.fnmatch_lines(["*pairs.w8.targets: unknown scheme 'vnni' (presets: *"])


def test_max_saturated_names_the_layer_and_what_it_cost(digits: pytest.Pytester) -> None:
    suite = TARGETS_SUITE.format(threshold=20.0) + "max_saturated = 0\n"
    suite += '\n[pairs.seven_bit]\nfp32 = "models/digits_cnn.onnx"\nquantized = "models/digits_cnn.qdq.onnx"\n'
    suite += 'data = "data/digits_test.npz"\n[pairs.seven_bit.tolerances]\nmax_saturated = 0\n'
    digits.makefile(".toml", qaccuracy_w8=suite)
    result = digits.runpytest("-k", "max_saturated")
    result.assert_outcomes(failed=1, passed=1)  # 8-bit weights saturate, 7-bit ones cannot
    result.stdout.fnmatch_lines(
        [
            "saturated pair sums 0.52*% > 0% on onnxruntime-avx2: 18895 / 3628800 "
            "(worst layer 'conv1': 18895 / 768000, most in record 26) (pair 'w8')",
            "*",
            "Layers whose pair sums saturate on onnxruntime-avx2:",
            " conv1: 18895 / 768000 (2.46*%); output moved in 9586 / 153600 elements",
            "Output 'logits': SQNR 23.4* dB against onnxruntime-vnni",
        ]
    )
    assert "Worst layers" not in result.stdout.str().split("max_saturated ___")[1].split("Artifacts")[0]


def _run_targets(digits: pytest.Pytester, targets: list[str]) -> pytest.RunResult:
    """The suite with these targets (min_sqnr 30 dB), run without the sensitivity analysis: the AVX2
    target fails, the rest pass."""
    listed = ", ".join(f'"{t}"' for t in targets)
    suite = TARGETS_SUITE.replace('targets = ["onnxruntime-avx2", "onnxruntime-vnni"]', f"targets = [{listed}]")
    digits.makefile(".toml", qaccuracy_w8=suite.format(threshold=30.0))
    result = digits.runpytest("--qaccuracy-sensitivity=off")
    result.assert_outcomes(failed=1, passed=1)
    return result


def test_arm64_targets_show_beside_the_x86_ones(digits: pytest.Pytester) -> None:
    """x86 and ARM64 families side by side. The model (Conv, MaxPool, Gemm; u8 x s8, symmetric weights)
    has no QLinearAdd and no -128 weight, so both ARM64 families sum exactly: VNNI's 37.1 dB."""
    result = _run_targets(
        digits, ["onnxruntime-avx2", "onnxruntime-vnni", "onnxruntime-arm64", "onnxruntime-arm64-neon"]
    )
    out = result.stdout.str()
    table = out[out.index("  deployment targets:") : out.index("0 / 1 pairs passed")].splitlines()
    assert all(len(line) <= 100 for line in table)  # four targets: in blocks that fit, output and metric first
    assert all(any(f"onnxruntime-{name} (" in line for line in table) for name in ("avx2", "vnni", "arm64-neon"))
    rows = [line for line in table if line.split()[1:2] == ["sqnr"]]
    assert sorted(round(float(v), 1) for row in rows for v in row.split()[2:]) == [23.4, 37.1, 37.1, 37.1]
    targets = json.loads((digits.path / ".qaccuracy" / "summary.json").read_text())["pairs"][0]["targets"]
    assert sorted(targets) == ["onnxruntime-arm64", "onnxruntime-arm64-neon", "onnxruntime-avx2", "onnxruntime-vnni"]
    sqnr = {name: round(entry["outputs"]["logits"]["sqnr"], 1) for name, entry in targets.items()}
    assert sqnr["onnxruntime-arm64"] == sqnr["onnxruntime-arm64-neon"] == sqnr["onnxruntime-vnni"] == 37.1
    assert [name for name, entry in targets.items() if not entry["passed"]] == ["onnxruntime-avx2"]


def test_a_target_pinned_to_an_onnxruntime_release_runs_as_that_release(digits: pytest.Pytester) -> None:
    """``PRESET@MAJOR.MINOR``: the device's onnxruntime release, not the installed one; named so in the
    table and in summary.json, and run on the integer backend."""
    result = _run_targets(digits, ["onnxruntime-avx2@1.20", "onnxruntime-vnni@1.28"])
    # the first failure here, or listed after the pair's own on an AVX2 host (where the pair itself saturates)
    assert "sqnr 23.4034 dB < 30 dB for output 'logits' on onnxruntime-avx2@1.20" in result.stdout.str()
    result.stdout.fnmatch_lines(["*metric*onnxruntime-avx2@1.20 (emulated)", "*", "*", "*sqnr*23.4*"])
    result.stdout.fnmatch_lines(["*metric*onnxruntime-vnni@1.28 (emulated)", "*", "*", "*sqnr*37.1*"])
    targets = json.loads((digits.path / ".qaccuracy" / "summary.json").read_text())["pairs"][0]["targets"]
    assert sorted(targets) == ["onnxruntime-avx2@1.20", "onnxruntime-vnni@1.28"]
    assert round(targets["onnxruntime-vnni@1.28"]["outputs"]["logits"]["sqnr"], 1) == 37.1


def _wrapping_pair(folder: Path) -> None:
    """``conv.onnx`` and its QDQ model ``conv.qdq.onnx`` whose int8 weights hold pairs of -128 (an asymmetric
    weight quantization), and ``data.npz`` whose inputs are half zeros: ARM64 NEON pairs wrap there."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w = rng.choice(np.array([-128, -128, -40, 5, 90], np.int8), size=(6, 8, 3, 3)).astype(np.int8)
    x = np.where(rng.random((16, 8, 6, 6)) < 0.5, 0.0, rng.uniform(0.0, 5.1, (16, 8, 6, 6))).astype(np.float32)
    np.savez(folder / "data.npz", x=x)

    def model(nodes: list, inits: list) -> onnx.ModelProto:
        graph = helper.make_graph(
            nodes,
            "conv",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8, 6, 6])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            inits,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)

    fp32 = model(
        [helper.make_node("Conv", ["x", "wf"], ["y"], name="conv", pads=[1] * 4)],
        [numpy_helper.from_array(w.astype(np.float32) * np.float32(0.01), "wf")],
    )
    qdq = model(
        [
            helper.make_node("QuantizeLinear", ["x", "xs", "xzp"], ["xq"], name="x_q"),
            helper.make_node("DequantizeLinear", ["xq", "xs", "xzp"], ["xd"], name="x_dq"),
            helper.make_node("DequantizeLinear", ["w", "ws", "wzp"], ["wd"], name="w_dq"),
            helper.make_node("Conv", ["xd", "wd"], ["yf"], name="conv", pads=[1] * 4),
            helper.make_node("QuantizeLinear", ["yf", "ys", "yzp"], ["yq"], name="y_q"),
            helper.make_node("DequantizeLinear", ["yq", "ys", "yzp"], ["y"], name="y_dq"),
        ],
        [
            numpy_helper.from_array(np.float32(0.02), "xs"),
            numpy_helper.from_array(np.uint8(0), "xzp"),
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.float32(0.01), "ws"),
            numpy_helper.from_array(np.int8(0), "wzp"),
            numpy_helper.from_array(np.float32(0.5), "ys"),
            numpy_helper.from_array(np.uint8(128), "yzp"),
        ],
    )
    onnx.save(fp32, folder / "conv.onnx")
    onnx.save(qdq, folder / "conv.qdq.onnx")


def test_max_saturated_counts_arm64_wraps_on_an_arm64_target(pytester: pytest.Pytester) -> None:
    """``max_saturated`` measures x86 AVX2 always and each ARM64 target too, where pairs wrap."""
    _wrapping_pair(pytester.path)
    pytester.makefile(
        ".toml",
        qaccuracy_arm=(
            '[pairs.arm]\nfp32 = "conv.onnx"\nquantized = "conv.qdq.onnx"\ndata = "data.npz"\n'
            'targets = ["onnxruntime-arm64-neon"]\n[pairs.arm.tolerances]\nmax_saturated = 0\n'
        ),
    )
    result = pytester.runpytest("-k", "max_saturated", "--qaccuracy-sensitivity=off")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "saturated pair sums " in out and "% > 0% on onnxruntime-avx2: " in out  # u8 x s8 with -128 weights
    assert "wrapped pair sums " in out and "% > 0% on onnxruntime-arm64-neon: " in out
    result.stdout.fnmatch_lines(
        [
            "Layers whose pair sums wrap on onnxruntime-arm64-neon:",
            " conv: * / 138240 (*%); output moved in * / 3456 elements",
            "Output 'y': SQNR * dB against onnxruntime-arm64-neon with exact sums",
            "Remedies: symmetric int8 weights (WeightSymmetric), or the worst layers in float",
        ]
    )
    checks = json.loads((pytester.path / ".qaccuracy" / "summary.json").read_text())["pairs"][0]["checks"]
    subjects = {c["target"] for c in checks if c["check"] == "max_saturated" and not c["passed"]}
    assert subjects == {"onnxruntime-avx2 pair sums", "onnxruntime-arm64-neon pair sums"}
