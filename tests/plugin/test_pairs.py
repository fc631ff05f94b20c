"""Fixtures and marker on real models: verdicts, failure messages, caching, summary, artifacts, JUnit."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_qaccuracy.backend.host import host_preset

from .conftest import PAIRS_MODULE


def test_good_passes_broken_fails_with_full_message(digits: pytest.Pytester) -> None:
    digits.makepyfile(PAIRS_MODULE)
    result = digits.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "E       AssertionError: cosine 0.39* < 0.99 for output 'logits' (pair 'digits_cnn.broken')",
            "E       Tolerance from: default",
            "E       Also failed (1):",
            "E        top-1 agreement 0.07* < 0.9 for output 'logits'",
            "E       Worst records (cosine):",
            "E        record 49: 0.022*",
        ]
    )
    result.stdout.fnmatch_lines(["E       Worst layers (cosine):", "E        logits (Gemm): 0.39*"])
    # the input x is compared too: calibrated on inputs x0.02, it is already off (cosine 0.88)
    result.stdout.fnmatch_lines(["E       First jump (cosine): relu1 (Relu): 0.88* -> 0.45*"])
    result.stdout.fnmatch_lines(["E       Artifacts: *pairs*digits_cnn.broken-*.comparison.json"])
    named = next(line for line in result.outlines if line.startswith("E       Artifacts: "))
    comparison = json.loads(Path(named.split(": ", 1)[1]).read_text())  # the file the message names
    assert comparison["quantized_model"] == "digits_cnn.broken.onnx"


def test_session_summary_blocks(digits: pytest.Pytester) -> None:
    digits.makepyfile(PAIRS_MODULE)
    result = digits.runpytest()
    result.stdout.fnmatch_lines(
        [
            "*= quantization accuracy summary =*",
            # verdict first, quantized vs fp32; the data file goes to the block when the line would pass 100
            "digits_cnn.broken: FAILED (digits_cnn.broken.onnx vs digits_cnn.onnx, 300 records)",
            "digits_cnn.qdq: PASSED (digits_cnn.qdq.onnx vs digits_cnn.onnx on digits_test.npz, 300 records)",
            "",
            "digits_cnn.broken: FAILED on digits_test.npz",
            "  failed 2 of 2 checks (output tolerances 2), worst first:",
            # worst first: 0.073 is 93 % below 0.9, 0.39 is 60 % below 0.99
            "    output 'logits'  top-1 agreement  0.07*  >= 0.9   [[]1[]]",
            "    output 'logits'  cosine           0.39*  >= 0.99  [[]2[]]",
            "    [[]1[]] check() argument min_top1_agreement=",
            "    [[]2[]] default",
            "*most sensitive layers (sqnr): x (input) 0.2* dB, logits (Gemm)*",  # the input is clipped
            "1 / 2 pairs passed; artifacts in*",
        ]
    )


def test_artifacts_written_by_controller(digits: pytest.Pytester) -> None:
    digits.makepyfile(PAIRS_MODULE)
    digits.runpytest()
    root = digits.path / ".qaccuracy"
    summary = json.loads((root / "summary.json").read_text())
    assert summary["schema_version"] == 1
    assert set(summary["versions"]) >= {"onnx", "onnxruntime", "numpy", "python"}
    assert summary["created"].endswith("+00:00")
    ids = [p["id"] for p in summary["pairs"]]
    assert ids == ["digits_cnn.broken", "digits_cnn.qdq"]
    broken, good = summary["pairs"]
    assert broken["passed"] is False and good["passed"] is True
    assert len(broken["quantized"]["sha256"]) == 64 and broken["data"]["path"] == "data/digits_test.npz"
    comparison = json.loads((root / broken["artifacts"]["comparison"]).read_text())
    assert comparison["schema_version"] == 1 and comparison["quantized_model"] == "digits_cnn.broken.onnx"
    for metric, path in broken["artifacts"]["visq"].items():
        visq = json.loads((root / path).read_text())
        assert visq["meta"]["metric"] == metric.upper()
    assert set(broken["artifacts"]["visq"]) >= {"cosine", "sqnr", "mse"}
    assert (root / broken["artifacts"]["dot"]).read_text().startswith("digraph")
    assert not list(root.rglob("*.tmp"))
    assert summary["report"] == "report.html" and "digits_cnn.broken" in (root / "report.html").read_text()


def test_custom_artifacts_dir_and_no_artifacts(digits: pytest.Pytester) -> None:
    digits.makeini("[pytest]\nqaccuracy_artifacts_dir = out/acc\n")
    digits.makepyfile(PAIRS_MODULE)
    digits.runpytest("-k", "good")
    assert (digits.path / "out" / "acc" / "summary.json").is_file()
    digits.runpytest("-k", "good", "--qaccuracy-no-artifacts", "--qaccuracy-artifacts-dir=other")
    assert not (digits.path / "other").exists()


def test_comparison_runs_once_per_session(digits: pytest.Pytester) -> None:
    digits.makepyfile(
        """
        import pytest

        SEEN = []
        ARGS = ("models/digits_cnn.onnx", "models/digits_cnn.qdq.onnx", "data/digits_test.npz")

        @pytest.mark.parametrize("n", range(3))
        def test_same_pair(qaccuracy_pair, n):
            SEEN.append(qaccuracy_pair(*ARGS).result)
            assert all(r is SEEN[0] for r in SEEN)
            assert len(SEEN[0].layers) > 3
        """
    )
    digits.runpytest().assert_outcomes(passed=3)


def test_junit_properties(digits: pytest.Pytester) -> None:
    digits.makepyfile(PAIRS_MODULE)
    digits.runpytest("--junitxml=out.xml", "-W", "error::pytest.PytestWarning")
    cases = {case.get("name"): case for case in ET.parse(digits.path / "out.xml").iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["test_good"].iter("property")}
    assert props["qaccuracy.pair"] == "digits_cnn.qdq"
    assert props["qaccuracy.passed"] == "true"
    assert (props["qaccuracy.backend"], props["qaccuracy.scheme"]) == ("onnxruntime", host_preset())
    assert float(props["qaccuracy.logits.cosine"]) > 0.999
    assert float(props["qaccuracy.logits.top1_agreement"]) > 0.99
    broken = {p.get("name"): p.get("value") for p in cases["test_broken"].iter("property")}
    assert broken["qaccuracy.passed"] == "false"
    digits.runpytest("--junitxml=off.xml", "-o", "qaccuracy_junit_properties=false")
    assert not list(ET.parse(digits.path / "off.xml").iter("property"))


def test_rtol_and_layer_rules(digits: pytest.Pytester) -> None:
    digits.makeini("[pytest]\nqaccuracy_tolerances =\n    *::* sqnr>=30\n    *::relu1 sqnr>=50\n")
    digits.makepyfile(
        """
        ARGS = ("models/digits_cnn.onnx", "models/digits_cnn.qdq.onnx", "data/digits_test.npz")

        def test_rtol(qaccuracy, qaccuracy_pair):
            qaccuracy.check(qaccuracy_pair(*ARGS), rtol=0.01, atol=0.01)

        def test_layers(qaccuracy, qaccuracy_pair):
            qaccuracy.check(qaccuracy_pair(*ARGS))
        """
    )
    result = digits.runpytest()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "E       AssertionError: * / 3000 elements (*%) outside atol + rtol*|fp32| (rtol=0.01, atol=0.01) *",
            "E       Max absolute difference among violations: *",
            "E       Worst elements:",
            "E        record * [[]*[]]: * (ACTUAL), * (EXPECTED)",
        ]
    )
    # the most specific rule wins: relu1 needs 50 dB, the other layers 30 dB
    result.stdout.fnmatch_lines(
        [
            "E       AssertionError: sqnr 41.* dB < 50 dB for layer 'relu1' (Relu) (pair 'digits_cnn.qdq')",
            "E       Tolerance from: ini file tox.ini (qaccuracy_tolerances), rule '*::relu1 sqnr>=50'",
        ]
    )


def test_bad_pair_paths_fail_cleanly(digits: pytest.Pytester) -> None:
    digits.makepyfile(
        """
        def test_missing(qaccuracy, qaccuracy_pair):
            qaccuracy.check(qaccuracy_pair("models/nope.onnx", "models/digits_cnn.qdq.onnx", "data/digits_test.npz"))

        def test_no_marker(qaccuracy):
            qaccuracy.check()
        """
    )
    result = digits.runpytest()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["qaccuracy pair: fp32 not found: *nope.onnx"])
    result.stdout.fnmatch_lines(["a qaccuracy pair needs fp32, quantized and data; missing fp32, quantized, data"])


def test_dataset_fixture(digits: pytest.Pytester) -> None:
    digits.makepyfile(
        """
        import pytest

        @pytest.mark.qaccuracy(data="data/digits_test.npz")
        def test_data(qaccuracy_dataset):
            dataset = qaccuracy_dataset()
            assert len(dataset) == 300 and dataset.labels().shape == (300,)
        """
    )
    digits.runpytest().assert_outcomes(passed=1)


def test_topk_needs_a_class_score_output(pytester: pytest.Pytester) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(pytester.path / "boxes.onnx"))
    np.savez(pytester.path / "data.npz", x=np.random.default_rng(0).standard_normal((4, 2, 3)).astype(np.float32))
    pytester.makepyfile(
        """
        def test_boxes(qaccuracy, qaccuracy_pair):
            qaccuracy.check(qaccuracy_pair("boxes.onnx", "boxes.onnx", "data.npz"), min_top1_agreement=0.9)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E   *min_top1_agreement: cannot count top-1 on output 'y' float32 (*, 2, 3): not class scores "
            '(records, classes); to count per position: scores = "y" (classes last) or "y:<axis>" (pair \'boxes\')'
        ]
    )


