"""Task metrics in real pytest sessions: named in the ini file, a marker or a suite, gated by
``min:`` / ``max:`` / ``max_drop:`` tolerances, shown in the summary, summary.json, JUnit XML and
baselines; bad metrics and targets fail with one line.

The expected figures come from onnxruntime run here and the worst-class recall computed here with
numpy, not from the plugin.
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from .conftest import EXAMPLES

FP32, DATA = "models/digits_cnn.onnx", "data/digits_test.npz"

#: A metric that fails on the second batch (records 8..15 at the default batch size of 8).
RAISING = """
class Boom:
    higher_is_better = {"boom": True}

    def __init__(self):
        self.seen = 0

    def update(self, fp32, quantized, targets):
        self.seen += 1
        if self.seen == 2:
            raise ValueError("boom on purpose\\nsecond line")

    def merge(self, other):
        pass

    def compute(self):
        return {"fp32": {"boom": 1.0}, "quantized": {"boom": 1.0}}


class NoCompute:
    higher_is_better = {"x": True}

    def update(self, fp32, quantized, targets):
        pass

    def merge(self, other):
        pass
"""


def _worst_recall(model: Path, data: Path) -> float:
    """min over digits of the share read right: onnxruntime and numpy, written here."""
    arrays = np.load(data)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    predicted = np.concatenate([session.run(None, {"x": x[None]})[0].argmax(axis=1) for x in arrays["x"]])
    labels = arrays["labels"]
    return min(float(np.mean(predicted[labels == d] == d)) for d in np.unique(labels))


@pytest.fixture
def project(digits: pytest.Pytester) -> pytest.Pytester:
    """The digits project with the example's task metric module and a raising one, importable by name."""
    shutil.copy(EXAMPLES / "digits_metrics.py", digits.path / "digits_metrics.py")
    digits.makepyfile(raising=RAISING)
    return digits


def _summary(root: Path) -> dict[str, dict]:
    return {p["id"]: p for p in json.loads((root / ".qaccuracy" / "summary.json").read_text())["pairs"]}


def test_ini_task_metric_gates_both_pairs_and_shows_everywhere(project: pytest.Pytester) -> None:
    project.makeini(
        """
        [pytest]
        pythonpath = .
        qaccuracy_min_cosine = 0
        qaccuracy_task_metrics = digits_metrics:WorstClassRecall
        qaccuracy_task_tolerances =
            max_drop:worst_class_recall = 0.02
            min:worst_class_recall = 0.5
        """
    )
    project.makepyfile(
        test_pairs=f"""
        import pytest

        @pytest.mark.qaccuracy(fp32="{FP32}", quantized="models/digits_cnn.qdq.onnx", data="{DATA}")
        def test_qdq(qaccuracy):
            qaccuracy.check()

        @pytest.mark.qaccuracy(fp32="{FP32}", quantized="models/digits_cnn.broken.onnx", data="{DATA}")
        def test_broken(qaccuracy):
            qaccuracy.check()
        """
    )
    result = project.runpytest("--junitxml=out.xml", "--qaccuracy-sensitivity=off")
    result.assert_outcomes(passed=1, failed=1)
    fp32 = _worst_recall(project.path / FP32, project.path / DATA)
    broken = _worst_recall(project.path / "models/digits_cnn.broken.onnx", project.path / DATA)
    qdq = _worst_recall(project.path / "models/digits_cnn.qdq.onnx", project.path / DATA)
    assert broken < 0.5 < qdq  # the broken model forgets a digit
    result.stdout.fnmatch_lines(
        [
            f"E * worst_class_recall drop {fp32 - broken:.6g} > 0.02 for task 'worst_class_recall' (fp32 {fp32:.6g}, "
            f"quantized {broken:.6g}; against the targets, 300 records) (pair 'digits_cnn.broken')",
            "E * Tolerance from: ini file tox.ini (qaccuracy_task_tolerances)",
            "E * Also failed (1):",
            f"E *  worst_class_recall {broken:.6g} < 0.5 for task 'worst_class_recall'*",
            "E * Worst layers (sqnr):",
        ]
    )
    # the block of the failed pair (a passing one shows its verdict line only), wrapped at 100 columns
    result.stdout.fnmatch_lines(
        [
            f"  task metric worst_class_recall: fp32 {fp32:.6g} -> quantized {broken:.6g} (drop {fp32 - broken:.6g};*",
            "      *against the targets, 300 records)",
        ]
    )
    pairs = _summary(project.path)
    task = pairs["digits_cnn.qdq"]["task"]["worst_class_recall"]
    assert task["fp32"] == pytest.approx(fp32, abs=1e-12)
    assert task["quantized"] == pytest.approx(qdq, abs=1e-12)
    assert task["drop"] == pytest.approx(fp32 - qdq, abs=1e-12)
    assert (task["against"], task["records"], task["higher_is_better"]) == ("targets", 300, True)
    checks = {c["check"]: c for c in pairs["digits_cnn.broken"]["checks"] if c["target"].startswith("task")}
    assert checks["min:worst_class_recall"]["value"] == pytest.approx(broken, abs=1e-12)
    assert checks["min:worst_class_recall"]["passed"] is False
    assert checks["max_drop:worst_class_recall"]["source"] == "ini file tox.ini (qaccuracy_task_tolerances)"
    props = {p.get("name"): p.get("value") for p in ET.parse(project.path / "out.xml").iter("property")}
    assert float(props["qaccuracy.task.worst_class_recall.fp32"]) == pytest.approx(fp32, rel=1e-5)
    html = (project.path / ".qaccuracy" / "report.html").read_text()
    assert "digits_metrics:WorstClassRecall" in html


