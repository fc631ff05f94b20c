"""The qaccuracy command: compare end to end, exit codes, one-line errors."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import h5py
import numpy as np
import pytest

from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.cli import main


def test_compare_prints_tables_and_writes_every_artifact(zoo, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(
        [
            "compare",
            str(zoo["fp32"]),
            str(zoo["qdq_u8"]),
            "--data",
            str(zoo["data"]),
            "--metrics",
            "mse,sqnr,srmse",
            "--out-dir",
            str(out),
            "--json",
            str(tmp_path / "r.json"),
            "--top",
            "3",
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "logits" in text and "Worst 3 of 12 layers by sqnr" in text
    result = ComparisonResult.from_dict(json.loads((tmp_path / "r.json").read_text()))
    assert result.records == 12 and result.metric_names == ["mse", "sqnr", "srmse"]
    stem = "net.qdq_u8"
    expected = {f"{stem}.comparison.json", "report.html"} | {
        f"{stem}.{m}.{ext}" for m in ("mse", "sqnr", "srmse") for ext in ("visq.json", "dot")
    }
    assert {p.name for p in out.iterdir()} == expected
    visq = json.loads((out / f"{stem}.mse.visq.json").read_text())
    assert visq["meta"]["model"] == "net.onnx" and visq["meta"]["metric"] == "MSE"
    assert set(visq["error"][0]) == {layer.tensor for layer in result.layers}


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


def test_bad_input_is_exit_2_with_one_error_line(zoo, tmp_path, capsys):
    args = ["compare", str(zoo["fp32"]), str(zoo["qop_u8"])]
    assert main([*args, "--data", str(tmp_path / "none.h5")]) == 2
    assert _error_line(capsys) == f"error: {tmp_path / 'none.h5'}: dataset not found"
    assert main([*args, "--data", str(zoo["data"]), "--metrics", "mse,nope"]) == 2
    assert _error_line(capsys).startswith("error: unknown metric 'nope'; available: mse")
    bad = tmp_path / "bad.h5"
    with h5py.File(bad, "w") as f:
        f.create_dataset("value/0/0", data=np.zeros((1, 16, 16, 3), np.float32))
    assert main([*args, "--data", str(bad)]) == 2
    assert _error_line(capsys) == (
        "error: bad.h5: record 0, input 0 ('x'): shape (1, 16, 16, 3) does not match the model input (N, 3, 16, 16)"
    )
    assert main([*args, "--data", str(zoo["data"]), "--backend", "onnxruntime", "--scheme", "tflite"]) == 2
    assert _error_line(capsys) == "error: --scheme applies to --backend integer only"


def test_a_failure_inside_a_check_is_one_error_line(zoo, monkeypatch, capsys):
    """A tensor the metrics cannot take (any exception while folding a batch) ends the command with one
    line naming the layer and the cause, exit code 2, no traceback."""
    from pytest_qaccuracy.metrics import pair

    def broken(self, ref, test):
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(pair.RecordStats, "__init__", broken)
    args = ["compare", str(zoo["fp32"]), str(zoo["qop_u8"]), "--data", str(zoo["data"]), "--metrics", "mse"]
    assert main(args) == 2
    line = _error_line(capsys)
    assert line.startswith("error: ") and line.endswith(": IndexError: tuple index out of range"), line
    assert "output '" in line or "layer '" in line


def test_a_scheme_needs_the_integer_backend_named(zoo, tmp_path, capsys) -> None:
    """``--backend integer --scheme onnxruntime-avx2`` is the layer-wise view of a CPU without VNNI, from
    any machine; ``--scheme`` alone does not switch backends (the plugin's does not either)."""
    out = tmp_path / "avx2.json"
    args = ["compare", str(zoo["fp32"]), str(zoo["qop_u8"]), "--data", str(zoo["data"])]
    assert main([*args, "--scheme", "onnxruntime-avx2", "--json", str(out), "--outputs-only"]) == 2
    assert _error_line(capsys) == "error: --scheme applies to --backend integer only"  # as in the plugin: no switch
    argv = [*args, "--backend", "integer", "--scheme", "onnxruntime-avx2", "--json", str(out), "--outputs-only"]
    assert main(argv) == 0
    document = json.loads(out.read_text())
    assert (document["backend"], document["scheme"]) == ("integer", "onnxruntime-avx2")


def test_usage_errors_are_exit_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["compare", "a.onnx"])
    assert info.value.code == 2
    assert _error_line(capsys).startswith("error: qaccuracy compare: the following arguments are required")


