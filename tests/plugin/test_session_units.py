"""Unit tests of the session state (``plugin/session.py``), in-process: the header line, the caches of
pairs, comparisons, output statistics, agreements, saturation reports and task values (each measured
once, with the arguments its spec gives), what a check records and how it fails, drift against a
baseline written by hand, the records a worker sends and the controller merges, pytest's outcomes,
and the artifacts written at the end.

Real comparisons run the example suite's digits models (``example_suites/``), and their figures are
checked against onnxruntime run here with numpy; the caches and arguments are checked with stand-ins
for ``compare`` and ``measure_outputs``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import pytest_qaccuracy.analysis.compare as compare_module
import pytest_qaccuracy.analysis.outputs as outputs_module
from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.errors import CheckError, InputError
from pytest_qaccuracy.plugin.pairs import PairSpec
from pytest_qaccuracy.plugin.records import Outcome, PairRecord, RecordedCheck, TargetRun
from pytest_qaccuracy.plugin.session import CheckResult, QAccuracySession, _drift_op, _other_task_value
from pytest_qaccuracy.tolerances import Rule, Tolerance
from tests.plugin.settings_stand_in import plugin_settings

SUITE = Path(__file__).resolve().parents[2] / "example_suites"
FP32 = SUITE / "models" / "digits_cnn.onnx"
QDQ = SUITE / "models" / "digits_cnn.qdq.onnx"
BROKEN = SUITE / "models" / "digits_cnn.broken.onnx"
DATA = SUITE / "data" / "digits_test.npz"


def _passed_outcome():
    """A passed model tolerance, as the records carry one."""
    return Outcome(
        kind="tolerance",
        check="c",
        scope="model",
        subject="s",
        metric="m",
        op=">=",
        threshold=1.0,
        value=2.0,
        passed=True,
        source="x",
        detail="",
    )


settings = plugin_settings


def session(root: Path = SUITE, worker: bool = False, **changes: Any) -> QAccuracySession:
    return QAccuracySession(settings(**changes), root, worker)


def digits(quantized: Path = QDQ, pair_id: str = "d", **fields: Any) -> PairSpec:
    return PairSpec(id=pair_id, fp32=FP32, quantized=quantized, data=DATA, **fields)


def tol(**values: float) -> dict[str, Tolerance]:
    return {name: Tolerance(name, value, f"test {name}") for name, value in values.items()}


def ort_logits(model: Path) -> np.ndarray:
    x = np.load(DATA)["x"]
    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def labels() -> np.ndarray:
    return np.load(DATA)["labels"]


# --- small parts --------------------------------------------------------------------------------


def test_check_result_passes_without_a_message() -> None:
    assert CheckResult("p", [], None, []).passed
    assert not CheckResult("p", [], "failed", []).passed


def test_header_lists_the_set_tolerances_by_name_with_rules_and_artifacts(tmp_path: Path) -> None:
    shown = {
        "min_sqnr": Tolerance("min_sqnr", 20.0, "ini"),
        "min_cosine": Tolerance("min_cosine", 0.995, "ini"),
        "max_mse": Tolerance("max_mse", None, "a view's"),  # only a view's: not the pair's own
    }
    rules = (Rule("*", "relu*", "sqnr", ">=", 15.0, "relu* sqnr>=15", "ini"),) * 2
    s = session(tolerances=shown, rules=rules, artifacts_dir=tmp_path / "out")
    assert s.header() == f"qaccuracy: min_cosine=0.995, min_sqnr=20; rules: 2; artifacts: {tmp_path / 'out'}"
    assert session().header() == "qaccuracy: ; rules: 0; artifacts: off"


def test_model_pair_is_made_once_per_spec_with_its_mapping() -> None:
    s = session()
    spec = digits()
    pair = s.model_pair(spec)
    assert s.model_pair(spec) is pair
    assert s.model_pair(digits(pair_id="other")) is not pair
    assert (pair.fp32_path, pair.quantized_path) == (FP32, QDQ)


def test_model_pair_passes_the_spec_mapping_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_qaccuracy.model as model

    made = []
    monkeypatch.setattr(model, "ModelPair", lambda *args: made.append(args) or args)
    s = session()
    s.model_pair(digits())
    s.model_pair(digits(mapping=(("a", "b"),)))
    assert made == [(FP32, QDQ, None), (FP32, QDQ, {"a": "b"})]


def test_runtime_options_name_a_missing_provider_and_where_it_was_set() -> None:
    providers = ("CPUExecutionProvider", "CPUExecutionProvider")  # as given, even twice
    options = session(providers=providers, batch_size=7).runtime_options()
    assert (options.providers, options.batch_size) == (providers, 7)
    available = ", ".join(ort.get_available_providers())
    s = session(providers=("CPUExecutionProvider", "NoSuchProvider", "Other"))
    with pytest.raises(InputError) as caught:
        s.runtime_options()
    assert str(caught.value) == f"qaccuracy_providers: NoSuchProvider, Other not available (available: {available})"
    s = session(providers=("NoSuchProvider",), origins={"providers": "--qaccuracy-providers"})
    with pytest.raises(InputError, match=r"^--qaccuracy-providers: NoSuchProvider not available"):
        s.runtime_options()


def test_metric_names_are_the_configured_ones_then_what_checks_need_once_each() -> None:
    from pytest_qaccuracy.metrics import available_metrics

    rule = Rule("*", None, "max_abs", "<=", 1.0, "* max_abs<=1", "ini")
    s = session(metrics=("mse", "cosine"))
    names = s.metric_names(digits(metrics=("tae", "mse")), [rule])
    assert names == ("mse", "cosine", "sqnr", "lsb", "tae", "max_abs")
    assert s.metric_names(digits()) == ("mse", "cosine", "sqnr", "lsb")
    every = session().metric_names(digits())
    assert set(every) == set(available_metrics()) and len(every) == len(set(every))


def test_stats_key_reads_topk_rtol_and_atol() -> None:
    spec = digits()
    key = QAccuracySession._stats_key
    assert key(spec, {}) == ((spec, 1, None, None), [1], None, None)
    assert key(spec, tol(topk=5, rtol=0.1, atol=0.02)) == ((spec, 5, 0.1, 0.02), [1, 5], 0.1, 0.02)
    assert key(spec, tol(topk=1)) == ((spec, 1, None, None), [1], None, None)
    assert key(spec, {"topk": Tolerance("topk", None, "view")})[0] == (spec, 1, None, None)


def test_labels_are_read_from_the_spec_file_only(tmp_path: Path) -> None:
    path = tmp_path / "labels.npy"
    np.save(path, np.array([3, 1, 2]))
    assert QAccuracySession._labels(digits()) is None
    assert QAccuracySession._labels(digits(labels=path)).tolist() == [3, 1, 2]


def test_drift_op_is_the_bound_the_allowed_value_sets() -> None:
    assert _drift_op(SimpleNamespace(allowed=19.0, baseline=20.0)) == ">="
    assert _drift_op(SimpleNamespace(allowed=20.0, baseline=20.0)) == ">="
    assert _drift_op(SimpleNamespace(allowed=0.2, baseline=0.1)) == "<="


def test_other_task_value_skips_only_declared_names_of_no_metric() -> None:
    known = {"sqnr": True, "cer": False}
    assert _other_task_value("wer:+0.01", known, {"wer"})
    assert not _other_task_value("wer:+0.01", known, set())  # no pair computes it: misspelt
    assert not _other_task_value("cer:+0.01", known, {"cer"})  # this pair's own
    assert not _other_task_value("mse:+0.01", {}, {"mse"})  # a registered metric
    assert not _other_task_value("not a rule", {}, {"not"})


# --- comparisons against onnxruntime ------------------------------------------------------------


def test_check_measures_the_pair_as_onnxruntime_runs_it() -> None:
    fp32, int8, truth = ort_logits(FP32), ort_logits(QDQ), labels()
    fp32_top1, int8_top1 = (fp32.argmax(1) == truth).mean(), (int8.argmax(1) == truth).mean()
    agreement = (fp32.argmax(1) == int8.argmax(1)).mean()
    s = session()
    spec = digits()
    done = s.check(spec, tol(max_top1_drop=0.5, min_top1_agreement=0.5), (), "t.py::a")
    assert done.passed and done.pair_id == "d"
    by_check = {o.check: o for o in done.outcomes}
    drop, agree = by_check["max_top1_drop"], by_check["min_top1_agreement"]
    assert drop.value == pytest.approx(fp32_top1 - int8_top1)
    assert agree.value == pytest.approx(agreement)
    record = s.records[spec.key(SUITE)]
    counts = record.topk["logits"]["k"]["1"]
    assert counts["fp32_accuracy"] == pytest.approx(fp32_top1)
    assert counts["quantized_accuracy"] == pytest.approx(int8_top1)
    assert record.comparison["records"] == 300
    assert (record.fp32, record.quantized, record.data, record.labels) == (str(FP32), str(QDQ), str(DATA), None)
    assert record.backend == "onnxruntime" and record.id == "d" and record.key == spec.key(SUITE)
    assert record.stem == spec.stem(SUITE)
    assert [(c.test, c.index, c.outcome, c.xfail) for c in record.checks] == [
        ("t.py::a", 0, done.outcomes[0], None),
        ("t.py::a", 1, done.outcomes[1], None),
    ]
    assert ("qaccuracy.pair", "d") in done.properties and ("qaccuracy.passed", "true") in done.properties


def test_a_failed_check_says_which_pair_and_where_its_artifacts_are(tmp_path: Path) -> None:
    fp32, int8 = ort_logits(FP32), ort_logits(BROKEN)
    agreement = (fp32.argmax(1) == int8.argmax(1)).mean()
    assert agreement < 0.99  # the broken model's top-1 moves on some records
    s = session(artifacts_dir=tmp_path / "qa")
    spec = digits(BROKEN, "broken")
    done = s.check(spec, tol(min_top1_agreement=0.99), (), "t.py::b", xfail="known")
    assert not done.passed
    first = f"top-1 agreement {agreement:.6g} < 0.99 for output 'logits' (pair 'broken')"
    assert done.message.splitlines()[:2] == [first, "Tolerance from: test min_top1_agreement"]
    stem = spec.stem(SUITE)
    assert done.message.splitlines()[-1] == f"Artifacts: {tmp_path / 'qa' / 'pairs' / (stem + '.comparison.json')}"
    assert done.outcomes[0].value == pytest.approx(agreement)
    assert ("qaccuracy.passed", "false") in done.properties
    assert s.records[spec.key(SUITE)].checks[0].xfail == "known"
    # without an artifacts folder the message names none
    plain = session().check(spec, tol(min_top1_agreement=0.99), (), "t.py::b")
    assert "Artifacts:" not in plain.message


def test_one_pass_serves_the_comparison_and_the_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"compare": 0, "measure": 0}
    real_compare, real_measure = compare_module.compare, outputs_module.measure_outputs

    def counted_compare(*args: Any, **kwargs: Any) -> Any:
        calls["compare"] += 1
        return real_compare(*args, **kwargs)

    def counted_measure(*args: Any, **kwargs: Any) -> Any:
        calls["measure"] += 1
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(compare_module, "compare", counted_compare)
    monkeypatch.setattr(outputs_module, "measure_outputs", counted_measure)
    s = session()
    spec = digits()
    result, stats = s.compared(spec, (), tol(topk=1))
    assert calls == {"compare": 1, "measure": 0}
    assert s.compared(spec, (), tol(topk=1)) == (result, stats)
    assert s.comparison(spec) is result and s.output_stats(spec, tol(topk=1)) is stats
    assert calls == {"compare": 1, "measure": 0}
    # another k: statistics of their own, the comparison kept
    s.output_stats(spec, tol(topk=5))
    assert calls == {"compare": 1, "measure": 1}
    assert s.compared(spec, (), tol(topk=5))[0] is result
    assert calls == {"compare": 1, "measure": 1}
    assert s.check_seconds(spec) > 0.0
    assert s.check_seconds(digits(pair_id="same files")) == s.check_seconds(spec)
    assert s.check_seconds(digits(BROKEN)) == 0.0


class Stub:
    """Stand-ins for ``compare`` and ``measure_outputs`` that write down their arguments."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: Exception | None = None) -> None:
        self.compares: list[tuple[tuple, dict]] = []
        self.measures: list[tuple[tuple, dict]] = []
        self.fail = fail
        monkeypatch.setattr(compare_module, "compare", self.compare)
        monkeypatch.setattr(outputs_module, "measure_outputs", self.measure)

    def compare(self, *args: Any, **kwargs: Any) -> ComparisonResult:
        self.compares.append((args, kwargs))
        if kwargs.get("measure") is not None:
            kwargs["measure"].result = lambda: "stats from the pass"
        if self.fail is not None:
            raise self.fail
        return ComparisonResult("a.onnx", "b.onnx", "d.npz", 3, {}, [], [])

    def measure(self, *args: Any, **kwargs: Any) -> Any:
        self.measures.append((args, kwargs))
        return outputs_module.OutputStats(topk={}, relative={}, task={"v": kwargs.get("tasks")})