def test_suite_and_marker_keys_with_a_command_line_tolerance(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\npythonpath = .\n")
    project.makefile(
        ".toml",
        qaccuracy_task=f"""
        [pairs.qdq]
        fp32 = "{FP32}"
        quantized = "models/digits_cnn.qdq.onnx"
        data = "{DATA}"
        task_metrics = [{{ metric = "digits_metrics:WorstClassRecall", output = "logits" }}]

        [pairs.qdq.tolerances]
        "max_drop:worst_class_recall" = 0.02
        "min:worst_class_recall" = 0.99
        """,
    )
    project.makepyfile(
        test_marker=f"""
        import pytest

        @pytest.mark.qaccuracy(fp32="{FP32}", quantized="models/digits_cnn.qdq.onnx", data="{DATA}",
                               task_metrics=["digits_metrics:WorstClassRecall"],
                               **{{"max_drop:worst_class_recall": 0.0}})
        def test_marker(qaccuracy):
            qaccuracy.check()
        """
    )
    qdq = _worst_recall(project.path / "models/digits_cnn.qdq.onnx", project.path / DATA)
    fp32 = _worst_recall(project.path / FP32, project.path / DATA)
    assert qdq < 0.99 and fp32 - qdq <= 0.0  # the QDQ model loses nothing on its weakest digit
    result = project.runpytest("-v", "--qaccuracy-sensitivity=off", "--qaccuracy-task-tolerance=max:nothing = 1")
    result.stdout.fnmatch_lines(
        [
            "*qaccuracy_task.toml::qdq::min_cosine PASSED*",
            "*qaccuracy_task.toml::qdq::max:nothing FAILED*",
            "*qaccuracy_task.toml::qdq::max_drop:worst_class_recall PASSED*",
            "*qaccuracy_task.toml::qdq::min:worst_class_recall FAILED*",
            "*test_marker.py::test_marker FAILED*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*max:nothing: no task metric computes 'nothing' (computed: worst_class_recall); name one in task_metrics*",
            "*Tolerance from: command line --qaccuracy-task-tolerance",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            f"*worst_class_recall {qdq:.6g} < 0.99 for task 'worst_class_recall'*",
            "*Tolerance from: qaccuracy_task.toml*",
        ]
    )
    marked = [
        c
        for c in _summary(project.path)["digits_cnn.qdq"]["checks"]
        if c["test"].endswith("test_marker") and c["check"] == "max_drop:worst_class_recall"
    ]
    assert [(c["passed"], c["value"], c["source"]) for c in marked] == [
        (True, pytest.approx(fp32 - qdq), "marker @pytest.mark.qaccuracy(max_drop:worst_class_recall=...)")
    ]


def test_xdist_workers_report_the_task_values_of_a_serial_run(project: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    project.makeini("[pytest]\npythonpath = .\nqaccuracy_task_metrics = digits_metrics:WorstClassRecall\n")
    project.makefile(
        ".toml",
        qaccuracy_two=f"""
        [defaults]
        fp32 = "{FP32}"
        data = "{DATA}"

        [defaults.tolerances]
        "max_drop:worst_class_recall" = 0.02

        [pairs.qdq]
        quantized = "models/digits_cnn.qdq.onnx"

        [pairs.broken]
        quantized = "models/digits_cnn.broken.onnx"
        """,
    )
    args = ("--qaccuracy-sensitivity=off", "-p", "no:randomly")
    serial = project.runpytest_subprocess("--qaccuracy-artifacts-dir=serial", *args)
    parallel = project.runpytest_subprocess("-n", "2", "--qaccuracy-artifacts-dir=parallel", *args)
    serial.assert_outcomes(passed=2, failed=2)  # broken: min_cosine and the task drop
    parallel.assert_outcomes(passed=2, failed=2)

    def tasks(folder: str) -> dict[str, object]:
        pairs = json.loads((project.path / folder / "summary.json").read_text())["pairs"]
        return {p["id"]: (p["task"], [c for c in p["checks"] if c["target"].startswith("task")]) for p in pairs}

    assert tasks("serial") == tasks("parallel")
    broken = _worst_recall(project.path / "models/digits_cnn.broken.onnx", project.path / DATA)
    assert tasks("parallel")["broken"][0]["worst_class_recall"]["quantized"] == pytest.approx(broken, abs=1e-12)


def test_a_sidecar_file_gives_the_targets_and_a_bad_one_names_its_line(project: pytest.Pytester) -> None:
    labels = np.load(project.path / DATA)["labels"]
    wrong = np.where(np.arange(300) % 2 == 0, labels, (labels + 1) % 10)  # half the targets wrong
    lines = [json.dumps({"record": i, "target": int(t)}) for i, t in enumerate(wrong)]
    (project.path / "truth.jsonl").write_text("\n".join(lines) + "\n")
    (project.path / "bad.jsonl").write_text("\n".join([*lines[:5], lines[3], *lines[5:]]) + "\n")
    project.makeini("[pytest]\npythonpath = .\n")
    project.makepyfile(
        test_sidecar=f"""
        import pytest

        KEYS = dict(fp32="{FP32}", quantized="models/digits_cnn.qdq.onnx", data="{DATA}",
                    task_metrics=["digits_metrics:WorstClassRecall"])

        @pytest.mark.qaccuracy(task_targets="truth.jsonl", **KEYS)
        def test_good(qaccuracy):
            qaccuracy.check()

        @pytest.mark.qaccuracy(task_targets="bad.jsonl", **KEYS)
        def test_bad(qaccuracy):
            qaccuracy.check()
        """
    )
    result = project.runpytest("--qaccuracy-sensitivity=off")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([f"*DataError: {project.path / 'bad.jsonl'}: line 6: record 3 again (first on line 4)"])
    task = _summary(project.path)["digits_cnn.qdq"]["task"]["worst_class_recall"]
    session = ort.InferenceSession(str(project.path / FP32), providers=["CPUExecutionProvider"])
    x = np.load(project.path / DATA)["x"]
    predicted = np.concatenate([session.run(None, {"x": r[None]})[0].argmax(axis=1) for r in x])
    expected = min(float(np.mean(predicted[wrong == d] == d)) for d in range(10))
    assert task["fp32"] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("metric", "message"),
    [
        ("nowhere.metrics:CER", "task metric 'nowhere.metrics:CER': cannot import 'nowhere.metrics' (ModuleNotFound*"),
        ("raising:NoCompute", "task metric 'raising:NoCompute' has no method 'compute' (a task metric needs update*"),
    ],
)
def test_an_unusable_metric_stops_the_session_at_start_with_one_line(project: pytest.Pytester, metric, message) -> None:
    project.makeini(f"[pytest]\npythonpath = .\nqaccuracy_task_metrics = {metric}\n")
    project.makepyfile(test_never="def test_never():\n    raise AssertionError('ran')\n")
    result = project.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: qaccuracy_task_metrics: {message}"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert "ran" not in result.stdout.str()


def test_a_metric_raising_on_a_batch_fails_that_check_naming_metric_pair_and_records(project: pytest.Pytester) -> None:
    """One test of the whole pair: the raising metric's check fails with its one line, the cosine
    and the other task metric's checks are measured and pass on their own."""
    project.makeini("[pytest]\npythonpath = .\n")
    project.makepyfile(
        test_raise=f"""
        import pytest

        @pytest.mark.qaccuracy(fp32="{FP32}", quantized="models/digits_cnn.qdq.onnx", data="{DATA}",
                               task_metrics=["raising:Boom", "digits_metrics:WorstClassRecall"], min_cosine=0.5,
                               **{{"min:boom": 0.5, "max_drop:worst_class_recall": 0.5}})
        def test_boom(qaccuracy):
            qaccuracy.check()
        """
    )
    result = project.runpytest("--qaccuracy-sensitivity=off")
    result.assert_outcomes(failed=1)
    line = "min:boom: task metric 'raising:Boom' on records 8..15: ValueError: boom on purpose"
    result.stdout.fnmatch_lines([f"E * {line} (pair 'digits_cnn.qdq')", "*failed 1 of * checks (task metrics 1)*"])
    assert "second line" not in result.stdout.str() and "Also failed" not in result.stdout.str()
    record = _summary(project.path)["digits_cnn.qdq"]
    checks = {c["check"]: c for c in record["checks"]}
    assert "error" not in checks
    assert (checks["min:boom"]["passed"], checks["min:boom"]["detail"]) == (False, line)
    drop = _worst_recall(project.path / FP32, project.path / DATA) - _worst_recall(
        project.path / "models/digits_cnn.qdq.onnx", project.path / DATA
    )
    recall = checks["max_drop:worst_class_recall"]
    assert (recall["passed"], recall["value"]) == (True, pytest.approx(drop, abs=1e-12))
    assert checks["min_cosine"]["passed"] and checks["min_cosine"]["value"] > 0.5
    assert record["task"]["boom"]["error"] == line.partition(": ")[2]
    assert record["task"]["boom"]["fp32"] is None and "error" not in record["task"]["worst_class_recall"]


def test_a_raising_metric_no_tolerance_gates_still_fails_the_test_of_its_pair(project: pytest.Pytester) -> None:
    """A broken metric does not go unnoticed: without a tolerance on its values, the marker's check
    of the whole pair fails with its line (check ``task_metrics``); the other checks pass."""
    project.makeini("[pytest]\npythonpath = .\n")
    project.makepyfile(
        test_raise=f"""
        import pytest

        @pytest.mark.qaccuracy(fp32="{FP32}", quantized="models/digits_cnn.qdq.onnx", data="{DATA}",
                               task_metrics=["raising:Boom"], min_cosine=0.5)
        def test_boom(qaccuracy):
            qaccuracy.check()
        """
    )
    result = project.runpytest("--qaccuracy-sensitivity=off")
    result.assert_outcomes(failed=1)
    line = "task metric 'raising:Boom' on records 8..15: ValueError: boom on purpose"
    result.stdout.fnmatch_lines([f"E * {line} (pair 'digits_cnn.qdq')"])
    checks = {c["check"]: c for c in _summary(project.path)["digits_cnn.qdq"]["checks"]}
    assert sorted(checks) == ["min_cosine", "task_metrics"]
    assert (checks["task_metrics"]["passed"], checks["task_metrics"]["detail"]) == (False, line)
    assert checks["min_cosine"]["passed"]


def test_a_raising_metric_fails_only_its_own_suite_items(project: pytest.Pytester) -> None:
    """The issue's case: an ini task metric whose update raises, a task tolerance on it, a suite pair
    with other checks: only the task item fails; cosine, top-1 and the rules run and pass."""
    project.makeini(
        """
        [pytest]
        pythonpath = .
        qaccuracy_task_metrics = raising:Boom
        qaccuracy_task_tolerances = min:boom = 0.5
        qaccuracy_tolerances = *::* sqnr>=-100
        """
    )
    project.makefile(
        ".toml",
        qaccuracy_boom=f"""
        [pairs.qdq]
        fp32 = "{FP32}"
        quantized = "models/digits_cnn.qdq.onnx"
        data = "{DATA}"

        [pairs.qdq.tolerances]
        min_cosine = 0.5
        min_top1_agreement = 0.5
        """,
    )
    result = project.runpytest("-v", "--qaccuracy-sensitivity=off", "-p", "no:randomly")
    result.stdout.fnmatch_lines(
        [
            "*qaccuracy_boom.toml::qdq::min_cosine PASSED*",
            "*qaccuracy_boom.toml::qdq::min_top1_agreement PASSED*",
            "*qaccuracy_boom.toml::qdq::min:boom FAILED*",
            "*qaccuracy_boom.toml::qdq::rules PASSED*",
        ]
    )
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*min:boom: task metric 'raising:Boom' on records 8..15: ValueError: boom on purpose (pair 'qdq')",
            "*failed 1 of * checks (task metrics 1)*",
            "*task metric boom: not computed (task metric 'raising:Boom' on records 8..15: ValueError: boom on*",
        ]
    )