def test_console_script_runs(zoo, tmp_path):
    """``python -m pytest_qaccuracy.cli`` in its own process: the same numbers as the library, and
    main()'s exit code becomes the process's (a usage error is 2, not a traceback's 1 or a silent 0)."""
    from pytest_qaccuracy.analysis.compare import compare
    from pytest_qaccuracy.model import ModelPair

    out = tmp_path / "r.json"
    args = [sys.executable, "-m", "pytest_qaccuracy.cli", "compare", str(zoo["fp32"]), str(zoo["qop_s8_pc"])]
    proc = subprocess.run(
        [*args, "--data", str(zoo["data"]), "--outputs-only", "--json", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    here = compare(ModelPair(zoo["fp32"], zoo["qop_s8_pc"]), zoo["data"], layers=False).outputs[0]
    there = ComparisonResult.from_dict(json.loads(out.read_text())).outputs[0]
    assert there.name == here.name == "logits"
    assert there.metrics == pytest.approx(here.metrics, rel=1e-12)
    row = next(line for line in proc.stdout.splitlines() if line.startswith("logits "))
    assert f"{here.metrics['cosine']:.6f}" in row
    proc = subprocess.run([*args, "--data", str(tmp_path / "none.h5")], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {tmp_path / 'none.h5'}: dataset not found"]


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"qaccuracy (pytest-qaccuracy) {version('pytest-qaccuracy')}"


def _option_help(command: str) -> dict[str, str]:
    """``{--option: its help text, whitespace collapsed}`` from ``qaccuracy COMMAND --help``."""
    from pytest_qaccuracy.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = sub.choices[command].format_help()
    found: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        stripped = line.strip()
        if line.startswith("  -"):
            flag, _, rest = stripped.partition(" ")
            current = flag.rstrip(",")
            found[current] = rest
        elif current is not None and line.startswith("    ") and stripped:
            found[current] += " " + stripped
        else:
            current = None
    return {flag: " ".join(value.split()) for flag, value in found.items()}


COMMANDS = ("compare", "report", "sensitivity", "run", "calibrate", "saturation")


def test_help_shows_every_default_and_shared_options_read_the_same():
    from pytest_qaccuracy.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    shared: dict[str, set[str]] = {}
    for command in COMMANDS:
        helps = _option_help(command)
        for action in sub.choices[command]._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            flag = max(action.option_strings, key=len)
            default = action.default
            if not (default is None or default is False or default == [] or default == argparse.SUPPRESS):
                assert "default" in helps[flag], (command, flag, helps[flag])
            if flag in ("--data", "--batch-size", "--threads", "--providers", "--top", "--json"):
                shared.setdefault(flag, set()).add(helps[flag].split(" write ")[0])
    top = {"N how many worst layers to print (default: 10)", "N how many nodes to print (default: 10)"}
    assert shared["--top"] == top
    for flag in ("--data", "--batch-size", "--threads", "--providers"):
        assert len(shared[flag]) == 1, shared[flag]  # one text, so one default and one meaning
    assert "(default: 8)" in shared["--batch-size"].pop() and "0: every core" in shared["--threads"].pop()
    # a deliberate difference is said where it applies
    assert "sensitivity defaults to reference" in _option_help("compare")["--capture"]
    assert "compare defaults to deployed" in _option_help("sensitivity")["--capture"]
    assert "compare defaults to onnxruntime" in _option_help("run")["--backend"]


def test_every_command_says_its_defaults_and_none_is_blank():
    """Every option of every command (recipe too) with a default says it in its help, and no help
    shows an empty ``(default: )`` (an empty-string default is said in words: ``--budget``)."""
    from pytest_qaccuracy.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command, parser in sub.choices.items():
        helps = _option_help(command)
        assert all("(default: )" not in text for text in helps.values()), (command, helps)
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            default = action.default
            if not (default is None or default is False or default == [] or default == argparse.SUPPRESS):
                assert "default" in helps[max(action.option_strings, key=len)], (command, action.option_strings)
    assert _option_help("recipe")["--budget"].endswith("(default: unbounded)")


def test_one_name_per_option_no_aliases_nor_abbreviations(capsys):
    from pytest_qaccuracy.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["sensitivity", "a.onnx", "b.onnx", "--data", "d.npz", "--metrics", "mse,cosine"])
    assert args.metrics == "mse,cosine"
    args = parser.parse_args(
        ["calibrate", "a.onnx", "--data", "d", "--out", "q", "--exclude-nodes", "c, d", "--json", "r.json"]
    )
    assert args.exclude_nodes == [("c", "d")] and str(args.json) == "r.json"
    for argv in (
        ["sensitivity", "a.onnx", "b.onnx", "--data", "d.npz", "--metric", "mse"],  # the 0.1 spellings
        ["calibrate", "a.onnx", "--data", "d.npz", "--out", "q.onnx", "--exclude", "a"],
        ["calibrate", "a.onnx", "--data", "d.npz", "--out", "q.onnx", "--ranges-json", "r.json"],
        ["compare", "a.onnx", "b.onnx", "--data", "d.npz", "--metric", "mse"],  # an abbreviation of --metrics
    ):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "unrecognized arguments: " + argv[-2] in err, err


@pytest.mark.parametrize("command", ["compare", "sensitivity"])
def test_a_missing_provider_is_exit_2_before_anything_runs(zoo, tmp_path, capsys, command):
    """As in the plugin: onnxruntime would silently fall back to the CPU."""
    import onnxruntime

    out = tmp_path / "r.json"
    args = [command, str(zoo["fp32"]), str(zoo["qdq_u8"]), "--data", str(zoo["data"]), "--json", str(out)]
    assert main([*args, "--providers", "NoSuchExecutionProvider,CPUExecutionProvider"]) == 2
    available = ", ".join(onnxruntime.get_available_providers())
    assert _error_line(capsys) == f"error: --providers: NoSuchExecutionProvider not available (available: {available})"
    assert not out.exists()


def test_ctrl_c_in_a_command_is_exit_130_with_one_line(monkeypatch, capsys) -> None:
    """A KeyboardInterrupt anywhere in a command: exit code 130 (128 + SIGINT, as shells report it),
    one ``error: interrupted`` line, no traceback."""
    from pytest_qaccuracy.commands import report

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "run", interrupted)
    assert main(["report", "somewhere"]) == 130
    assert _error_line(capsys) == "error: interrupted"


@pytest.mark.skipif(sys.platform == "win32", reason="a named pipe and SIGINT are POSIX")
def test_a_real_sigint_to_the_command_is_exit_130_with_one_line_and_no_artifact(zoo, tmp_path) -> None:
    """Ctrl-C as the shell sends it: SIGINT to a ``qaccuracy compare`` process blocked reading its
    dataset (a named pipe nobody writes). The process exits 130 with one ``error: interrupted`` line,
    not killed by the signal (-2) nor with a traceback, and writes no half JSON."""
    import errno
    import os
    import signal
    import time

    # a folder of .npy whose one record is a named pipe: the command blocks reading its header (an
    # .npz pipe is no wait: zipfile seeks to the end first and fails at once, racing the signal)
    data = tmp_path / "data"
    (data / "x").mkdir(parents=True)
    record = data / "x" / "0.npy"
    os.mkfifo(record)
    out = tmp_path / "r.json"
    args = ["compare", str(zoo["fp32"]), str(zoo["qdq_u8"]), "--data", str(data), "--json", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "pytest_qaccuracy.cli", *args], stderr=subprocess.PIPE, text=True)
    writer = None
    try:
        deadline = time.monotonic() + 120
        while True:  # opening the pipe's write end succeeds once the command has opened it to read
            try:
                writer = os.open(record, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                assert exc.errno == errno.ENXIO, exc
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the command never opened its dataset"
            time.sleep(0.05)
        time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read()  # still waiting for the record's bytes
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if writer is not None:
            os.close(writer)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (code, proc.stderr.read()) == (130, "error: interrupted\n")
    assert not out.exists()
