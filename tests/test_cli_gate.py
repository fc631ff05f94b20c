"""``qaccuracy compare`` as a gate (issue 34, item 3): the ini file's tolerances and rules, one flag per
tolerance, exit 1 when a check fails, the verdicts on stdout, in ``--json`` and in the report.

The bundled digits models: the broken one (calibrated on inputs scaled by 0.02) against the example
suite's ``pytest.ini`` (``min_cosine = 0.99``, every layer ``sqnr>=12``, the logits ``sqnr>=20``).
The expected cosine is computed here with onnxruntime and numpy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_qaccuracy.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "example_suites"
FP32 = EXAMPLES / "models" / "digits_cnn.onnx"
DATA = EXAMPLES / "data" / "digits_test.npz"
INI = EXAMPLES / "pytest.ini"


def _cosine(quantized: str) -> float:
    import onnxruntime as ort

    x = np.load(DATA)["x"]
    outputs = [
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0].astype(np.float64)
        for path in (FP32, EXAMPLES / "models" / quantized)
    ]
    f, q = (o.ravel() for o in outputs)
    return float(f @ q / (np.linalg.norm(f) * np.linalg.norm(q)))


def _compare(quantized: str, *extra: str) -> list[str]:
    return ["compare", str(FP32), str(EXAMPLES / "models" / quantized), "--data", str(DATA), *extra]


def test_the_broken_model_fails_the_ini_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(
        _compare("digits_cnn.broken.onnx", "--ini", str(INI), "--json", str(tmp_path / "r.json"), "--out-dir", str(out))
    )
    assert code == 1
    text = capsys.readouterr().out
    assert "digits_cnn.broken: FAILED" in text
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["passed"] is False
    by = {(c["kind"], c["check"], c["subject"]): c for c in document["checks"]}
    cosine = by["tolerance", "min_cosine", "output 'logits'"]
    assert cosine["value"] == pytest.approx(_cosine("digits_cnn.broken.onnx"), rel=1e-6)
    assert cosine["value"] < 0.5 and cosine["threshold"] == 0.99 and cosine["passed"] is False
    assert cosine["source"] == "ini file pytest.ini (qaccuracy_min_cosine)"
    rules = [c for c in document["checks"] if c["kind"] == "rule"]
    assert {c["check"] for c in rules} == {"*::* sqnr>=12", "*::logits sqnr>=20"}
    assert all(c["scope"] == "layer" and c["value"] < c["threshold"] and not c["passed"] for c in rules)
    # the failed checks are listed worst first: the largest share beyond its bound first
    rows = [
        line.strip() for line in text.splitlines() if line.startswith("    layer '") or line.startswith("    output '")
    ]
    share = {c["subject"]: (c["threshold"] - c["value"]) / c["threshold"] for c in document["checks"]}
    shown = [next(s for s in share if row.startswith(s)) for row in rows]
    assert len(rows) == 5 and [share[s] for s in shown] == sorted(share.values(), reverse=True)[:5]
    assert rows[0].startswith("layer 'x' (input)")  # 0.23 dB against 12 dB: the farthest
    assert f"and {len(document['checks']) - 5} more (--json, --out-dir)" in text
    report = (out / "report.html").read_text()
    assert '"verdict":{"status":"failed","label":"FAILED"' in report


def test_the_good_model_passes_and_flags_win_over_the_ini(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    json_path = tmp_path / "r.json"
    assert main(_compare("digits_cnn.qdq.onnx", "--ini", str(INI), "--json", str(json_path))) == 0
    document = json.loads(json_path.read_text())
    assert document["passed"] is True and all(c["passed"] for c in document["checks"])
    assert "digits_cnn.qdq: PASSED" in capsys.readouterr().out
    # a flag wins over the ini file's key, and names itself as the source
    assert (
        main(_compare("digits_cnn.qdq.onnx", "--ini", str(INI), "--min-cosine", "0.9999999", "--json", str(json_path)))
        == 1
    )
    (cosine,) = [c for c in json.loads(json_path.read_text())["checks"] if c["check"] == "min_cosine"]
    assert cosine["threshold"] == 0.9999999 and cosine["source"] == "command line --min-cosine"


def test_rule_and_top1_flags_without_an_ini(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    json_path = tmp_path / "r.json"
    args = ["--tolerance", "*::relu1 sqnr>=60", "--max-top1-drop", "0.5", "--json", str(json_path)]
    assert main(_compare("digits_cnn.qdq.onnx", *args)) == 1
    checks = json.loads(json_path.read_text())["checks"]
    (rule,) = [c for c in checks if c["kind"] == "rule"]
    assert rule["subject"] == "layer 'relu1' (Relu)" and rule["source"].startswith("command line --tolerance")
    drops = [c for c in checks if c["check"] == "max_top1_drop"]
    assert drops and all(c["passed"] for c in drops)  # the default min_cosine = 0.99 applies too
    assert any(c["check"] == "min_cosine" and c["source"] == "default" for c in checks)


def test_without_tolerances_nothing_is_gated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_compare("digits_cnn.broken.onnx", "--json", str(tmp_path / "r.json"))) == 0
    assert "checks" not in json.loads((tmp_path / "r.json").read_text())
    assert "1 comparison, no tolerances checked" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--min-cosine", "2"], "min_cosine: must be between 0 and 1, got 2.0"),
        (["--tolerance", "sqnr 12"], "bad tolerance rule 'sqnr 12'"),
        (["--ini", "nowhere.ini"], "nowhere.ini: cannot read it"),
    ],
)
def test_a_bad_tolerance_is_one_line_and_exit_2(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_compare("digits_cnn.qdq.onnx", *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_the_cli_imports_no_pytest() -> None:
    modules = "pytest_qaccuracy.commands.compare, pytest_qaccuracy.analysis.checks, pytest_qaccuracy.tolerances"
    code = f"import sys; import {modules}; print('pytest' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_ini_settings_read_as_the_plugin_reads_them(tmp_path: Path) -> None:
    """pytest.ini (a comment inside the rule lines), pyproject.toml, and a bad value naming file and key."""
    from pytest_qaccuracy.tolerances import Tolerance, ini_settings

    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\nqaccuracy_tolerances =\n    *::* sqnr>=12\n    # why\n    x::y cosine>0.5\n")
    tolerances, rules = ini_settings(ini)
    assert [(r.pair, r.layer, r.metric, r.op, r.value, r.position) for r in rules] == [
        ("*", "*", "sqnr", ">=", 12.0, 0),
        ("x", "y", "cosine", ">", 0.5, 1),
    ]
    assert tolerances == {
        "min_cosine": Tolerance("min_cosine", 0.99, "default"),
        "topk": Tolerance("topk", 1, "default"),
    }
    toml = tmp_path / "pyproject.toml"
    toml.write_text('[tool.pytest.ini_options]\nqaccuracy_min_sqnr = 20\nqaccuracy_tolerances = ["*::a sqnr>=3"]\n')
    tolerances, rules = ini_settings(toml)
    assert tolerances["min_sqnr"] == Tolerance("min_sqnr", 20.0, "ini file pyproject.toml (qaccuracy_min_sqnr)")
    assert [r.text for r in rules] == ["*::a sqnr>=3"]
    ini.write_text("[pytest]\nqaccuracy_rtol = 1%\n")
    with pytest.raises(ValueError, match=r"pytest.ini: qaccuracy_rtol: expected a number, got '1%' \(write a fraction"):
        ini_settings(ini)
    (tmp_path / "tox.ini").write_text("[tox]\n")
    with pytest.raises(ValueError, match=r"tox.ini: no \[pytest\] section"):
        ini_settings(tmp_path / "tox.ini")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("pyproject.toml", "[tool.pytest]\nqaccuracy_min_sqnr = 20.5\nqaccuracy_tolerances = ['*::a sqnr>=3']\n"),
        ("pytest.toml", "[pytest]\nqaccuracy_min_sqnr = 20.5\nqaccuracy_tolerances = ['*::a sqnr>=3']\n"),
        (".pytest.toml", "[pytest]\nqaccuracy_min_sqnr = 20.5\nqaccuracy_tolerances = ['*::a sqnr>=3']\n"),
    ],
)
def test_ini_settings_read_pytest_9_native_toml_tables(tmp_path: Path, name: str, text: str) -> None:
    """pytest 9 reads ``[tool.pytest]`` (native TOML types) and ``pytest.toml``'s ``[pytest]``; ``--ini``
    reads the same tables (it had read only ``[tool.pytest.ini_options]`` and silently kept the defaults)."""
    from pytest_qaccuracy.tolerances import Tolerance, ini_settings

    path = tmp_path / name
    path.write_text(text)
    tolerances, rules = ini_settings(path)
    assert tolerances["min_sqnr"] == Tolerance("min_sqnr", 20.5, f"ini file {name} (qaccuracy_min_sqnr)")
    assert [r.text for r in rules] == ["*::a sqnr>=3"]


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("pyproject.toml", "[project]\nname = 'x'\n"),
        ("pyproject.toml", "[tool.ruff]\nline-length = 100\n"),
        ("pyproject.toml", "[tool.pytest]\n"),
        ("pytest.toml", "[tool.other]\nkey = 1\n"),
    ],
)
def test_a_toml_file_without_pytest_settings_gives_the_defaults(tmp_path: Path, name: str, text: str) -> None:
    """As pytest, a TOML file without (or with an empty) pytest table sets nothing."""
    from pytest_qaccuracy.tolerances import DEFAULTS, ini_settings, ini_task_metrics

    path = tmp_path / name
    path.write_text(text)
    tolerances, rules = ini_settings(path)
    assert {name: t.value for name, t in tolerances.items()} == dict(DEFAULTS) and rules == []
    assert ini_task_metrics(path) == ()


def test_an_ini_file_of_another_suffix_is_read_from_its_pytest_section(tmp_path: Path) -> None:
    from pytest_qaccuracy.tolerances import Tolerance, ini_settings

    path = tmp_path / "qaccuracy.conf"
    path.write_text("[tool:pytest]\nqaccuracy_min_sqnr = 5\n\n[pytest]\nqaccuracy_min_sqnr = 20\n")
    tolerances, _ = ini_settings(path)
    assert tolerances["min_sqnr"] == Tolerance("min_sqnr", 20.0, "ini file qaccuracy.conf (qaccuracy_min_sqnr)")
    path.write_text("[tool:pytest]\nqaccuracy_min_sqnr = 5\n")
    with pytest.raises(ValueError, match=r"qaccuracy.conf: no \[pytest\] section"):
        ini_settings(path)


def test_a_malformed_task_tolerance_line_is_named_with_its_file_and_key(tmp_path: Path) -> None:
    from pytest_qaccuracy.tolerances import ini_settings

    path = tmp_path / "pytest.ini"
    path.write_text("[pytest]\nqaccuracy_task_tolerances = cer 0.005\n")
    with pytest.raises(ValueError) as info:
        ini_settings(path)
    assert str(info.value).startswith(f"{path}: qaccuracy_task_tolerances: bad task tolerance 'cer 0.005': expected '<")


def test_ini_settings_refuse_both_pyproject_tables(tmp_path: Path) -> None:
    from pytest_qaccuracy.tolerances import ini_settings

    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.pytest]\nqaccuracy_min_sqnr = 20\n\n[tool.pytest.ini_options]\nqaccuracy_rtol = 0.1\n")
    with pytest.raises(
        ValueError, match=r"pyproject.toml: settings in both \[tool.pytest\] and \[tool.pytest.ini_options\]"
    ):
        ini_settings(path)


#: A task metric whose update raises on the second batch (records 8..15 at the default batch size).
RAISING = """
class Boom:
    higher_is_better = {"boom": True}

    def __init__(self):
        self.seen = 0

    def update(self, fp32, quantized, targets):
        self.seen += 1
        if self.seen == 2:
            raise RuntimeError("kaboom")

    def merge(self, other):
        pass

    def compute(self):
        return {"fp32": {"boom": 1.0}, "quantized": {"boom": 1.0}}


