"""What each sub-command passes to the library and prints, with the library's heavy calls replaced
by recorders: every option reaches the call it is for, every refusal is one line naming its option.

The end-to-end runs (tests/test_cli.py, tests/analysis/) show the commands work on real models; these
show, in milliseconds, that nothing the user asked for is dropped on the way."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_qaccuracy.cli import main
from pytest_qaccuracy.runtime import RuntimeOptions


class Calls:
    """Records each replaced function's arguments under its name; returns what ``returns`` says."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.seen: dict[str, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {}

    def replace(self, module: Any, name: str, returns: Any = None) -> None:
        def record(*args: Any, **kwargs: Any) -> Any:
            self.seen.setdefault(name, []).append((args, kwargs))
            return returns(*args, **kwargs) if callable(returns) else returns

        self.monkeypatch.setattr(module, name, record)

    def one(self, name: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        assert len(self.seen.get(name, [])) == 1, (name, self.seen.get(name))
        return self.seen[name][0]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    return Calls(monkeypatch)


# -- calibrate ----------------------------------------------------------------------------------


def _calibrate(calls: Calls, tmp_path: Path, selection: Any = None, warning: str = "") -> dict[str, Path]:
    import pytest_qaccuracy.analysis.calibration as calibration
    import pytest_qaccuracy.analysis.calibration.auto as auto
    import pytest_qaccuracy.analysis.calibration.quantize as quantize
    import pytest_qaccuracy.model.loading as loading

    paths = {"fp32": tmp_path / "net.onnx", "data": tmp_path / "d.npz", "out": tmp_path / "q.onnx"}
    result = SimpleNamespace(ranges={"a": 1, "b": 2}, records=7, selection=selection, to_dict=lambda: {"r": 1})
    calls.replace(calibration, "compute_ranges", result)
    calls.replace(calibration, "quantize_with_ranges", paths["out"])
    calls.replace(auto, "check_against_minmax", warning)
    calls.replace(auto, "selection_line", lambda s: f"selected {s}")
    calls.replace(quantize, "opset_note", "")
    calls.replace(loading, "load_model", "MODEL")
    paths["result"] = result  # type: ignore[assignment]
    return paths


def test_calibrate_passes_every_option(calls: Calls, tmp_path: Path, capsys) -> None:
    from pytest_qaccuracy.analysis.calibration import CalibrationOptions

    p = _calibrate(calls, tmp_path, warning="worse than min/max")
    argv = [
        "calibrate", str(p["fp32"]), "--data", str(p["data"]), "--out", str(p["out"]), "--method", "percentile",
        "--power2", "--per-channel", "--format", "qoperator", "--activation-type", "int8", "--weight-type", "uint8",
        "--percentiles", "2,98.5", "--moving-average", "8,0.5", "--bins", "101", "--exclude-nodes", "a, b",
        "--exclude-nodes", "c", "--threads", "2", "--batch-size", "3", "--json", str(tmp_path / "r.json"),
    ]  # fmt: skip
    assert main(argv) == 0
    want = CalibrationOptions(
        method="percentile", activation_type="int8", weight_type="uint8", per_channel=True, power2=True,
        percentiles=(2.0, 98.5), moving_average=(8, 0.5), bins=101, quant_format="qoperator",
    )  # fmt: skip
    options = RuntimeOptions(providers=("CPUExecutionProvider",), threads=2, batch_size=3)
    exclude = ["a", "b", "c"]
    assert calls.one("compute_ranges") == ((p["fp32"], p["data"], want, options), {"nodes_to_exclude": exclude})
    assert calls.one("quantize_with_ranges") == ((p["fp32"], p["out"], p["result"], want, exclude), {})
    check = ((p["fp32"], p["out"], p["result"], p["data"], want, options, exclude), {})
    assert calls.one("check_against_minmax") == check
    assert calls.one("opset_note") == (("MODEL", want), {})
    out, err = capsys.readouterr()
    assert out == (
        f"calibrated 2 tensor(s) on 7 record(s) with percentile\nwrote {tmp_path / 'r.json'}\nwrote {p['out']}\n"
    )
    assert err == "warning: worse than min/max\n"
    assert json.loads((tmp_path / "r.json").read_text()) == {"r": 1}


def test_calibrate_checks_against_minmax_only_when_it_can_differ(calls: Calls, tmp_path: Path, capsys) -> None:
    p = _calibrate(calls, tmp_path)
    base = ["calibrate", str(p["fp32"]), "--data", str(p["data"]), "--out", str(p["out"])]
    assert main(base) == 0  # minmax: nothing to check against
    assert main([*base, "--method", "kl", "--no-check"]) == 0
    assert "check_against_minmax" not in calls.seen
    assert main([*base, "--method", "kl"]) == 0  # no warning: nothing on stderr
    assert len(calls.seen["check_against_minmax"]) == 1
    assert capsys.readouterr().err == ""


def test_calibrate_auto_prints_its_selection_and_a_note(calls: Calls, tmp_path: Path, capsys) -> None:
    import pytest_qaccuracy.analysis.calibration.quantize as quantize

    p = _calibrate(calls, tmp_path, selection="SEL")
    calls.replace(quantize, "opset_note", "note: opset 13")
    assert (
        main(["calibrate", str(p["fp32"]), "--data", str(p["data"]), "--out", str(p["out"]), "--method", "auto"]) == 0
    )
    assert calls.one("selection_line") == (("SEL",), {})
    assert "check_against_minmax" not in calls.seen
    assert capsys.readouterr().out.splitlines()[1:] == ["note: opset 13", "selected SEL", f"wrote {p['out']}"]


def test_calibrate_refusals(calls: Calls, tmp_path: Path, capsys) -> None:
    from pytest_qaccuracy.commands.calibrate import _pair

    assert _pair("1,2") == (1.0, 2.0) and _pair(" 3 , 4.5") == (3.0, 4.5)
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected two comma-separated numbers, got '1'$"):
        _pair("1")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected two numbers, got 'a,2'$"):
        _pair("a,2")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected two numbers, got '1,b'$"):
        _pair("1,b")
    p = _calibrate(calls, tmp_path)
    base = ["calibrate", str(p["fp32"]), "--data", str(p["data"]), "--out", str(p["out"])]
    assert main([*base, "--moving-average", "2.5,0.1"]) == 2
    assert capsys.readouterr().err == "error: --moving-average batch must be an integer, got 2.5\n"
    (tmp_path / "dir.json").mkdir()
    assert main([*base, "--json", str(tmp_path / "dir.json")]) == 2
    assert capsys.readouterr().err == f"error: --json {tmp_path / 'dir.json'}: is a directory, expected a file\n"
    assert "compute_ranges" not in calls.seen


def test_calibrate_write_failures_name_the_option(calls: Calls, tmp_path: Path, capsys, monkeypatch) -> None:
    import pytest_qaccuracy.analysis.calibration as calibration
    import pytest_qaccuracy.atomic as atomic

    p = _calibrate(calls, tmp_path)

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    base = ["calibrate", str(p["fp32"]), "--data", str(p["data"]), "--out", str(p["out"])]
    monkeypatch.setattr(atomic, "atomic_write_json", full)
    assert main([*base, "--json", str(tmp_path / "r.json")]) == 2
    reason = "could not be written (No space left on device); left as it was"
    assert capsys.readouterr().err == f"error: --json {tmp_path / 'r.json'}: {reason}\n"
    monkeypatch.setattr(calibration, "quantize_with_ranges", full)
    assert main(base) == 2
    assert capsys.readouterr().err == f"error: --out {p['out']}: {reason}\n"


# -- sensitivity --------------------------------------------------------------------------------


class _Session:
    closed = False

    def close(self) -> None:
        self.closed = True


def _sensitivity(calls: Calls, tmp_path: Path, suggestion: Any = "keep") -> dict[str, Any]:
    import pytest_qaccuracy.analysis.cumulative as cumulative
    import pytest_qaccuracy.analysis.sensitivity as sensitivity
    import pytest_qaccuracy.analysis.sweep as sweep
    import pytest_qaccuracy.model as model
    import pytest_qaccuracy.report.sensitivity_tables as tables

    session = _Session()
    calls.replace(model, "ModelPair", lambda fp32, quantized: SimpleNamespace(quantized_path=Path(quantized)))
    calls.replace(sensitivity, "open_session", session)
    calls.replace(sensitivity, "sensitivity_in", "RANKING")
    calls.replace(cumulative, "cumulative_in", "CURVES")
    calls.replace(sweep, "sweep_in", lambda *a: SimpleNamespace(target=a[3], suggestion=suggestion))
    calls.replace(tables, "sensitivity_table", lambda ranking, top=10: f"RANKED top={top}")
    calls.replace(tables, "sweep_table", "SWEPT")
    calls.replace(tables, "cumulative_table", "CUMULATIVE")
    calls.replace(tables, "write_sensitivity_artifacts", [tmp_path / "a.json"])
    return {"session": session, "argv": ["sensitivity", "f.onnx", "net.q.onnx", "--data", str(tmp_path / "d.npz")]}


def test_sensitivity_passes_every_option(calls: Calls, tmp_path: Path, capsys) -> None:
    from pytest_qaccuracy.analysis.sweep import Target

    s = _sensitivity(calls, tmp_path)
    argv = [
        *s["argv"], "--metrics", "mse", "--target", "cosine>=0.9", "--records", "1", "--sweep", "0", "--top", "4",
        "--threads", "3", "--batch-size", "5", "--capture", "deployed", "--strategy", "naive", "--allow-nonfinite",
        "--output", "a,b", "--mode", "leave-one-out", "--granularity", "weight", "--nodes", "n1, n2",
    ]  # fmt: skip
    assert main(argv) == 0
    options = RuntimeOptions(providers=("CPUExecutionProvider",), threads=3, batch_size=5)
    args, _ = calls.one("open_session")
    assert args[1:] == (tmp_path / "d.npz", ["mse", "cosine"], options, "deployed", "naive", True, 1, ("a", "b"))
    assert calls.one("sensitivity_in") == ((s["session"], "leave-one-out", "weight", ("n1", "n2")), {})
    assert calls.one("sweep_in") == ((s["session"], "RANKING", 0, Target.parse("cosine>=0.9")), {})
    assert s["session"].closed
    stem, out_dir, json_path = calls.one("write_sensitivity_artifacts")[0]
    assert (stem, out_dir, json_path) == ("net.q", None, None)
    written = calls.one("write_sensitivity_artifacts")[1]
    assert set(written) == {"sensitivity", "sweep"} and written["sensitivity"] == "RANKING"
    assert written["sweep"].suggestion == "keep"
    assert capsys.readouterr().out == f"RANKED top=4\n\nSWEPT\nwrote {tmp_path / 'a.json'}\n"


def test_sensitivity_defaults_and_a_missed_target(calls: Calls, tmp_path: Path, capsys) -> None:
    s = _sensitivity(calls, tmp_path, suggestion=None)
    assert main(s["argv"]) == 0
    args, _ = calls.one("open_session")
    assert args[2:] == (["cosine"], RuntimeOptions(), "reference", "reuse", False, None, None)
    assert calls.one("sensitivity_in")[0][1:] == ("single", "node", None)
    assert "sweep_in" not in calls.seen  # neither --sweep nor --target
    assert capsys.readouterr().out == f"RANKED top=10\nwrote {tmp_path / 'a.json'}\n"
    assert main([*s["argv"], "--target", "cosine>=0.9", "--metrics", "cosine,mse"]) == 1  # no suggestion reaches it
    assert calls.seen["open_session"][1][0][2] == ["cosine", "mse"]  # the target's metric is there already


def test_sensitivity_cumulative(calls: Calls, tmp_path: Path, capsys) -> None:
    from pytest_qaccuracy.analysis.cumulative import DEFAULT_CONFIGS, parse_configs

    s = _sensitivity(calls, tmp_path)
    assert main([*s["argv"], "--mode", "cumulative"]) == 0
    assert calls.one("cumulative_in") == ((s["session"], list(DEFAULT_CONFIGS), False), {})
    assert capsys.readouterr().out == f"CUMULATIVE\nwrote {tmp_path / 'a.json'}\n"
    argv = [*s["argv"], "--mode", "cumulative", "--quantize-nodes", "a,b", "--exclude-nodes", "c", "--average-mode"]
    assert main(argv) == 0
    assert calls.seen["cumulative_in"][1][0][1:] == (parse_configs([("a", "b")], [("c",)]), True)
    assert calls.seen["write_sensitivity_artifacts"][1][1] == {"cumulative": "CURVES"}


NOT_CUMULATIVE = "--sweep and --target apply to --mode single or leave-one-out, not cumulative"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--records", "0"], "--records must be >= 1, got 0"),
        (["--sweep", "-1"], "--sweep must be >= 0, got -1"),
        (["--mode", "cumulative", "--sweep", "2"], NOT_CUMULATIVE),
        (["--mode", "cumulative", "--target", "cosine>=0.9"], NOT_CUMULATIVE),
        (["--quantize-nodes", "a"], "--quantize-nodes, --exclude-nodes and --average-mode apply to --mode cumulative"),
        (["--exclude-nodes", "a"], "--quantize-nodes, --exclude-nodes and --average-mode apply to --mode cumulative"),
        (["--average-mode"], "--quantize-nodes, --exclude-nodes and --average-mode apply to --mode cumulative"),
    ],
)  # fmt: skip
def test_sensitivity_refusals(calls: Calls, tmp_path: Path, capsys, extra: list[str], message: str) -> None:
    s = _sensitivity(calls, tmp_path)
    assert main([*s["argv"], *extra]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert "open_session" not in calls.seen


def test_sensitivity_output_targets_are_checked_first(calls: Calls, tmp_path: Path, capsys) -> None:
    s = _sensitivity(calls, tmp_path)
    (tmp_path / "j").mkdir()
    assert main([*s["argv"], "--json", str(tmp_path / "j")]) == 2
    assert capsys.readouterr().err == f"error: --json {tmp_path / 'j'}: is a directory, expected a file\n"
    (tmp_path / "f").write_text("")
    assert main([*s["argv"], "--out-dir", str(tmp_path / "f")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out-dir {tmp_path / 'f'}: ")
    assert "open_session" not in calls.seen