@pytest.mark.parametrize(
    ("metric", "message"),
    [
        ("nowhere.metrics:CER", "task metric 'nowhere.metrics:CER': cannot import 'nowhere.metrics' (ModuleNotFound*"),
        ("raising:NoCompute", "task metric 'raising:NoCompute' has no method 'compute' (a task metric needs update*"),
    ],
)
def test_an_unusable_metric_in_a_marker_is_a_usage_error(project: pytest.Pytester, metric, message) -> None:
    """As in the ini file and suites: exit 4 after collection with one line naming the test, the
    marker and the metric; no test runs (the file's other test neither)."""
    project.makeini("[pytest]\npythonpath = .\n")
    project.makepyfile(
        test_bad=f"""
        import pytest

        @pytest.mark.qaccuracy(fp32="{FP32}", quantized="models/digits_cnn.qdq.onnx", data="{DATA}",
                               task_metrics=["{metric}"])
        def test_bad(qaccuracy):
            raise AssertionError("ran")

        def test_other():
            raise AssertionError("ran")
        """
    )
    result = project.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    where = "test_bad.py::test_bad: @pytest.mark.qaccuracy(task_metrics=...)"
    result.stderr.fnmatch_lines([f"ERROR: {where}: {message}"])
    assert len([x for x in result.stderr.lines if x.strip()]) == 1
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert "AssertionError: ran" not in result.stdout.str()