def test_bad_data_is_one_line(digits: pytest.Pytester) -> None:
    import numpy as np

    np.savez(digits.path / "data" / "wrong.npz", x=np.zeros((3, 1, 9, 9), dtype=np.float32))
    digits.makepyfile(
        """
        def test_wrong_shape(qaccuracy, qaccuracy_pair):
            qaccuracy.check(qaccuracy_pair("models/digits_cnn.onnx", "models/digits_cnn.qdq.onnx", "data/wrong.npz"))
        """
    )
    result = digits.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["DataError: wrong.npz: record 0, input 'x': shape (1, 9, 9) does not match *"])
    assert "Traceback" not in result.stdout.str()


def test_metrics_and_providers_options(digits: pytest.Pytester) -> None:
    digits.makeini("[pytest]\nqaccuracy_metrics = mse mre\nqaccuracy_providers = CPUExecutionProvider\n")
    digits.makepyfile(PAIRS_MODULE)
    digits.runpytest("-k", "good").assert_outcomes(passed=1)
    visq = sorted(p.name.split(".")[-3] for p in (digits.path / ".qaccuracy" / "pairs").glob("*.visq.json"))
    assert visq == ["cosine", "lsb", "mre", "mse", "sqnr"]  # configured + what the tolerances need
    result = digits.runpytest("-k", "good", "--qaccuracy-providers=NoSuchExecutionProvider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["InputError: --qaccuracy-providers: NoSuchExecutionProvider not available (available: *"]
    )


def test_marker_pair_and_explicit_pairs(digits: pytest.Pytester) -> None:
    digits.makepyfile(
        """
        import pytest

        @pytest.mark.qaccuracy(fp32="models/digits_cnn.onnx", quantized="models/digits_cnn.qdq.onnx",
                               data="data/digits_test.npz", name="marked", min_cosine=0.9)
        def test_two(qaccuracy, qaccuracy_pair):
            assert qaccuracy.check().pair_id == "marked"
            other = qaccuracy_pair("models/digits_cnn.onnx", "models/digits_cnn.qoperator.onnx")  # marker's data
            assert qaccuracy.check(other).pair_id == "digits_cnn.qoperator"
        """
    )
    result = digits.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["digits_cnn.qoperator: PASSED *", "marked: PASSED *"])  # sorted by id
    checks = {
        p["id"]: p["checks"] for p in json.loads((digits.path / ".qaccuracy" / "summary.json").read_text())["pairs"]
    }
    assert [(c["check"], c["threshold"], c["passed"]) for c in checks["digits_cnn.qoperator"]] == [
        ("min_cosine", 0.9, True)  # the marker's tolerance applies to the explicit pair too
    ]