def test_compare_gets_the_spec_backend_scheme_slices_and_options(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = Stub(monkeypatch)
    s = session(batch_size=5, metrics=("mse",))
    spec = digits(backend="integer", scheme="tflite", slices=("a view",))
    s.comparison(spec, [Rule("*", None, "tae", "<=", 1.0, "* tae<=1", "ini")])
    ((args, kwargs),) = stub.compares
    assert args[0] is s.model_pair(spec) and args[1] == DATA
    assert args[2] == list(s.metric_names(spec, [Rule("*", None, "tae", "<=", 1.0, "", "")]))
    assert args[3].batch_size == 5
    assert kwargs == {
        "backend": "integer",
        "scheme": "tflite",
        "slices": ("a view",),
        "measure": None,
        "agreement": None,
        "reference": None,
    }
    s.comparison(spec, [Rule("*", None, "tae", "<=", 1.0, "* tae<=1", "ini")])
    assert len(stub.compares) == 1  # cached by spec and metric names
    s.comparison(spec)
    assert len(stub.compares) == 2


def test_the_pass_measures_statistics_with_labels_rtol_atol_scores_and_slices(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stub = Stub(monkeypatch)
    path = tmp_path / "labels.npy"
    np.save(path, np.arange(4))
    spec = digits(labels=path, scores="logits:1", slices=("v",))
    s = session()
    made = []

    class Measure:
        def __init__(self, *args: Any) -> None:
            made.append(args)

    monkeypatch.setattr(outputs_module, "OutputMeasure", Measure)
    result, stats = s.compared(spec, (), tol(topk=3, rtol=0.5, atol=0.25))
    ((ks, got_labels, rtol, atol, scores, slices),) = made
    assert (ks, rtol, atol, scores, slices) == ([1, 3], 0.5, 0.25, "logits:1", ("v",))
    assert got_labels.tolist() == [0, 1, 2, 3]
    assert stats == "stats from the pass" and result.records == 3
    assert stub.measures == []


def test_output_stats_alone_pass_every_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = Stub(monkeypatch)
    s = session(batch_size=9)
    spec = digits(backend="integer", scheme="tflite", scores="logits", slices=("v",))
    first = s.output_stats(spec, tol(topk=2, rtol=0.1, atol=0.2))
    assert s.output_stats(spec, tol(topk=2, rtol=0.1, atol=0.2)) is first
    ((args, kwargs),) = stub.measures
    pair, data, ks, got_labels, rtol, atol, options, backend, scheme, scores, slices = args
    assert (pair, data, ks, got_labels, rtol, atol) == (s.model_pair(spec), DATA, [1, 2], None, 0.1, 0.2)
    assert (options.batch_size, backend, scheme, scores, slices) == (9, "integer", "tflite", "logits", ("v",))
    assert kwargs == {}


def test_a_check_error_in_the_pass_keeps_the_comparison(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = Stub(monkeypatch)
    s = session()
    spec = digits()

    def failing() -> Any:
        raise CheckError("no scores")

    real = stub.compare

    def compare(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        kwargs["measure"].result = failing
        return result

    monkeypatch.setattr(compare_module, "compare", compare)
    stats_calls = []
    monkeypatch.setattr(
        outputs_module, "measure_outputs", lambda *a, **k: stats_calls.append(a) or SimpleNamespace(task={})
    )
    s.compared(spec, (), tol(topk=1))
    assert len(stub.compares) == 1 and len(stats_calls) == 1  # the statistics measured on their own
    assert s.comparison(spec).records == 3


def test_sensitivity_keeps_the_fp32_outputs_of_the_comparison(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = Stub(monkeypatch)
    s = session(sensitivity="failed", sensitivity_records=7)
    spec = digits()
    s.compared(spec, (), tol(topk=1))
    reference = stub.compares[0][1]["reference"]
    assert reference is not None and s.reference(spec) is reference
    assert reference.records == 7 and reference.names == ("logits",)
    # the same fp32 model and data: no second cache
    s.compared(digits(pair_id="again"), (), tol(topk=1))
    assert stub.compares[1][1]["reference"] is None
    # sensitivity off: none at all
    off = session()
    off.compared(spec, (), tol(topk=1))
    assert stub.compares[2][1]["reference"] is None and off.reference(spec) is None
    # analyse releases what was kept
    released = []
    reference.release = lambda: released.append(True)
    monkeypatch.setattr("pytest_qaccuracy.plugin.session.analyse_records", lambda *a: None)
    s.analyse()
    assert released == [True] and s.reference(spec) is None


def test_a_failed_pass_releases_its_fp32_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = Stub(monkeypatch, fail=CheckError("broken"))
    s = session(sensitivity="failed", sensitivity_records=0)
    spec = digits()
    import pytest_qaccuracy.analysis.reference_cache as cache

    released = []
    monkeypatch.setattr(cache.ReferenceCache, "release", lambda self: released.append(self))
    with pytest.raises(CheckError):
        s.compared(spec, (), tol(topk=1))
    assert len(released) == 1 and released[0] is stub.compares[0][1]["reference"]
    assert released[0].records is None  # 0 records: the setting's "no limit"
    assert s.reference(spec) is None


def test_analyse_hands_every_pair_by_key_and_releases_even_when_it_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    Stub(monkeypatch)
    s = session(sensitivity="failed")
    a, b = digits(), digits(pair_id="b")
    s.compared(a, (), tol(topk=1))
    s.model_pair(b)
    seen = []

    def analyse(session: Any, pairs: dict) -> None:
        seen.append((session, pairs))
        raise RuntimeError("analysis failed")

    monkeypatch.setattr("pytest_qaccuracy.plugin.session.analyse_records", analyse)
    released = []
    s.reference(a).release = lambda: released.append(True)
    with pytest.raises(RuntimeError):
        s.analyse()
    assert seen == [(s, {a.key(SUITE): a, b.key(SUITE): b})]
    assert released == [True] and s.reference(a) is None


# --- the agreement gate, saturation, task values -----------------------------------------------


def test_the_gate_is_measured_in_the_pass_once(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = Stub(monkeypatch)
    import pytest_qaccuracy.analysis.agreement_pass as agreement_pass
    import pytest_qaccuracy.backend.agreement as agreement

    checkers = []
    monkeypatch.setattr(agreement, "AgreementChecker", lambda *a, **k: checkers.append((a, k)) or "checker")

    class Pass:
        def __init__(self, checker: Any) -> None:
            self.checker = checker

        def result(self) -> Any:
            return SimpleNamespace(with_max_steps=lambda steps: ("measured", steps))

    monkeypatch.setattr(agreement_pass, "AgreementPass", Pass)
    monkeypatch.setattr(QAccuracySession, "_read_floats", lambda self, spec: [f"f1 of {spec.id}"])
    dataset_runs = []
    monkeypatch.setattr(agreement, "dataset_agreement", lambda *a, **k: dataset_runs.append((a, k)))
    s = session()
    spec = digits(backend="integer", scheme="tflite")
    s.compared(spec, (), tol(topk=1), gate=True)
    assert checkers == [((QDQ,), {"scheme": "tflite", "tensors": ["f1 of d"]})]
    assert stub.compares[0][1]["agreement"].checker == "checker"
    assert s.agreement(spec, 3) == ("measured", 3)
    assert dataset_runs == []
    # measured already: a second pass of another pair on the same files adds no gate
    s.compared(digits(pair_id="x", backend="integer", scheme="tflite"), (), tol(topk=1), gate=True)
    assert stub.compares[1][1]["agreement"] is None


def test_the_gate_measures_itself_when_the_pair_was_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_qaccuracy.backend.agreement as agreement

    Stub(monkeypatch)
    runs = []

    def dataset_agreement(*args: Any, **kwargs: Any) -> Any:
        runs.append((args, kwargs))
        return SimpleNamespace(with_max_steps=lambda steps: steps * 10)

    monkeypatch.setattr(agreement, "dataset_agreement", dataset_agreement)
    monkeypatch.setattr(QAccuracySession, "_read_floats", lambda self, spec: [f"t of {spec.id}"])
    s = session(batch_size=11)
    spec = digits(scheme="tflite")
    assert s.agreement(spec, 2) == 20
    assert s.agreement(spec, 4) == 40
    assert runs == [((QDQ, DATA), {"scheme": "tflite", "batch_size": 11, "tensors": ["t of d"]})]
    # a gate already measured: the pass needs none
    assert s._agreement_pass(spec) is None


def test_read_floats_are_the_quantized_tensors_without_parameters() -> None:
    s = session()
    spec = digits()
    matches = s.model_pair(spec).matching.matches
    expected = [m.capture for m in matches if m.params is None]
    assert s._read_floats(spec) == expected
    assert len(expected) < len(matches)


def test_saturation_is_measured_once_per_model_data_and_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_qaccuracy.analysis.saturation as saturation

    runs = []
    monkeypatch.setattr(saturation, "measure_saturation", lambda *a, **k: runs.append((a, k)) or len(runs))
    s = session(batch_size=13)
    spec = digits()
    assert s.saturation(spec, "onnxruntime-avx2") == 1
    assert s.saturation(digits(pair_id="same files"), "onnxruntime-avx2") == 1
    assert s.saturation(spec, "onnxruntime-vnni") == 2
    assert runs[0] == ((QDQ, DATA), {"batch_size": 13, "preset": "onnxruntime-avx2"})
    assert runs[1][1]["preset"] == "onnxruntime-vnni"


def test_task_values_are_measured_once_for_every_target(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = Stub(monkeypatch)
    s = session(batch_size=3)
    assert s.task_values(digits()) == {}
    declared = []
    monkeypatch.setattr(QAccuracySession, "declare_task_metrics", lambda self, specs: declared.append(specs))
    spec = digits(task_metrics=("m",), backend="integer", scheme="tflite")
    assert s.task_values(spec) == {"v": ("m",)}
    assert s.task_values(replace_targets(spec, ("onnxruntime-avx2",))) == {"v": ("m",)}
    ((args, kwargs),) = stub.measures
    assert args == (s.model_pair(spec), DATA)
    assert kwargs["options"].batch_size == 3
    assert {k: v for k, v in kwargs.items() if k != "options"} == {
        "backend": "integer",
        "scheme": "tflite",
        "tasks": ("m",),
        "targets": None,
        "keep_task_errors": True,
    }
    assert declared == [("m",), ("m",)]


def replace_targets(spec: PairSpec, targets: tuple[str, ...]) -> PairSpec:
    from dataclasses import replace

    return replace(spec, targets=targets)


def test_output_stats_carry_the_pair_task_values(monkeypatch: pytest.MonkeyPatch) -> None:
    Stub(monkeypatch)
    s = session()
    monkeypatch.setattr(QAccuracySession, "declare_task_metrics", lambda self, specs: None)
    stats = s.output_stats(digits(task_metrics=("m",)), tol(topk=1))
    assert stats.task == {"v": ("m",)}
    plain = s.output_stats(digits(), tol(topk=1))
    assert plain.task == {"v": None}  # the stand-in's own: no task values added


def test_task_inputs_read_the_targets_file_against_the_records(tmp_path: Path) -> None:
    spec = digits(task_metrics=("m",))
    assert session().task_inputs(spec) == (("m",), None)
    path = tmp_path / "targets.jsonl"
    path.write_text("".join(json.dumps({"record": i, "target": str(i)}) + "\n" for i in range(300)))
    metrics, targets = session().task_inputs(replace_task_targets(spec, path))
    assert metrics == ("m",) and len(targets) == 300
    path.write_text(json.dumps({"record": 0, "target": "x"}) + "\n")
    with pytest.raises(Exception, match="300"):
        session().task_inputs(replace_task_targets(spec, path))


def replace_task_targets(spec: PairSpec, path: Path) -> PairSpec:
    from dataclasses import replace

    return replace(spec, task_targets=path)


def test_declared_task_values_skip_unusable_metrics() -> None:
    class Metric:
        def __init__(self, names: tuple[str, ...] | None) -> None:
            self.names = names

        def create(self) -> Any:
            if self.names is None:
                raise ValueError("cannot make it")
            return self.names

        def value_names(self, made: Any) -> Any:
            return made

    s = session()
    s.declare_task_metrics([Metric(("cer",)), Metric(None), Metric(("wer", "ser"))])
    s.declare_task_metrics(None)
    assert s.task_values_declared == {"cer", "wer", "ser"}


def test_settings_task_values_are_the_ini_metrics_names() -> None:
    s = session(task_metrics=("ctc", "no.such:module", "binary_f1"))
    assert s.settings_task_values() == ["cer", "exact_match", "f1"]
    assert session().settings_task_values() == []


# --- how a check fails --------------------------------------------------------------------------


def test_an_unexpected_error_becomes_one_line_naming_the_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    cause = ZeroDivisionError("first line\nsecond line")
    Stub(monkeypatch, fail=cause)
    s = session()
    spec = digits(pair_id="z")
    with pytest.raises(CheckError) as caught:
        s.check(spec, tol(min_cosine=0.9), (), "t.py::e", xfail="why")
    assert str(caught.value) == "pair 'z': ZeroDivisionError: first line"
    assert caught.value.__cause__ is cause
    record = s.records[spec.key(SUITE)]
    (check,) = record.checks
    assert (check.test, check.index, check.xfail) == ("t.py::e", 0, "why")
    o = check.outcome
    assert (o.kind, o.check, o.scope, o.subject, o.metric, o.op) == ("error", "error", "model", "pair 'z'", "error", "")
    assert (o.threshold, o.value, o.passed, o.source) == (None, None, False, "exception")
    assert o.detail == "pair 'z': ZeroDivisionError: first line"
    assert record.comparison["records"] == 0
    assert (record.comparison["fp32_model"], record.comparison["quantized_model"]) == (FP32.name, QDQ.name)
    assert record.comparison["data"] == DATA.name


def test_a_check_error_keeps_its_text_and_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    inner = ValueError("inner")
    error = CheckError("output 'logits': not finite")
    error.__cause__ = inner
    Stub(monkeypatch, fail=error)
    with pytest.raises(CheckError) as caught:
        session().check(digits(), tol(min_cosine=0.9), (), "t.py::e")
    assert str(caught.value) == "pair 'd': output 'logits': not finite"
    assert caught.value.__cause__ is inner


def test_an_empty_error_text_still_names_the_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    Stub(monkeypatch, fail=CheckError("  "))
    with pytest.raises(CheckError) as caught:
        session().check(digits(), tol(min_cosine=0.9), (), "t.py::e")
    assert str(caught.value) == "pair 'd': "


def test_usage_errors_pass_through_unrecorded(monkeypatch: pytest.MonkeyPatch) -> None:
    Stub(monkeypatch, fail=InputError("bad option"))
    s = session()
    with pytest.raises(InputError, match=r"^bad option$"):
        s.check(digits(), tol(min_cosine=0.9), (), "t.py::e")
    assert s.records == {}


def test_an_error_after_a_comparison_records_that_comparison(monkeypatch: pytest.MonkeyPatch) -> None:
    Stub(monkeypatch)
    s = session()
    spec = digits()
    s.comparison(spec)
    s._record_error(spec, "pair 'd': boom", "t.py::e", None)
    assert s.records[spec.key(SUITE)].comparison["records"] == 3  # the stand-in's, not an empty one


# --- records, workers, pytest's outcomes ----------------------------------------------------------


def record(key: str, *checks: tuple[str, int], **fields: Any) -> PairRecord:
    outcome = Outcome(
        kind="tolerance",
        check="min_cosine",
        scope="output",
        subject="output 'y'",
        metric="cosine",
        op=">=",
        threshold=0.9,
        value=0.95,
        passed=True,
        source="ini",
        detail="ok",
    )
    base = {
        "id": key,
        "key": key,
        "stem": key,
        "fp32": "a",
        "quantized": "b",
        "data": "d",
        "backend": "onnxruntime",
        "scheme": "s",
        "comparison": {},
    }
    made = PairRecord(**{**base, **fields})
    return made.with_checks([RecordedCheck(test=t, index=i, outcome=outcome) for t, i in checks])


def test_merge_adds_a_worker_records_and_its_new_checks_only() -> None:
    s = session()
    s.records["k"] = record("k", ("a", 0), topk={"y": 1, "z": 2}, task={"cer": 1}, agreement=None)
    theirs = {
        "k": record("k", ("a", 0), ("b", 0), topk={"z": 3}, task={"wer": 2}, agreement={"steps": 1}),
        "new": record("new", ("c", 0)),
    }
    s.merge({"records": {k: v.to_dict() for k, v in theirs.items()}})
    merged = s.records["k"]
    assert [(c.test, c.index) for c in merged.checks] == [("a", 0), ("b", 0)]
    assert merged.topk == {"y": 1, "z": 3} and merged.task == {"cer": 1, "wer": 2}
    assert merged.agreement == {"steps": 1}
    assert s.records["new"] == theirs["new"]
    assert s.workers_without_data == 0
    mine_kept = session()
    mine_kept.records["k"] = record("k", agreement={"steps": 5})
    mine_kept.merge({"records": {"k": record("k", agreement={"steps": 1}).to_dict()}})
    assert mine_kept.records["k"].agreement == {"steps": 5}


def test_merge_keeps_targets_and_sensitivity_of_both() -> None:
    from pytest_qaccuracy.plugin.records import SensitivityEntry

    run = TargetRun(backend="integer", scheme="x", outputs={}, topk={}, passed=True)
    entry = SensitivityEntry(mode="single", metric="sqnr")
    s = session()
    s.records["k"] = record("k", targets={"a": run})
    s.merge({"records": {"k": record("k", targets={"b": run}, sensitivity=entry).to_dict()}})
    assert set(s.records["k"].targets) == {"a", "b"}
    assert s.records["k"].sensitivity == entry


def test_a_worker_without_a_payload_is_counted() -> None:
    s = session()
    assert (s.worker, s.usage_error, s.baselines, s.status, s.errors, s.written) == (False, None, None, None, [], [])
    assert session(worker=True).worker is True
    s.merge(None)
    s.merge({})
    assert s.workers_without_data == 2 and s.records == {}


def test_payload_is_the_records_as_builtins() -> None:
    s = session(worker=True)
    s.records["k"] = record("k", ("a", 0))
    wire = s.payload("t.py::x")
    assert wire["interrupted"] == "t.py::x"
    back = session()
    back.merge(wire)
    assert back.records == s.records
    assert session().payload()["interrupted"] is None


def test_record_report_keeps_a_failure() -> None:
    s = session()
    s.record_report("passed", "t::a", None)
    s.record_report("failed", "t::a", None)
    s.record_report("passed", "t::a", None)
    from pytest_qaccuracy.outcomes import XPASS_STRICT

    s.record_report(XPASS_STRICT, "t::b", "r")
    s.record_report("passed", "t::b", None)
    s.record_report("xfailed", "t::c", "why")
    s.record_report("passed", "t::c", None)
    assert s.test_outcomes == {"t::a": ("failed", None), "t::b": (XPASS_STRICT, "r"), "t::c": ("passed", None)}


def test_sorted_records_order_pairs_and_checks_and_apply_pytest_outcomes() -> None:
    s = session()
    s.records["k2"] = record("k2", ("t::b", 1), ("t::a", 0), id="a")
    s.records["k1"] = record("k1", ("t::c", 0), id="a")
    s.records["k0"] = record("k0", ("t::d", 0), id="b")
    s.record_report("xfailed", "t::b", "known")
    records = s.sorted_records()
    assert [r.key for r in records] == ["k1", "k2", "k0"]
    assert [(c.test, c.index) for c in records[1].checks] == [("t::a", 0), ("t::b", 1)]
    assert records[1].checks[1].xfail == "known" and records[1].tests == {"t::b": "xfailed"}
    assert s.documents() == [r.to_dict() for r in records]


def test_record_merges_what_each_check_measured() -> None:
    s = session()
    spec = digits()
    result = ComparisonResult("a", "b", "d", 3, {}, [], [], scheme="tflite")
    stats = SimpleNamespace(topk={"y": 1}, task={})
    o = _passed_outcome()
    run = TargetRun(backend="integer", scheme="t", outputs={}, topk={}, passed=True)
    s._record(spec, result, stats, [o, o], "t::a", None, None, {"t": run})
    s._record(spec, result, SimpleNamespace(topk={"z": 2}, task={}), [o], "t::b", "x")
    s._record(spec, result, None, [o], "t::c", None)
    r = s.records[spec.key(SUITE)]
    assert r.scheme == "tflite" and r.topk == {"y": 1, "z": 2} and r.targets == {"t": run}
    assert [(c.test, c.index, c.xfail) for c in r.checks] == [
        ("t::a", 0, None),
        ("t::a", 1, None),
        ("t::b", 0, "x"),
        ("t::c", 0, None),
    ]
    other = session()
    other._record(digits(labels=DATA), ComparisonResult("a", "b", "d", 3, {}, [], []), None, [o], "t", None)
    (made,) = other.records.values()
    assert made.scheme == "onnxruntime" and made.labels == str(DATA)


# --- the end of a session -----------------------------------------------------------------------


def test_finish_without_records_writes_nothing(tmp_path: Path) -> None:
    s = session(artifacts_dir=tmp_path / "qa")
    assert s.finish() is True
    assert not (tmp_path / "qa").exists() and s.written == []


def test_finish_publishes_artifacts_and_a_report(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import pytest_qaccuracy.plugin.artifacts as artifacts

    calls = []
    monkeypatch.setattr(artifacts, "publish_artifacts", lambda *a: calls.append(("publish", a)) or [Path("p")])
    monkeypatch.setattr(artifacts, "write_report", lambda *a, **k: calls.append(("report", a, k)) or Path("r"))
    s = session(tmp_path, artifacts_dir=tmp_path / "qa", report=tmp_path / "r.html")
    s.records["k"] = record("k", ("t::a", 0))
    s.status = "complete"
    assert s.finish() is True
    documents = [s.records["k"].to_dict()]
    assert calls == [("publish", (tmp_path / "qa", documents, tmp_path, tmp_path / "r.html", "complete"))]
    assert s.written == [Path("p")] and s.baselines is None
    calls.clear()
    alone = session(tmp_path, artifacts_dir=None, report=tmp_path / "r.html")
    alone.records["k"] = record("k", ("t::a", 0))
    assert alone.finish() is True
    assert calls == [("report", (tmp_path / "r.html", documents), {"status": None})]
    assert alone.written == [Path("r")]
    calls.clear()
    none = session(tmp_path)
    none.records["k"] = record("k", ("t::a", 0))
    assert none.finish() is True and calls == [] and none.written == []


def test_finish_writes_baselines_first_and_reports_a_failed_write(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import pytest_qaccuracy.plugin.artifacts as artifacts
    import pytest_qaccuracy.plugin.baselines as baselines

    order = []
    monkeypatch.setattr(
        baselines, "finish_baselines", lambda *a: order.append(("baselines", a)) or ("status", [Path("b")])
    )

    def publish(*args: Any) -> Any:
        order.append("publish")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(artifacts, "publish_artifacts", publish)
    s = session(tmp_path, artifacts_dir=tmp_path / "qa")
    s.records["k"] = record("k", ("t::a", 0))
    assert s.finish("incomplete") is False
    assert order[0][0] == "baselines" and order[1] == "publish"
    assert order[0][1][1:] == ([s.records["k"]], tmp_path, "incomplete")
    assert s.baselines == "status" and s.written == [Path("b")]
    assert s.errors == ["could not write qaccuracy artifacts: OSError: [Errno 28] No space left on device"]


# --- drift against a baseline ---------------------------------------------------------------------


def baseline_file(folder: Path, spec: PairSpec, document: dict[str, Any], root: Path = SUITE) -> Path:
    from pytest_qaccuracy.plugin.baselines import baseline_path

    path = baseline_path(folder, spec, root)
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema_version": 1, "pair": spec.id, **document}))
    return path


def comparison(sqnr: float, cosine: float = 0.99) -> ComparisonResult:
    from pytest_qaccuracy.analysis.results import OutputResult

    out = OutputResult("logits", {"sqnr": sqnr, "cosine": cosine})
    return ComparisonResult("a", "b", "d", 300, {}, [out], [], higher_is_better={"sqnr": True, "cosine": True})


def test_drift_beyond_the_rule_fails_with_its_bound(tmp_path: Path) -> None:
    spec = digits()
    folder = tmp_path / "baselines"
    path = baseline_file(folder, spec, {"outputs": {"logits": {"sqnr": 30.0}}, "layers": {"gone": {"sqnr": 1.0}}})
    s = session(baseline_dir=folder, max_drift=("sqnr:-1.5",))
    rows, notes = s.drift(spec, comparison(28.0), folder)
    (row,) = rows
    assert (row.kind, row.check, row.scope, row.subject, row.metric, row.op) == (
        "drift",
        "drift",
        "output",
        "output 'logits'",
        "sqnr",
        ">=",
    )
    assert (row.threshold, row.value, row.passed, row.output) == (28.5, 28.0, False, "logits")
    from pytest_qaccuracy.plugin.baselines import shown

    assert row.source == f"baseline {shown(path, SUITE)}"
    assert row.detail == "drift: output 'logits': sqnr 30 -> 28 (limit 28.5, sqnr:-1.5)"
    assert notes == [
        "Not in this run (in the baseline): layer 'gone'",
        "To accept these numbers as the new baseline: --qaccuracy-update-all-baselines",
    ]


def test_no_drift_is_one_passing_row_naming_the_rules(tmp_path: Path) -> None:
    spec = digits()
    folder = tmp_path / "b"
    baseline_file(folder, spec, {"outputs": {"logits": {"sqnr": 30.0, "cosine": 0.99}}})
    s = session(baseline_dir=folder, max_drift=("sqnr:-1.0", "cosine:-0.01"), baseline_required=True)
    rows, notes = s.drift(spec, comparison(29.5, 0.985), folder)
    (row,) = rows
    assert (row.subject, row.metric, row.op, row.passed, row.scope, row.output) == (
        "baseline",
        "drift",
        "drift",
        True,
        "model",
        None,
    )
    assert (row.threshold, row.value) == (None, None)
    assert row.detail == "no drift beyond sqnr:-1.0, cosine:-0.01"
    assert row.source == "--qaccuracy-baseline"
    assert notes == []


def test_the_default_drift_rule_is_sqnr_one_db(tmp_path: Path) -> None:
    spec = digits()
    folder = tmp_path / "b"
    baseline_file(folder, spec, {"outputs": {"logits": {"sqnr": 30.0}}})
    s = session(baseline_dir=folder)
    assert s.drift(spec, comparison(29.2), folder)[0][0].detail == "no drift beyond sqnr:-1.0"
    assert not s.drift(spec, comparison(28.9), folder)[0][0].passed


def test_improvements_pass_unless_strict_and_are_noted(tmp_path: Path) -> None:
    spec = digits()
    folder = tmp_path / "b"
    outputs = {f"o{i}": {"sqnr": 20.0} for i in range(5)}
    baseline_file(folder, spec, {"outputs": outputs})
    from pytest_qaccuracy.analysis.results import OutputResult

    result = ComparisonResult(
        "a",
        "b",
        "d",
        1,
        {},
        [OutputResult(f"o{i}", {"sqnr": 25.0}) for i in range(5)],
        [],
        higher_is_better={"sqnr": True},
    )
    rows, notes = session(baseline_dir=folder).drift(spec, result, folder)
    assert rows[0].detail == "no drift beyond sqnr:-1.0" and rows[0].passed
    better = rows[1:]
    assert [r.subject for r in better] == [f"output 'o{i}'" for i in range(5)]
    assert all(r.passed and r.op == "improved" and r.threshold == 21.0 and r.value == 25.0 for r in better)
    assert [(r.metric, r.scope, r.output) for r in better] == [("sqnr", "output", f"o{i}") for i in range(5)]
    assert better[0].detail == "improved: output 'o0': sqnr 20 -> 25 (better than 21, sqnr:-1.0)"
    shown = "; ".join(f"output 'o{i}': sqnr 20 -> 25 (better than 21, sqnr:-1.0)" for i in range(3))
    assert notes == [f"Better than the baseline: {shown} and 2 more"]
    strict_rows, strict_notes = session(baseline_dir=folder, fail_on_improvement=True).drift(spec, result, folder)
    assert not any(r.passed for r in strict_rows[1:])
    assert strict_notes[-1] == "To accept these numbers as the new baseline: --qaccuracy-update-all-baselines"
    # three improvements: no "more"
    few = ComparisonResult("a", "b", "d", 1, {}, result.outputs[:3], [], higher_is_better={"sqnr": True})
    assert session(baseline_dir=folder).drift(spec, few, folder)[1][1] == f"Better than the baseline: {shown}"


def test_a_missing_baseline_fails_only_when_required(tmp_path: Path) -> None:
    spec = digits()
    folder = tmp_path / "b"
    folder.mkdir()
    assert session(baseline_dir=folder).drift(spec, comparison(1.0), folder) == ([], [])
    required = session(baseline_dir=folder, baseline_required=True, save_baseline_dir=folder)
    assert required.drift(spec, comparison(1.0), folder) == ([], [])  # this session writes it
    (row,), notes = session(baseline_dir=folder, baseline_required=True).drift(spec, comparison(1.0), folder)
    assert notes == []
    assert (row.subject, row.metric, row.op, row.passed, row.source) == (
        "baseline",
        "baseline",
        "",
        False,
        "--qaccuracy-baseline",
    )
    assert row.detail == f"no baseline for pair 'd' in {folder} (write one with --qaccuracy-update-baselines)"


def test_an_unreadable_baseline_is_one_failing_row(tmp_path: Path) -> None:
    spec = digits()
    folder = tmp_path / "b"
    path = baseline_file(folder, spec, {})
    path.write_text("{not json")
    (row,), notes = session(baseline_dir=folder).drift(spec, comparison(1.0), folder)
    assert notes == [] and not row.passed and (row.subject, row.metric) == ("baseline", "baseline")
    assert row.detail.startswith(f"unreadable baseline: {path}: not valid JSON")


def test_a_bad_drift_rule_names_the_known_metrics(tmp_path: Path) -> None:
    spec = digits()
    folder = tmp_path / "b"
    baseline_file(folder, spec, {"outputs": {"logits": {"sqnr": 30.0}}})
    s = session(baseline_dir=folder, max_drift=("sqrn:-1",))
    s.task_values_declared.add("wer")
    (row,), notes = s.drift(spec, comparison(30.0), folder)
    assert notes == []
    assert row.detail == "drift rule 'sqrn:-1': unknown metric 'sqrn' (known: cosine, sqnr, wer)"
    assert (row.subject, row.metric, row.passed) == ("baseline", "drift rule", False)


def test_a_rule_on_another_pair_task_value_is_skipped(tmp_path: Path) -> None:
    spec = digits()
    folder = tmp_path / "b"
    baseline_file(folder, spec, {"outputs": {"logits": {"sqnr": 30.0}}})
    s = session(baseline_dir=folder, max_drift=("sqnr:-1", "cer:+0.01"))
    s.task_values_declared.add("cer")
    (row,), _ = s.drift(spec, comparison(30.0), folder)
    assert row.detail == "no drift beyond sqnr:-1"
    # declared through the ini's task metrics too
    ini = session(baseline_dir=folder, max_drift=("sqnr:-1", "f1:-0.01"), task_metrics=("binary_f1",))
    assert ini.drift(spec, comparison(30.0), folder)[0][0].detail == "no drift beyond sqnr:-1"


def test_drift_of_a_task_value_reads_the_statistics(tmp_path: Path) -> None:
    spec = digits()
    folder = tmp_path / "b"
    baseline_file(
        folder, spec, {"outputs": {"logits": {"sqnr": 30.0}}, "task": {"cer": 0.1}, "higher_is_better": {"cer": False}}
    )
    value = SimpleNamespace(to_dict=lambda: {"quantized": 0.2, "higher_is_better": False})
    stats = SimpleNamespace(task={"cer": value})
    s = session(baseline_dir=folder, max_drift=("cer:+0.05",))
    (row,), _ = s.drift(spec, comparison(30.0), folder, stats)
    assert (row.subject, row.scope, row.op, row.passed) == ("task 'cer'", "task", "<=", False)
    assert row.threshold == pytest.approx(0.15) and row.value == 0.2 and row.output is None


def sha256_12(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def test_changed_files_are_noted(tmp_path: Path) -> None:
    spec = digits()
    folder = tmp_path / "b"
    sha = {"fp32_model": "0" * 64}
    baseline_file(folder, spec, {"outputs": {"logits": {"sqnr": 30.0}}, "produced_by": {"sha256": sha}})
    _, notes = session(baseline_dir=folder).drift(spec, comparison(30.0), folder)
    assert notes == [f"fp32 model changed since the baseline (sha256 000000000000 -> {sha256_12(FP32)})"]


def test_a_check_compares_with_the_baseline_folder_when_drift_is_on(tmp_path: Path) -> None:
    spec = digits()
    folder = tmp_path / "b"
    baseline_file(folder, spec, {"outputs": {"logits": {"sqnr": 1000.0}}})
    s = session(baseline_dir=folder)
    done = s.check(spec, tol(min_cosine=0.9), (), "t::a")
    assert not done.passed and [o.check for o in done.outcomes] == ["min_cosine", "drift"]
    assert "To accept these numbers as the new baseline" in done.message
    again = s.check(spec, tol(min_cosine=0.9), (), "t::b", drift=False)
    assert again.passed and [o.check for o in again.outcomes] == ["min_cosine"]


# --- deployment targets, saturation and the agreement gate (the w8 pair, as the example suite) ------

W8 = SUITE / "models" / "digits_cnn.qdq_w8.onnx"
#: The w8 pair's output SQNR on onnxruntime's two x86 kernel families, as the example suite documents
#: them (qaccuracy_digits.toml): u8 x s8 pair sums saturate without VNNI
DOCUMENTED_SQNR = {"onnxruntime-vnni": 37.1, "onnxruntime-avx2": 23.4}


def sqnr_db(fp32: np.ndarray, quantized: np.ndarray) -> float:
    f, q = fp32.astype(np.float64), quantized.astype(np.float64)
    return float(10 * np.log10((f**2).sum() / ((f - q) ** 2).sum()))


def test_a_pair_checked_on_its_targets_with_saturation_and_the_gate(tmp_path: Path) -> None:
    from pytest_qaccuracy.backend.host import host_preset
    from pytest_qaccuracy.tolerances import GATE, SATURATION

    own = host_preset()
    targets = ("onnxruntime-avx2", "onnxruntime-vnni")
    if own not in targets:
        pytest.skip(f"this host's onnxruntime preset is {own}")
    other = next(t for t in targets if t != own)
    fp32, int8 = ort_logits(FP32), ort_logits(W8)
    measured = sqnr_db(fp32, int8)  # onnxruntime on this host: the pair's own run
    assert measured == pytest.approx(DOCUMENTED_SQNR[own], abs=0.05)
    spec = digits(W8, "w8", targets=targets)
    folder = tmp_path / "baselines"
    baseline_file(folder, spec, {"outputs": {"logits": {"sqnr": measured}}, "layers": {"gone": {"sqnr": 1.0}}})
    s = session(baseline_dir=folder)
    tolerances = {
        "min_sqnr": Tolerance("min_sqnr", 30.0, "t sqnr"),
        SATURATION: Tolerance(SATURATION, 0.0, "t saturation"),
        GATE: Tolerance(GATE, 2, "t gate"),
    }
    done = s.check(spec, tolerances, (), "t::w8")
    rows = [(o.check, o.deployment, o.passed) for o in done.outcomes]
    saturating = "onnxruntime-avx2"
    assert rows == [
        ("min_sqnr", None, DOCUMENTED_SQNR[own] >= 30),
        ("drift", None, True),
        ("min_sqnr", other, DOCUMENTED_SQNR[other] >= 30),
        (SATURATION, None, False),  # the avx2 target's pair sums saturate
        (GATE, None, True),
    ]
    by = {(o.check, o.deployment): o for o in done.outcomes}
    assert by[("min_sqnr", None)].value == pytest.approx(measured, abs=1e-6)
    assert by[("min_sqnr", other)].value == pytest.approx(DOCUMENTED_SQNR[other], abs=0.05)
    assert by[(SATURATION, None)].value > 0 and by[(SATURATION, None)].source == "t saturation"
    gate = by[(GATE, None)]
    assert (gate.threshold, gate.source, gate.value) == (2, "t gate", 0)
    # the message: the first failed check, with the worst records of the run it failed on
    lines = done.message.splitlines()
    assert lines[0].startswith(f"sqnr {DOCUMENTED_SQNR['onnxruntime-avx2']}")
    assert lines[0].endswith(f"< 30 dB for output 'logits' on {saturating} (pair 'w8')")
    per_record = 10 * np.log10((fp32.astype(np.float64) ** 2).sum(1) / ((fp32 - int8).astype(np.float64) ** 2).sum(1))
    worst = [float(line.split(": ")[1]) for line in lines[lines.index("Worst records (sqnr):") + 1 :][:5]]
    assert len(worst) == 5 and max(worst) < per_record.min()  # the avx2 run's records, not the own run's
    assert "Not in this run (in the baseline): layer 'gone'" in lines  # drift's note kept
    assert f"Layers whose pair sums saturate on {saturating}:" in lines  # saturation's notes
    assert lines.index("Not in this run (in the baseline): layer 'gone'") < lines.index(
        f"Layers whose pair sums saturate on {saturating}:"
    )
    # the record: both targets' runs, the gate's measurement
    record = s.records[spec.key(SUITE)]
    assert set(record.targets) == set(targets)
    assert record.targets[own].backend == "onnxruntime" and record.targets[other].backend == "integer"
    assert record.targets[own].scheme == own and record.targets[other].scheme == other
    assert record.targets[own].outputs["logits"]["sqnr"] == pytest.approx(measured, abs=1e-6)
    assert record.targets[other].outputs["logits"]["sqnr"] == pytest.approx(DOCUMENTED_SQNR[other], abs=0.05)
    assert (record.targets[own].passed, record.targets[other].passed) == (True, False)
    top1 = (fp32.argmax(1) == labels()).mean()
    assert record.targets[own].topk["logits"]["k"]["1"]["fp32_accuracy"] == pytest.approx(top1)
    assert record.targets[own].task == {}
    assert record.agreement["records"] == 300 and record.agreement["scheme"] == own
    props = dict(done.properties)
    assert props["qaccuracy.backend"] == "onnxruntime" and props["qaccuracy.scheme"] == own
    assert props[f"qaccuracy.target.{other}.passed"] == "false"
    assert props["qaccuracy.agreement.max_steps"] == "0"
    # the gate's steps: a tolerance of no value allows none
    again = s.check(spec, {GATE: Tolerance(GATE, None, "t none")}, (), "t::gate")
    assert again.outcomes[-1].threshold == 0


def test_the_gate_in_the_measured_tolerances_is_measured_in_the_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_qaccuracy.tolerances import GATE

    s = session()
    spec = digits(W8, "w8")
    s.check(spec, tol(min_sqnr=10.0), (), "t::a", measure={**tol(min_sqnr=10.0), **tol(**{GATE: 0})})
    assert s._agreement_key(spec) in s._agreements
    plain = session()
    plain.check(spec, tol(min_sqnr=10.0), (), "t::a", measure=tol(min_sqnr=10.0, topk=5))
    assert plain._agreements == {}
    assert next(iter(plain._stats))[1] == 5  # the statistics measured for the measured tolerances' k


# --- aimed at the first mutation run's survivors --------------------------------------------------


def test_the_pass_without_a_gate_and_with_the_rules_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = Stub(monkeypatch)
    s = session(metrics=("mse",))
    rule = Rule("*", None, "tae", "<=", 1.0, "* tae<=1", "ini")
    s.compared(digits(), [rule], tol(topk=1))
    ((args, kwargs),) = stub.compares
    assert kwargs["agreement"] is None and "tae" in args[2]
    assert stub.measures == []


def test_a_known_comparison_is_not_measured_again_for_new_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = Stub(monkeypatch)
    s = session()
    spec = digits()
    first = s.comparison(spec)
    result, _ = s.compared(spec, (), tol(topk=3))
    assert result is first and len(stub.compares) == 1 and len(stub.measures) == 1


def test_task_values_of_two_pairs_are_measured_apart_with_their_targets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stub = Stub(monkeypatch)
    monkeypatch.setattr(QAccuracySession, "declare_task_metrics", lambda self, specs: None)
    path = tmp_path / "targets.jsonl"
    path.write_text("".join(json.dumps({"record": i, "target": i % 3}) + "\n" for i in range(300)))
    s = session()
    assert s.task_values(digits(task_metrics=("m",))) == {"v": ("m",)}
    assert s.task_values(digits(BROKEN, task_metrics=("n",), task_targets=path)) == {"v": ("n",)}
    assert len(stub.measures) == 2
    assert stub.measures[0][1]["targets"] is None
    assert stub.measures[1][1]["targets"] == [i % 3 for i in range(300)]


def test_fp32_outputs_of_two_datasets_share_one_budget(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import shutil

    stub = Stub(monkeypatch)
    other = tmp_path / "other.npz"
    shutil.copy(DATA, other)
    s = session(sensitivity="failed")
    s.compared(digits(), (), tol(topk=1))
    s.compared(PairSpec(id="o", fp32=FP32, quantized=QDQ, data=other), (), tol(topk=1))
    a, b = (call[1]["reference"] for call in stub.compares)
    assert a is not None and b is not None and a is not b
    assert a.budget is b.budget


def test_check_seconds_add_up_the_comparisons_of_a_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_qaccuracy.plugin.session as session_module

    Stub(monkeypatch)
    clock = iter([10.0, 12.5, 20.0, 21.0])
    monkeypatch.setattr(session_module.time, "monotonic", lambda: next(clock))
    s = session()
    spec = digits()
    s.comparison(spec)
    s._compare(spec, ("mse",))
    assert s.check_seconds(spec) == 3.5


def test_labels_holding_objects_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "labels.npy"
    np.save(path, np.array([1, "a"], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle"):
        QAccuracySession._labels(digits(labels=path))


def test_output_stats_read_the_pair_labels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stub = Stub(monkeypatch)
    path = tmp_path / "labels.npy"
    np.save(path, np.array([4, 2]))
    session().output_stats(digits(labels=path), tol(topk=1))
    assert stub.measures[0][0][3].tolist() == [4, 2]


def test_check_measures_for_the_measured_tolerances(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = Stub(monkeypatch)
    made = []

    class Measure:
        def __init__(self, *args: Any) -> None:
            made.append(args)

    monkeypatch.setattr(outputs_module, "OutputMeasure", Measure)
    monkeypatch.setattr(
        compare_module, "compare", lambda *a, **k: stub.compare(*a, **k) if k.get("measure") is None else fail(k)
    )

    def fail(kwargs: dict) -> Any:
        raise CheckError("measured")

    with pytest.raises(CheckError):
        session().check(digits(), tol(min_cosine=0.9), (), "t::a", measure=tol(min_cosine=0.9, topk=5))
    assert made[0][0] == [1, 5]


def test_drift_rows_of_improved_task_values_and_many_missing_targets(tmp_path: Path) -> None:
    spec = digits()
    folder = tmp_path / "b"
    layers = {f"l{i:02}": {"sqnr": 1.0} for i in range(12)}
    baseline_file(
        folder,
        spec,
        {
            "outputs": {"logits": {"sqnr": 30.0}},
            "layers": layers,
            "task": {"cer": 0.3},
            "higher_is_better": {"cer": False},
        },
    )
    value = SimpleNamespace(to_dict=lambda: {"quantized": 0.1, "higher_is_better": False})
    s = session(baseline_dir=folder, max_drift=("sqnr:-1", "cer:+0.05"))
    rows, notes = s.drift(spec, comparison(30.0), folder, SimpleNamespace(task={"cer": value}))
    assert [(r.subject, r.op, r.passed) for r in rows] == [
        ("baseline", "drift", True),
        ("task 'cer'", "improved", True),
    ]
    assert rows[1].scope == "task" and rows[1].threshold == pytest.approx(0.25)
    listed = ", ".join(f"layer 'l{i:02}'" for i in range(10))
    assert notes[0] == f"Not in this run (in the baseline): {listed}"


def test_four_improvements_list_three_and_one_more(tmp_path: Path) -> None:
    from pytest_qaccuracy.analysis.results import OutputResult

    spec = digits()
    folder = tmp_path / "b"
    baseline_file(folder, spec, {"outputs": {f"o{i}": {"sqnr": 20.0} for i in range(4)}})
    outputs = [OutputResult(f"o{i}", {"sqnr": 25.0}) for i in range(4)]
    result = ComparisonResult("a", "b", "d", 1, {}, outputs, [], higher_is_better={"sqnr": True})
    _, notes = session(baseline_dir=folder).drift(spec, result, folder)
    assert notes[0].endswith(" and 1 more")


def test_unreadable_baselines_and_bad_rules_have_no_bound(tmp_path: Path) -> None:
    spec = digits()
    folder = tmp_path / "b"
    path = baseline_file(folder, spec, {"outputs": {"logits": {"sqnr": 30.0}}})
    (row,), _ = session(baseline_dir=folder, max_drift=("sqrn:-1",)).drift(spec, comparison(30.0), folder)
    assert row.op == ""
    path.write_text("[]")
    (row,), _ = session(baseline_dir=folder).drift(spec, comparison(30.0), folder)
    assert row.op == "" and row.detail.startswith("unreadable baseline:")


def test_record_keeps_task_values_and_the_agreement() -> None:

    s = session()
    spec = digits()
    result = ComparisonResult("a", "b", "d", 3, {}, [], [])
    o = _passed_outcome()
    cer = SimpleNamespace(to_dict=lambda: {"quantized": 0.1})
    agreement = SimpleNamespace(
        to_dict=lambda: {"records": 3, "max_steps_allowed": 4, "first_divergence": "t", "max_steps": 0}
    )
    s._record(spec, result, SimpleNamespace(topk={}, task={"cer": cer}), [o], "t::a", None, agreement)
    s._record(spec, result, SimpleNamespace(topk={}, task={}), [o], "t::b", None)
    r = s.records[spec.key(SUITE)]
    assert r.task == {"cer": {"quantized": 0.1}}
    assert r.agreement == {"records": 3, "max_steps": 0}


def test_merge_after_a_new_record_and_keeps_my_analysis() -> None:
    from pytest_qaccuracy.plugin.records import SensitivityEntry

    mine = SensitivityEntry(mode="single", metric="cosine")
    s = session()
    s.records["k"] = record("k", ("a", 0), sensitivity=mine)
    s.merge({"records": {"new": record("new").to_dict(), "k": record("k", ("b", 0)).to_dict()}})
    assert [(c.test, c.index) for c in s.records["k"].checks] == [("a", 0), ("b", 0)]
    assert s.records["k"].sensitivity == mine and "new" in s.records


def test_finish_adds_to_what_was_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import pytest_qaccuracy.plugin.artifacts as artifacts
    import pytest_qaccuracy.plugin.baselines as baselines

    monkeypatch.setattr(baselines, "finish_baselines", lambda *a: (None, [Path("b")]))
    monkeypatch.setattr(artifacts, "publish_artifacts", lambda *a: [Path("p")])
    reports = []
    monkeypatch.setattr(artifacts, "write_report", lambda *a, **k: reports.append(k) or Path("r"))
    s = session(tmp_path, artifacts_dir=tmp_path / "qa")
    s.records["k"] = record("k", ("t::a", 0))
    s.written = [Path("earlier")]
    assert s.finish()
    assert s.written == [Path("earlier"), Path("b"), Path("p")]
    alone = session(tmp_path, report=tmp_path / "r.html")
    alone.records["k"] = record("k", ("t::a", 0))
    alone.status = "incomplete"
    alone.finish()
    assert reports == [{"status": "incomplete"}]


def w8_on(*targets: str, **fields: Any) -> PairSpec:
    from pytest_qaccuracy.backend.host import host_preset

    if host_preset() in targets:
        pytest.skip("needs targets other than this host's own preset")
    return digits(W8, fields.pop("pair_id", "w8t"), targets=targets, **fields)


def worst_class_recall(logits: np.ndarray) -> float:
    truth, answer = labels(), logits.argmax(1)
    return float(min((answer[truth == d] == d).mean() for d in range(10)))


def test_task_values_rules_and_drift_on_two_targets(tmp_path: Path) -> None:
    from pytest_qaccuracy.metrics.task import TaskSpec

    task = TaskSpec("digits_metrics:WorstClassRecall", folder=str(SUITE))  # the example suite's own metric
    spec = w8_on("onnxruntime-avx2", "tflite", task_metrics=(task,))
    fp32, int8 = ort_logits(FP32), ort_logits(W8)
    folder = tmp_path / "b"
    document = {"outputs": {"logits": {"sqnr": 37.0}}, "task": {"worst_class_recall": 1.0}}
    baseline_file(folder, spec, {**document, "higher_is_better": {"worst_class_recall": True}})
    s = session(baseline_dir=folder, max_drift=("sqnr:-1", "worst_class_recall:-0.01"))
    rule = Rule("w8t", None, "sqnr", ">=", 10.0, "w8t sqnr>=10", "ini")  # an output rule of this pair only
    tolerances = {
        "min_sqnr": Tolerance("min_sqnr", 20.0, "t"),
        "min:worst_class_recall": Tolerance("min:worst_class_recall", 0.5, "t"),
    }
    done = s.check(spec, tolerances, (rule,), "t::task")
    own_rows = ["min_sqnr", "min:worst_class_recall", "w8t sqnr>=10"]
    assert [(o.check, o.deployment) for o in done.outcomes] == [
        *((c, None) for c in own_rows),
        ("drift", None),
        *((c, "onnxruntime-avx2") for c in own_rows),
        *((c, "tflite") for c in own_rows),
    ]
    by = {(o.check, o.deployment): o for o in done.outcomes}
    assert by[("min:worst_class_recall", None)].value == pytest.approx(worst_class_recall(int8))
    assert by[("w8t sqnr>=10", None)].value == pytest.approx(sqnr_db(fp32, int8), abs=1e-6)
    assert by[("min_sqnr", "onnxruntime-avx2")].value == pytest.approx(DOCUMENTED_SQNR["onnxruntime-avx2"], abs=0.05)
    drift = by[("drift", None)]
    assert (drift.subject, drift.passed, drift.value) == (
        "task 'worst_class_recall'",
        False,
        pytest.approx(worst_class_recall(int8)),
    )
    record = s.records[spec.key(SUITE)]
    for target in ("onnxruntime-avx2", "tflite"):
        value = record.targets[target].task["worst_class_recall"]
        assert value["fp32"] == pytest.approx(worst_class_recall(fp32)) and value["records"] == 300
    assert record.task["worst_class_recall"]["quantized"] == pytest.approx(worst_class_recall(int8))
    agreement = (fp32.argmax(1) == int8.argmax(1)).mean()
    assert dict(done.properties)["qaccuracy.logits.top1_agreement"] == f"{agreement:.6g}"


def test_targets_are_measured_for_the_measured_tolerances() -> None:
    s = session()
    spec = w8_on("onnxruntime-avx2")
    s.check(spec, tol(min_sqnr=20.0), (), "t::m", measure=tol(min_sqnr=20.0, topk=5))
    assert set(s.records[spec.key(SUITE)].targets["onnxruntime-avx2"].topk["logits"]["k"]) == {"1", "5"}


def test_a_target_top1_check_reads_that_target_statistics() -> None:
    s = session()
    spec = w8_on("onnxruntime-avx2")
    done = s.check(spec, tol(min_top1_agreement=0.5), (), "t::k")
    assert [(o.check, o.deployment) for o in done.outcomes] == [
        ("min_top1_agreement", None),
        ("min_top1_agreement", "onnxruntime-avx2"),
    ]


def test_a_saturation_failure_alone_shows_its_notes_without_worst_records() -> None:
    from pytest_qaccuracy.tolerances import SATURATION

    s = session()
    spec = w8_on("onnxruntime-avx2")
    done = s.check(spec, {**tol(min_sqnr=20.0), SATURATION: Tolerance(SATURATION, 0.0, "t")}, (), "t::s")
    assert [(o.check, o.passed) for o in done.outcomes] == [
        ("min_sqnr", True),
        ("min_sqnr", True),
        (SATURATION, False),
    ]
    lines = done.message.splitlines()
    assert lines[0].startswith("saturated pair sums ") and " > 0% on onnxruntime-avx2: " in lines[0]
    assert lines[0].endswith(" (pair 'w8t')")
    assert "Layers whose pair sums saturate on onnxruntime-avx2:" in lines
    assert not any(line.startswith(("Worst records", "Worst layers")) for line in lines)


def test_an_element_check_shows_the_worst_elements_of_the_run() -> None:
    fp32, int8 = ort_logits(FP32), ort_logits(BROKEN)
    difference = np.abs(fp32.astype(np.float64) - int8)
    largest = difference[difference > 0.5].max()
    done = session().check(digits(BROKEN, "broken"), tol(rtol=0.0, atol=0.5), (), "t::e")
    (line,) = [x for x in done.message.splitlines() if x.startswith("Max absolute difference among violations: ")]
    assert float(line.rsplit(": ", 1)[1]) == pytest.approx(largest, rel=1e-5)
    assert "Worst elements:" in done.message.splitlines()


RAISING = """
class Broken:
    higher_is_better = {"broken_value": True}

    def __init__(self):
        self.state = {}

    def update(self, fp32, quantized, targets):
        raise RuntimeError("cannot score these outputs")

    def merge(self, other):
        pass

    def compute(self):
        return {"broken_value": 0.0}
"""


def test_a_task_metric_that_raises_fails_a_whole_check_only(tmp_path: Path) -> None:
    import uuid

    from pytest_qaccuracy.metrics.task import TaskSpec

    module = f"broken_metric_{uuid.uuid4().hex}"  # new each run: never already imported
    (tmp_path / f"{module}.py").write_text(RAISING)
    spec = w8_on("onnxruntime-avx2", task_metrics=(TaskSpec(f"{module}:Broken", folder=str(tmp_path)),))
    s = session()
    whole = s.check(spec, tol(min_sqnr=20.0), (), "t::whole")
    rows = [(o.check, o.deployment, o.passed) for o in whole.outcomes]
    assert rows == [
        ("min_sqnr", None, True),
        ("task_metrics", None, False),
        ("min_sqnr", "onnxruntime-avx2", True),
        ("task_metrics", "onnxruntime-avx2", False),
    ]
    assert "cannot score these outputs" in whole.outcomes[1].detail
    item = s.check(spec, tol(min_sqnr=20.0), (), "t::item", measure=tol(min_sqnr=20.0))
    assert [(o.check, o.deployment) for o in item.outcomes] == [("min_sqnr", None), ("min_sqnr", "onnxruntime-avx2")]


def test_a_view_is_checked_on_the_pair_and_on_its_targets() -> None:
    from pytest_qaccuracy.analysis.slices import SliceSpec

    view = SliceSpec("first3", "logits[:, 0:3]", (("min_sqnr", 10.0),))
    spec = w8_on("onnxruntime-avx2", slices=(view,))
    fp32, int8 = ort_logits(FP32), ort_logits(W8)
    done = session().check(spec, tol(min_sqnr=20.0), (), "t::view")
    assert [(o.subject, o.deployment) for o in done.outcomes] == [
        ("output 'logits'", None),
        ("output 'first3'", None),
        ("output 'logits'", "onnxruntime-avx2"),
        ("output 'first3'", "onnxruntime-avx2"),
    ]
    assert done.outcomes[1].value == pytest.approx(sqnr_db(fp32[:, 0:3], int8[:, 0:3]), abs=1e-6)
    assert done.outcomes[1].threshold == 10.0
    assert done.outcomes[3].threshold == 10.0  # the view's own tolerance on the target too