def test_task_values_on_each_deployment_target_and_in_baselines(project: pytest.Pytester) -> None:
    project.makeini(
        """
        [pytest]
        pythonpath = .
        qaccuracy_task_metrics = digits_metrics:WorstClassRecall
        qaccuracy_targets = onnxruntime-avx2 onnxruntime-vnni
        qaccuracy_max_drift = worst_class_recall:-0.01
        """
    )
    suite = f"""
    [pairs.w8]
    fp32 = "{FP32}"
    quantized = "models/digits_cnn.qdq.onnx"
    data = "{DATA}"

    [pairs.w8.tolerances]
    "max_drop:worst_class_recall" = 0.05
    """
    project.makefile(".toml", qaccuracy_w8=suite)
    saved = project.runpytest("--qaccuracy-sensitivity=off", "--qaccuracy-update-baselines")
    saved.assert_outcomes(passed=2)
    (baseline,) = (project.path / ".qaccuracy-baselines").glob("*.json")
    document = json.loads(baseline.read_text())
    qdq = _worst_recall(project.path / "models/digits_cnn.qdq.onnx", project.path / DATA)
    # rounded to 4 significant digits, finer than the drift rules in force resolve (docs/pytest.md)
    assert document["task"] == {"worst_class_recall": pytest.approx(qdq, rel=5e-4)}
    saved_value = document["task"]["worst_class_recall"]
    targets = _summary(project.path)["w8"]["targets"]
    assert set(targets) == {"onnxruntime-avx2", "onnxruntime-vnni"}
    assert all("worst_class_recall" in run["task"] for run in targets.values())
    # the same pair id and files, now holding the broken model: its task value drifts
    shutil.copy(project.path / "models/digits_cnn.broken.onnx", project.path / "models/digits_cnn.qdq.onnx")
    drifted = project.runpytest("--qaccuracy-sensitivity=off")
    broken = _worst_recall(project.path / "models/digits_cnn.broken.onnx", project.path / DATA)
    drifted.stdout.fnmatch_lines(
        [f"*drift: task 'worst_class_recall': worst_class_recall {saved_value:.6g} -> {broken:.6g} (limit *"]
    )