class NoMerge:
    higher_is_better = {"x": True}

    def update(self, fp32, quantized, targets):
        pass

    def compute(self):
        return {}
"""


@pytest.fixture
def task_folder(tmp_path: Path) -> Any:
    """A folder with the example's task metric and a raising one beside an ini file; the modules the
    command imports from it are forgotten afterwards."""
    import shutil

    shutil.copy(EXAMPLES / "digits_metrics.py", tmp_path / "cli_digits_metrics.py")
    (tmp_path / "cli_raising.py").write_text(RAISING)
    yield tmp_path
    for name in ("cli_digits_metrics", "cli_raising"):
        sys.modules.pop(name, None)


def _worst_recall(quantized: str) -> tuple[float, float]:
    """fp32 and quantized recall of the worst-read digit: onnxruntime and numpy, written here."""
    import onnxruntime as ort

    arrays = np.load(DATA)
    found = []
    for path in (FP32, EXAMPLES / "models" / quantized):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        predicted = session.run(None, {"x": arrays["x"]})[0].argmax(axis=1)
        labels = arrays["labels"]
        found.append(min(float(np.mean(predicted[labels == d] == d)) for d in np.unique(labels)))
    return found[0], found[1]


def test_the_ini_task_metrics_and_tolerances_gate_the_command(
    task_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """qaccuracy_task_metrics (a module beside the ini file) and qaccuracy_task_tolerances are read as
    the plugin reads them: a bound above the QDQ model's value fails (exit 1), the value is the one
    computed here, and --task-tolerance wins over the ini line."""
    fp32, qdq = _worst_recall("digits_cnn.qdq.onnx")
    ini = task_folder / "pytest.ini"
    ini.write_text(
        "[pytest]\nqaccuracy_min_cosine = 0.5\nqaccuracy_task_metrics = cli_digits_metrics:WorstClassRecall\n"
        f"qaccuracy_task_tolerances =\n    # the weakest digit\n    min:worst_class_recall = {qdq + 0.01}\n"
    )
    report = task_folder / "r.json"
    assert main(_compare("digits_cnn.qdq.onnx", "--ini", str(ini), "--json", str(report))) == 1
    out = capsys.readouterr().out
    assert "failed 1 of 2 checks (task metrics 1)" in out
    by = {c["check"]: c for c in json.loads(report.read_text())["checks"]}
    task = by["min:worst_class_recall"]
    assert (task["passed"], task["value"]) == (False, pytest.approx(qdq, abs=1e-12))
    assert task["source"] == "ini file pytest.ini (qaccuracy_task_tolerances)"
    assert f"fp32 {fp32:.6g}" in task["detail"] and by["min_cosine"]["passed"]

    lower = f"min:worst_class_recall = {qdq - 0.01}"
    assert (
        main(_compare("digits_cnn.qdq.onnx", "--ini", str(ini), "--task-tolerance", lower, "--json", str(report))) == 0
    )
    task = {c["check"]: c for c in json.loads(report.read_text())["checks"]}["min:worst_class_recall"]
    assert (task["passed"], task["source"]) == (True, "command line --task-tolerance")


def test_a_raising_task_metric_fails_only_its_own_check_in_the_command(
    task_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ini = task_folder / "pytest.ini"
    ini.write_text(
        "[pytest]\nqaccuracy_min_cosine = 0.5\nqaccuracy_task_metrics =\n    cli_raising:Boom\n"
        "    cli_digits_metrics:WorstClassRecall\n"
        "qaccuracy_task_tolerances =\n    min:boom = 0.5\n    max_drop:worst_class_recall = 0.5\n"
    )
    report = task_folder / "r.json"
    assert main(_compare("digits_cnn.qdq.onnx", "--ini", str(ini), "--json", str(report))) == 1
    by = {c["check"]: c for c in json.loads(report.read_text())["checks"]}
    assert by["min:boom"]["passed"] is False
    assert by["min:boom"]["detail"] == "min:boom: task metric 'cli_raising:Boom' on records 8..15: RuntimeError: kaboom"
    fp32, qdq = _worst_recall("digits_cnn.qdq.onnx")
    recall = by["max_drop:worst_class_recall"]
    assert (recall["passed"], recall["value"]) == (True, pytest.approx(fp32 - qdq, abs=1e-12))
    assert by["min_cosine"]["passed"] and "failed 1 of 3 checks (task metrics 1)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("ini_metric", "flag", "message"),
    [
        (
            "nowhere.metrics:CER",
            [],
            "pytest.ini: qaccuracy_task_metrics: task metric 'nowhere.metrics:CER': cannot import 'nowhere.metrics'",
        ),
        (
            None,
            ["--task-metric", "cli_raising:NoMerge"],
            "--task-metric: task metric 'cli_raising:NoMerge' has no method 'merge'",
        ),
        (None, ["--task-tolerance", "max_drop:cer 0.1"], "bad task tolerance 'max_drop:cer 0.1': expected"),
    ],
)
def test_an_unusable_task_metric_or_tolerance_is_one_line_and_exit_2(
    task_folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], ini_metric, flag, message
) -> None:
    """Before any model runs: nothing is written."""
    monkeypatch.chdir(task_folder)  # --task-metric modules come from the working folder
    ini = task_folder / "pytest.ini"
    ini.write_text("[pytest]\n" + (f"qaccuracy_task_metrics = {ini_metric}\n" if ini_metric else ""))
    report = task_folder / "r.json"
    assert main(_compare("digits_cnn.qdq.onnx", "--ini", str(ini), *flag, "--json", str(report))) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert not report.exists()


def test_ini_task_settings_read_as_the_plugin_reads_them(tmp_path: Path) -> None:
    from pytest_qaccuracy.tolerances import Tolerance, ini_settings, ini_task_metrics

    toml = tmp_path / "pyproject.toml"
    toml.write_text(
        "[tool.pytest.ini_options]\n"
        'qaccuracy_task_metrics = ["ctc", "a.b:C, binary_f1"]\n'
        'qaccuracy_task_tolerances = ["max_drop:cer = 0.005", "# note", "min:f1 = -0.5"]\n'
    )
    tolerances, _ = ini_settings(toml)
    source = "ini file pyproject.toml (qaccuracy_task_tolerances)"
    assert tolerances["max_drop:cer"] == Tolerance("max_drop:cer", 0.005, source)
    assert tolerances["min:f1"] == Tolerance("min:f1", -0.5, source)
    assert ini_task_metrics(toml) == ("ctc", "a.b:C", "binary_f1")
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\nqaccuracy_task_tolerances = max_drop:cer = abc\n")
    with pytest.raises(
        ValueError, match=r"pytest.ini: qaccuracy_task_tolerances: bad task tolerance|expected a number"
    ):
        ini_settings(ini)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("qaccuracy_min_cosine = abc\n", "{ini}: qaccuracy_min_cosine: expected a number, got 'abc'"),
        (
            "qaccuracy_task_tolerances =\n    max_drop:cer = x\n",
            "{ini}: qaccuracy_task_tolerances: expected a number, got 'x'",
        ),
        (
            "qaccuracy_tolerances =\n    relu* nonsense\n",
            "{ini}: qaccuracy_tolerances: bad tolerance rule 'relu* nonsense': "
            "expected '<pair glob>[::<layer glob>] <metric><op><value>'",
        ),
    ],
)
def test_ini_settings_errors_name_the_file_the_key_and_the_reason(tmp_path: Path, text: str, expected: str) -> None:
    from pytest_qaccuracy.tolerances import ini_settings

    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n" + text)
    with pytest.raises(ValueError) as caught:
        ini_settings(ini)
    assert str(caught.value) == expected.format(ini=ini)


def test_ini_settings_without_rules_or_task_lines_and_a_rules_source(tmp_path: Path) -> None:
    from pytest_qaccuracy.tolerances import ini_settings

    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\nqaccuracy_min_cosine = 0.9\n")
    tolerances, rules = ini_settings(ini)
    assert rules == [] and tolerances["min_cosine"].value == 0.9
    assert tolerances["min_cosine"].source == f"ini file {ini.name} (qaccuracy_min_cosine)"
    ini.write_text("[pytest]\nqaccuracy_tolerances =\n    relu* sqnr>=15\n")
    _, (rule,) = ini_settings(ini)
    assert (rule.text, rule.source) == ("relu* sqnr>=15", f"ini file {ini.name} (qaccuracy_tolerances)")