def test_a_clipped_rule_names_the_layer_whose_range_cuts_off_values(digits: pytest.Pytester) -> None:
    """Inputs 3x larger than the calibration data: the first layers' ranges saturate part of them."""
    digits.makeini("[pytest]\nqaccuracy_tolerances =\n    *::* clipped<=0.01\n")
    digits.makepyfile(
        """
        import numpy as np

        def test_scaled(qaccuracy, qaccuracy_pair, tmp_path):
            data = dict(np.load("data/digits_test.npz"))
            np.savez(tmp_path / "loud.npz", **{k: v * np.float32(3) for k, v in data.items()})
            pair = qaccuracy_pair("models/digits_cnn.onnx", "models/digits_cnn.qdq.onnx", tmp_path / "loud.npz")
            qaccuracy.check(pair, min_cosine=0.5)

        def test_as_calibrated(qaccuracy, qaccuracy_pair):
            pair = qaccuracy_pair("models/digits_cnn.onnx", "models/digits_cnn.qdq.onnx", "data/digits_test.npz")
            qaccuracy.check(pair, min_cosine=0.5)
        """
    )
    result = digits.runpytest()
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "E       AssertionError: clipped 0.* > 0.01 for layer 'x' (input) (pair 'digits_cnn.qdq')",
            "E       Tolerance from: ini file tox.ini (qaccuracy_tolerances), rule '*::* clipped<=0.01'",
        ]
    )
    # the graph input is quantized too: its range cuts off the 3x inputs first, then relu1's
    result.stdout.fnmatch_lines(["E        clipped 0.* > 0.01 for layer 'relu1' (Relu)"])