def _worst_recall_of(session: ort.InferenceSession, data: Path, records: int) -> float:
    arrays = np.load(data)
    predicted = np.concatenate([session.run(None, {"x": x[None]})[0].argmax(axis=1) for x in arrays["x"][:records]])
    labels = arrays["labels"][:records]
    return min(float(np.mean(predicted[labels == d] == d)) for d in np.unique(labels))


def test_the_end_of_session_analysis_aims_at_a_failed_task_metric(project: pytest.Pytester) -> None:
    import onnx

    from pytest_qaccuracy.analysis.partial import QdqGraph

    project.makeini(
        """
        [pytest]
        pythonpath = .
        qaccuracy_task_metrics = digits_metrics:WorstClassRecall
        qaccuracy_task_tolerances = max_drop:worst_class_recall = 0.02
        qaccuracy_sensitivity_records = 32
        """
    )
    project.makepyfile(
        test_broken=f"""
        import pytest

        @pytest.mark.qaccuracy(fp32="{FP32}", quantized="models/digits_cnn.broken.onnx", data="{DATA}")
        def test_broken(qaccuracy):
            qaccuracy.check()
        """
    )
    result = project.runpytest()
    result.assert_outcomes(failed=1)
    task = _summary(project.path)["digits_cnn.broken"]["sensitivity"]["task"]
    assert (task["check"], task["threshold"], task["records"]) == ("max_drop:worst_class_recall", 0.02, 32)
    steps, suggestion = task["steps"], task["suggestion"]
    assert suggestion == steps[-1]["excluded"] and len(steps) == len(suggestion) + 1
    assert all(step["drop"] > 0.02 for step in steps[:-1]) and steps[-1]["drop"] <= 0.02
    data, broken = project.path / DATA, project.path / "models/digits_cnn.broken.onnx"
    fp32 = _worst_recall_of(_session(project.path / FP32), data, 32)
    assert steps[0]["quantized"] == pytest.approx(_worst_recall_of(_session(broken), data, 32), abs=1e-12)
    # the suggested model, written and run here: the drop it shows is the one the sweep reported
    graph = QdqGraph(onnx.load(broken), onnx.load(project.path / FP32))
    model = graph.build(graph.all_edges - graph.edges_of(suggestion, "node"))
    kept = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert steps[-1]["drop"] == pytest.approx(fp32 - _worst_recall_of(kept, data, 32), abs=1e-12)
    line = (
        f"  target max_drop:worst_class_recall <= 0.02 (task metric, 32 records, {steps[0]['drop']:.6g} -> "
        f"{steps[-1]['drop']:.6g}): nodes_to_exclude={suggestion}"
    )
    assert " ".join(line.split()) in " ".join(result.stdout.str().split())  # wrapped at 100 columns


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_a_metric_module_beside_its_suite_imports_without_pythonpath(digits: pytest.Pytester) -> None:
    """The example suite's layout run from a parent folder whose ini has no ``pythonpath``: the module
    next to the suite file is found there (as pytest finds a conftest.py), serially and on xdist workers,
    and a module that is nowhere still fails with one line."""
    suites = digits.path / "suites"
    suites.mkdir()
    shutil.copy(EXAMPLES / "digits_metrics.py", suites / "digits_metrics.py")
    (suites / "qaccuracy_beside.toml").write_text(
        f'[pairs.qdq]\nfp32 = "../{FP32}"\nquantized = "../models/digits_cnn.qdq.onnx"\ndata = "../{DATA}"\n'
        'task_metrics = ["digits_metrics:WorstClassRecall"]\n\n[pairs.qdq.tolerances]\n'
        '"max_drop:worst_class_recall" = 0.5\n'
    )
    digits.makeini("[pytest]\n")
    for args in ((), ("-n", "2")):
        if args:
            pytest.importorskip("xdist")
        result = digits.runpytest_subprocess("--qaccuracy-sensitivity=off", "-p", "no:randomly", *args)
        result.assert_outcomes(passed=2)
    task = _summary(digits.path)["qdq"]["task"]["worst_class_recall"]
    assert task["fp32"] == pytest.approx(_worst_recall(digits.path / FP32, digits.path / DATA), abs=1e-12)

    (suites / "digits_metrics.py").unlink()
    result = digits.runpytest_subprocess("--qaccuracy-sensitivity=off")
    result.stderr.fnmatch_lines(["*task metric 'digits_metrics:WorstClassRecall': cannot import 'digits_metrics'*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # a usage error, as in the ini file


@pytest.mark.parametrize(
    ("metric", "message"),
    [
        ("nowhere.metrics:CER", "task metric 'nowhere.metrics:CER': cannot import 'nowhere.metrics' (ModuleNotFound*"),
        ("raising:NoCompute", "task metric 'raising:NoCompute' has no method 'compute' (a task metric needs update*"),
    ],
)
def test_an_unusable_metric_in_a_suite_is_a_usage_error(project: pytest.Pytester, metric, message) -> None:
    """As in the ini file: exit 4 with one line naming the suite, the pair and the metric; nothing runs."""
    project.makeini("[pytest]\npythonpath = .\n")
    suite = f"""
[pairs.bad]
fp32 = "{FP32}"
quantized = "models/digits_cnn.qdq.onnx"
data = "{DATA}"
task_metrics = ["{metric}"]
"""
    project.makefile(".toml", qaccuracy_bad=suite)
    project.makepyfile(test_never="def test_never():\n    raise AssertionError('ran')\n")
    result = project.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: qaccuracy_bad.toml: pairs.bad.task_metrics: {message}"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert "AssertionError: ran" not in result.stdout.str() and "no tests ran" in result.stdout.str()


@pytest.mark.parametrize("where", ["marker", "suite"])
def test_an_unusable_metric_is_a_usage_error_under_xdist_too(project: pytest.Pytester, where: str) -> None:
    """The workers find it while collecting; none runs a test, and the controller prints the line and
    exits 4 (pytest-xdist alone ended a suite's with "no tests ran", exit 5, and a marker's with an
    internal error, exit 3)."""
    pytest.importorskip("xdist")
    project.makeini("[pytest]\npythonpath = .\n")
    metric = "nowhere.metrics:CER"
    if where == "marker":
        project.makepyfile(
            test_bad=f"""
            import pytest

            @pytest.mark.qaccuracy(fp32="{FP32}", quantized="models/digits_cnn.qdq.onnx", data="{DATA}",
                                   task_metrics=["{metric}"])
            def test_bad(qaccuracy):
                raise AssertionError("ran")
            """
        )
        line = f"ERROR: test_bad.py::test_bad: @pytest.mark.qaccuracy(task_metrics=...): task metric '{metric}'*"
    else:
        suite = f'[pairs.bad]\nfp32 = "{FP32}"\nquantized = "models/digits_cnn.qdq.onnx"\ndata = "{DATA}"\n'
        project.makefile(".toml", qaccuracy_bad=suite + f'task_metrics = ["{metric}"]\n')
        line = f"ERROR: qaccuracy_bad.toml: pairs.bad.task_metrics: task metric '{metric}'*"
    project.makepyfile(test_never="def test_never():\n    raise AssertionError('ran')\n")
    result = project.runpytest_subprocess("-n", "2", "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([line])
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text and "AssertionError" not in text
    assert result.stderr.str().count("ERROR: ") == 1
