"""Unit tests of declarative suites (``plugin/suite.py``): parsing and validating ``qaccuracy_*.toml`` files
in-process, each refusal's one line, ids claimed across suites, header lines, and the items a pair
becomes (collected in-process by pytester, no check run)."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_qaccuracy.plugin.fixtures import usage_key
from pytest_qaccuracy.plugin.suite import (
    DEFAULT_KEYS,
    PAIR_KEYS,
    USAGE_OUTPUT,
    PairConfig,
    SuiteError,
    SuiteUsageError,
    _check_table,
    _claim_ids,
    _shown,
    _strings,
    is_suite,
    load_suite,
    pair_lines,
    raise_usage_errors,
)
from pytest_qaccuracy.tolerances import Rule, Tolerance

HEAD = """
[defaults]
fp32 = "m.onnx"
data = "d.npz"
"""


def _suite(folder: Path, body: str, name: str = "qaccuracy_a.toml") -> Path:
    for file in ("m.onnx", "q.onnx", "r.onnx", "d.npz", "labels.npy", "t.jsonl"):
        (folder / file).touch()
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def _error(path: Path, **kwargs: Any) -> str:
    with pytest.raises(SuiteError) as info:
        load_suite(path, **kwargs)
    return str(info.value)


# --- small helpers -------------------------------------------------------------------------------


def test_is_suite() -> None:
    assert is_suite(Path("x/qaccuracy_models.toml")) and is_suite(Path("qaccuracy_.toml"))
    assert not is_suite(Path("qaccuracy.toml")) and not is_suite(Path("QACCURACY_a.toml"))
    assert not is_suite(Path("my_qaccuracy_a.toml")) and not is_suite(Path("qaccuracy_a.toml.bak"))


def test_check_table_and_strings() -> None:
    assert _check_table("w", {"a": 1}, ("a", "b")) == {"a": 1}
    with pytest.raises(SuiteError, match=r"^w: expected a table, got list$"):
        _check_table("w", [1], ("a",))
    with pytest.raises(SuiteError, match=r"^w: unknown key 'c' \(known: a, b\)$"):
        _check_table("w", {"a": 1, "c": 2}, ("a", "b"))
    assert _strings("w", ["a", "b"]) == ["a", "b"] and _strings("w", []) == []
    for bad in ("a", ["a", 1], None):
        with pytest.raises(SuiteError, match=r"^w: expected a list of strings$"):
            _strings("w", bad)


def test_shown(tmp_path: Path) -> None:
    assert _shown(tmp_path / "s" / "qaccuracy_a.toml", tmp_path) == "s/qaccuracy_a.toml"
    assert _shown(tmp_path.parent / "x.toml", tmp_path) == str(tmp_path.parent / "x.toml")


def test_pair_lines() -> None:
    text = "\n".join(
        [
            "[defaults]",  # 0
            "[pairs.int8]",  # 1
            "  [ pairs . 'lit.eral' ]  # comment",  # 2
            '[pairs."quo\\"ted\\\\"]',  # 3: quo"ted\\
            "[pairs.int8.tolerances]",  # 4: a sub-table, not a pair
            "[pairs.int8]",  # 5: a repeated header keeps the first line
            "pairs.dotted = { fp32 = 'x' }",  # 6: no header
            "[pairsx.no]",  # 7
            "[pairs.bare-name_2]",  # 8
        ]
    )
    assert pair_lines(text) == {"int8": 1, "lit.eral": 2, 'quo"ted\\': 3, "bare-name_2": 8}
    assert pair_lines("") == {}


def test_raise_usage_errors() -> None:
    items = ["a", "b"]
    config = SimpleNamespace(stash=pytest.Stash())
    raise_usage_errors(config, items)  # type: ignore[arg-type]
    config.stash[usage_key] = []
    raise_usage_errors(config, items)  # type: ignore[arg-type]
    assert items == ["a", "b"]
    config.stash[usage_key] = ["first", "second"]
    with pytest.raises(pytest.UsageError, match=r"^first$"):
        raise_usage_errors(config, items)  # type: ignore[arg-type]
    assert items == ["a", "b"]
    worker = SimpleNamespace(stash=config.stash, workeroutput={})
    raise_usage_errors(worker, items)  # type: ignore[arg-type]
    assert worker.workeroutput == {USAGE_OUTPUT: "first"} and items == []
    assert USAGE_OUTPUT == "qaccuracy_usage_error"


# --- load_suite ----------------------------------------------------------------------------------


def test_a_full_suite(tmp_path: Path) -> None:
    path = _suite(
        tmp_path,
        """
        [defaults]
        fp32 = "m.onnx"
        data = "d.npz"
        metrics = ["mse"]
        layers = ["conv* sqnr>=20"]
        [defaults.tolerances]
        min_cosine = 0.99
        max_top1_drop = 0.01

        [pairs.int8]
        quantized = "q.onnx"
        labels = "labels.npy"
        mapping = { a = "a_q" }
        backend = "integer"
        scheme = "tflite"
        targets = "glow, power2"
        xfail = "known"
        [pairs.int8.tolerances]
        min_cosine = 0.95

        [pairs.other]
        name = "renamed"
        quantized = "r.onnx"
        metrics = ["sqnr", "mse"]
        layers = ["relu* cosine>=0.9", "  "]
        task_targets = "t.jsonl"
        """,
    )
    first, second = load_suite(path, start=5)
    assert (first.table, first.spec.id, first.xfail) == ("int8", "int8", "known")
    assert first.tolerances == {
        "min_cosine": Tolerance("min_cosine", 0.95, "qaccuracy_a.toml [pairs.int8.tolerances]"),
        "max_top1_drop": Tolerance("max_top1_drop", 0.01, "qaccuracy_a.toml [defaults.tolerances]"),
    }
    spec = first.spec
    assert (spec.fp32, spec.quantized, spec.data, spec.labels) == (
        tmp_path / "m.onnx",
        tmp_path / "q.onnx",
        tmp_path / "d.npz",
        tmp_path / "labels.npy",
    )
    assert (spec.mapping, spec.metrics, spec.backend, spec.scheme, spec.targets) == (
        (("a", "a_q"),),
        ("mse",),
        "integer",
        "tflite",
        ("glow", "power2"),
    )
    assert first.rules == [
        Rule(
            "int8", "conv*", "sqnr", ">=", 20.0, "int8::conv* sqnr>=20", "qaccuracy_a.toml: pairs.int8.layers", 5, True
        )
    ]
    assert (second.table, second.spec.id, second.xfail) == ("other", "renamed", None)
    assert second.spec.metrics == ("sqnr", "mse") and second.spec.task_targets == tmp_path / "t.jsonl"
    assert second.spec.labels is None and second.spec.backend == "onnxruntime"
    assert [(r.pair, r.layer, r.metric, r.position) for r in second.rules] == [("renamed", "relu*", "cosine", 5)]
    assert second.rules[0].source == "qaccuracy_a.toml: pairs.other.layers"


def test_run_values_apply_to_pairs_that_set_none(tmp_path: Path) -> None:
    path = _suite(
        tmp_path,
        HEAD
        + """
        [pairs.a]
        quantized = "q.onnx"
        [pairs.b]
        quantized = "r.onnx"
        scheme = "glow"
        targets = []
        """,
    )
    run = {"backend": "integer", "scheme": "tflite", "targets": ("power2",)}
    a, b = load_suite(path, run=run)
    assert (a.spec.backend, a.spec.scheme, a.spec.targets) == ("integer", "tflite", ("power2",))
    assert (b.spec.backend, b.spec.scheme, b.spec.targets) == ("integer", "glow", ())
    plain, _ = load_suite(path)
    assert (plain.spec.backend, plain.spec.scheme, plain.spec.targets) == ("onnxruntime", "onnxruntime", ())


def test_slices_add_rules_after_the_layer_rules(tmp_path: Path) -> None:
    path = _suite(
        tmp_path,
        HEAD
        + """
        [pairs.a]
        quantized = "q.onnx"
        layers = ["conv* sqnr>=20"]
        [pairs.a.slices.boxes]
        view = "y[:, 0:4]"
        min_cosine = 0.9
        rules = ["sqnr>=10"]
        """,
    )
    (pair,) = load_suite(path, start=2)
    assert [(r.layer, r.output, r.metric, r.position) for r in pair.rules] == [
        ("conv*", None, "sqnr", 2),
        (None, "boxes", "sqnr", 1_000_000 + 3),  # after every other rule: start 2 + one layer rule
    ]
    assert [s.name for s in pair.spec.slices] == ["boxes"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("x = 1\n", "qaccuracy_a.toml: unknown key 'x' (known: defaults, pairs)"),
        ("[defaults]\n", "qaccuracy_a.toml: no [pairs.<name>] table"),
        ("pairs = 1\n", "qaccuracy_a.toml: no [pairs.<name>] table"),
        ("pairs = {}\n", "qaccuracy_a.toml: no [pairs.<name>] table"),
        ("defaults = 1\n[pairs.a]\n", "qaccuracy_a.toml: defaults: expected a table, got int"),
        (
            '[defaults]\nquantized = "q.onnx"\n[pairs.a]\n',
            f"qaccuracy_a.toml: defaults: unknown key 'quantized' (known: {', '.join(DEFAULT_KEYS)})",
        ),
        ("[pairs]\na = 1\n", "qaccuracy_a.toml: pairs.a: expected a table, got int"),
        (
            "[pairs.a]\nfp33 = 1\n",
            f"qaccuracy_a.toml: pairs.a: unknown key 'fp33' (known: {', '.join(PAIR_KEYS)})",
        ),
    ],
)
def test_malformed_files(tmp_path: Path, body: str, message: str) -> None:
    assert _error(_suite(tmp_path, body)) == message


def test_not_toml(tmp_path: Path) -> None:
    assert _error(_suite(tmp_path, "[pairs.a\n")).startswith("qaccuracy_a.toml: not valid TOML: ")


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        ("metrics = 'mse'", "qaccuracy_a.toml: pairs.a.metrics: expected a list of strings"),
        ("layers = [1]", "qaccuracy_a.toml: pairs.a.layers: expected a list of strings"),
        ("mapping = ['a']", "qaccuracy_a.toml: pairs.a.mapping: expected a table of fp32 tensor = quantized tensor"),
        ("xfail = true", "qaccuracy_a.toml: pairs.a.xfail: expected a reason string"),
        ("backend = 'gpu'", "qaccuracy_a.toml: pairs.a.backend: unknown backend 'gpu' (known: onnxruntime, integer)"),
        ("scheme = 'x'", "qaccuracy_a.toml: pairs.a.scheme: unknown scheme 'x' (presets: "),
        ("targets = 3", "qaccuracy_a.toml: pairs.a.targets: expected a list of scheme presets, got 3"),
        ("labels = 'gone.npy'", "qaccuracy_a.toml: pairs.a: qaccuracy pair: labels not found: "),
        ("layers = ['conv* sqnr>>20']", "qaccuracy_a.toml: pairs.a.layers: "),
        ("tolerances = { min_cosine = 2 }", "qaccuracy_a.toml: pairs.a.tolerances.min_cosine: "),
        ("tolerances = { min_cosin = 0.9 }", "qaccuracy_a.toml: pairs.a.tolerances: unknown key 'min_cosin' (known: "),
        ("slices = { s = 'y[0]' }", "qaccuracy_a.toml: pairs.a: slices.s: 'y[0]': the first index is the record"),
        ("slices = { s = { view = 'y[:, 0]', rules = ['sqnr>>1'] } }", "qaccuracy_a.toml: pairs.a.slices: "),
    ],
)
def test_a_bad_pair_key_is_one_line_naming_it(tmp_path: Path, pair: str, message: str) -> None:
    path = _suite(tmp_path, f'{HEAD}\n[pairs.a]\nquantized = "q.onnx"\n{pair}\n')
    error = _error(path)
    assert error.startswith(message) and "\n" not in error


def test_a_missing_file_or_key_names_the_pair(tmp_path: Path) -> None:
    path = _suite(tmp_path, '[pairs.a]\nfp32 = "m.onnx"\nquantized = "q.onnx"\n')
    assert _error(path) == "qaccuracy_a.toml: pairs.a: a qaccuracy pair needs fp32, quantized and data; missing data"


def test_a_bad_default_tolerance_names_the_pair_that_uses_it(tmp_path: Path) -> None:
    path = _suite(tmp_path, f'{HEAD}\n[defaults.tolerances]\nmax_lsb = -1\n[pairs.a]\nquantized = "q.onnx"\n')
    assert _error(path).startswith("qaccuracy_a.toml: pairs.a.tolerances.max_lsb: ")


def test_an_unusable_task_metric_is_a_usage_error(tmp_path: Path) -> None:
    path = _suite(tmp_path, f'{HEAD}\n[pairs.a]\nquantized = "q.onnx"\ntask_metrics = ["no_such_module:Metric"]\n')
    with pytest.raises(SuiteUsageError) as info:
        load_suite(path)
    assert str(info.value).startswith("qaccuracy_a.toml: pairs.a.task_metrics: ")


def test_claim_ids(tmp_path: Path) -> None:
    first = _suite(tmp_path, f'{HEAD}\n[pairs.a]\nquantized = "q.onnx"\n[pairs.b]\nquantized = "r.onnx"\n')
    (tmp_path / "sub").mkdir()
    for file in ("m.onnx", "q.onnx", "d.npz"):
        (tmp_path / "sub" / file).touch()
    second = tmp_path / "sub" / "qaccuracy_b.toml"
    second.write_text(f'{HEAD}\n[pairs.x]\nname = "b"\nquantized = "q.onnx"\n')
    ids: dict[str, tuple[Path, str]] = {}
    pairs = load_suite(first)
    _claim_ids(ids, first, pairs, tmp_path)
    _claim_ids(ids, first, pairs, tmp_path)  # the same file again (collected twice): the same claims
    assert ids == {"a": (first, "a"), "b": (first, "b")}
    with pytest.raises(SuiteError) as info:
        _claim_ids(ids, second, load_suite(second), tmp_path)
    assert str(info.value) == (
        "sub/qaccuracy_b.toml: pairs.x: pair id 'b' is already defined by qaccuracy_a.toml (pairs.b); "
        'pair ids must be unique across suites (set name = "..." on one of them)'
    )


def test_pair_config_directly(tmp_path: Path) -> None:
    _suite(tmp_path, "")
    defaults = {"fp32": "m.onnx", "data": "d.npz", "tolerances": {"min_sqnr": 20}}
    pair = PairConfig(tmp_path / "qaccuracy_z.toml", "t", {"quantized": "q.onnx"}, defaults, 0)
    assert pair.tolerances == {"min_sqnr": Tolerance("min_sqnr", 20, "qaccuracy_z.toml [defaults.tolerances]")}
    assert pair.rules == [] and pair.xfail is None and pair.table == "t" and pair.spec.id == "t"
    assert defaults == {"fp32": "m.onnx", "data": "d.npz", "tolerances": {"min_sqnr": 20}}  # left alone


# --- the items of a suite (collected in-process) -------------------------------------------------


#: in-process sessions without the plugins that would re-import themselves each time (hypothesis: 4 s)
ARGS = ("-p", "no:xdist", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark")


def _items(pytester: pytest.Pytester, *args: str) -> list[pytest.Item]:
    items, _ = pytester.inline_genitems(*ARGS, *args)
    return items


def test_the_items_of_a_pair(pytester: pytest.Pytester) -> None:
    _suite(
        pytester.path,
        HEAD
        + """
        [pairs.a]
        quantized = "q.onnx"
        layers = ["conv* sqnr>=20"]
        xfail = "known"
        [pairs.a.tolerances]
        max_top1_drop = 0.01
        atol = 0.5
        min_cosine = 0.9
        "max_drop:acc" = 0.02

        [pairs.b]
        quantized = "r.onnx"
        """,
    )
    items = _items(pytester)
    assert [i.nodeid for i in items] == [
        "qaccuracy_a.toml::a::min_cosine",
        "qaccuracy_a.toml::a::atol",
        "qaccuracy_a.toml::a::max_top1_drop",
        "qaccuracy_a.toml::a::max_drop:acc",
        "qaccuracy_a.toml::a::rules",
        "qaccuracy_a.toml::b::min_cosine",  # the session's default tolerance
    ]
    # each item checks its own tolerance, and carries the top-k setting (default 1) that shapes the figures
    assert [sorted(i.tolerances) for i in items] == [  # type: ignore[attr-defined]
        ["min_cosine", "topk"],
        ["atol", "topk"],
        ["max_top1_drop", "topk"],
        ["max_drop:acc", "topk"],
        ["topk"],
        ["min_cosine", "topk"],
    ]
    assert items[0].tolerances["min_cosine"].value == 0.9  # type: ignore[attr-defined]
    assert items[5].tolerances["min_cosine"].source == "default"  # type: ignore[attr-defined]
    assert [len(i.rules) for i in items] == [0, 0, 0, 0, 1, 0]  # type: ignore[attr-defined]
    assert [i.drift for i in items] == [False] * 6  # type: ignore[attr-defined]  # no baseline folder
    assert all(i.get_closest_marker("qaccuracy") is not None for i in items)
    xfails = [i.get_closest_marker("xfail") for i in items]
    assert [m.kwargs if m else None for m in xfails] == [{"reason": "known", "strict": True}] * 5 + [None]
    path, line, text = items[1].reportinfo()
    assert (Path(path).name, line, text) == ("qaccuracy_a.toml", 5, "qaccuracy: a::atol")
    assert items[0].parent is not None and items[0].parent.reportinfo()[1:] == (5, "qaccuracy: a")
    assert items[5].reportinfo()[1] == 15  # [pairs.b]'s 0-based line
    assert "a" in items[0].keywords and "b" not in items[0].keywords


def test_rtol_carries_atol_and_topk_goes_to_every_item(pytester: pytest.Pytester) -> None:
    _suite(
        pytester.path,
        HEAD
        + """
        [pairs.a]
        quantized = "q.onnx"
        [pairs.a.tolerances]
        rtol = 0.1
        atol = 0.5
        min_top1_agreement = 0.9
        topk = 3
        """,
    )
    items = _items(pytester)
    assert [i.name for i in items] == ["min_cosine", "rtol", "min_top1_agreement"]
    assert [sorted(i.tolerances) for i in items] == [  # type: ignore[attr-defined]
        ["min_cosine", "topk"],
        ["atol", "rtol", "topk"],
        ["min_top1_agreement", "topk"],
    ]
    assert all(i.tolerances["topk"].value == 3 for i in items)  # type: ignore[attr-defined]
    assert [i.drift for i in items] == [False] * 3  # type: ignore[attr-defined]
    measured = ["atol", "min_cosine", "min_top1_agreement", "rtol", "topk"]  # every item measures them all
    assert [sorted(i.measure) for i in items] == [measured] * 3  # type: ignore[attr-defined]


def test_ini_rules_and_a_baseline_folder_add_items(pytester: pytest.Pytester) -> None:
    _suite(pytester.path, HEAD + '\n[pairs.a]\nquantized = "q.onnx"\n[pairs.b]\nquantized = "r.onnx"\n')
    (pytester.path / ".qaccuracy-baselines").mkdir()
    pytester.makeini("[pytest]\nqaccuracy_tolerances = b::* sqnr>=3\n")
    items = _items(pytester)
    assert [i.nodeid for i in items] == [
        "qaccuracy_a.toml::a::min_cosine",
        "qaccuracy_a.toml::a::drift",
        "qaccuracy_a.toml::b::min_cosine",
        "qaccuracy_a.toml::b::rules",
        "qaccuracy_a.toml::b::drift",
    ]
    assert [i.drift for i in items] == [False, True, False, False, True]  # type: ignore[attr-defined]
    assert [len(i.rules) for i in items] == [0, 0, 0, 1, 0]  # type: ignore[attr-defined]


def test_a_suite_error_is_a_collection_error(pytester: pytest.Pytester) -> None:
    _suite(pytester.path, "[pairs.a]\nfp33 = 1\n")
    items, rec = pytester.inline_genitems(*ARGS)
    assert items == []
    (failed,) = rec.getfailedcollections()
    assert "qaccuracy_a.toml: pairs.a: unknown key 'fp33'" in str(failed.longrepr)


def test_an_id_twice_is_a_collection_error(pytester: pytest.Pytester) -> None:
    _suite(pytester.path, HEAD + '\n[pairs.a]\nquantized = "q.onnx"\n')
    _suite(pytester.path, HEAD + '\n[pairs.z]\nname = "a"\nquantized = "q.onnx"\n', "qaccuracy_b.toml")
    items, rec = pytester.inline_genitems(*ARGS)
    assert [i.nodeid for i in items] == ["qaccuracy_a.toml::a::min_cosine"]
    (failed,) = rec.getfailedcollections()
    assert "qaccuracy_b.toml: pairs.z: pair id 'a' is already defined by qaccuracy_a.toml (pairs.a)" in str(
        failed.longrepr
    )


def test_an_unusable_task_metric_stops_the_session(pytester: pytest.Pytester) -> None:
    _suite(pytester.path, HEAD + '\n[pairs.a]\nquantized = "q.onnx"\ntask_metrics = ["no_such_module:M"]\n')
    result = pytester.runpytest_inprocess(*ARGS, "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "qaccuracy_a.toml: pairs.a.task_metrics: " in result.stderr.str()


def test_a_drift_item_without_a_baseline_skips(pytester: pytest.Pytester) -> None:
    _suite(pytester.path, HEAD + '\n[pairs.a]\nquantized = "q.onnx"\n')
    (pytester.path / ".qaccuracy-baselines").mkdir()
    rec = pytester.inline_run(*ARGS, "-k", "drift")
    ((_, _, reason),) = [r.longrepr for r in rec.getreports("pytest_runtest_logreport") if r.skipped]
    assert (
        reason
        == "Skipped: no baseline for pair 'a' in .qaccuracy-baselines (write one with --qaccuracy-update-baselines)"
    )


def test_scores_and_task_metrics_reach_the_spec(tmp_path: Path) -> None:
    path = _suite(tmp_path, f'{HEAD}\n[pairs.a]\nquantized = "q.onnx"\nscores = "y"\ntask_metrics = ["binary_f1"]\n')
    (pair,) = load_suite(path)
    assert pair.spec.scores == "y" and [t.path for t in pair.spec.task_metrics] == ["binary_f1"]
    (pair,) = load_suite(path, run={"configured_task_metrics": ("ctc",)})
    assert [t.path for t in pair.spec.task_metrics] == ["ctc", "binary_f1"]  # the ini's first


def test_the_sessions_settings_reach_the_suites_pairs(pytester: pytest.Pytester) -> None:
    # a dotted key before any table header: a pair without a [pairs.<name>] header
    _suite(pytester.path, 'pairs.inline = { quantized = "q.onnx", layers = ["conv* sqnr>=1"] }\n' + HEAD)
    pytester.makeini(
        "[pytest]\nqaccuracy_backend = integer\nqaccuracy_scheme = glow\nqaccuracy_targets = tflite\n"
        "qaccuracy_task_metrics = ctc\nqaccuracy_tolerances =\n    x::* sqnr>=1\n    y::* sqnr>=2\n"
    )
    items = _items(pytester)
    assert [i.name for i in items] == ["min_cosine", "rules"]
    spec = items[0].spec  # type: ignore[attr-defined]
    assert (spec.backend, spec.scheme, spec.targets) == ("integer", "glow", ("tflite",))
    assert [t.path for t in spec.task_metrics] == ["ctc"]
    assert [r.position for r in items[1].rules] == [0, 1, 2]  # type: ignore[attr-defined]  # after the ini's two
    assert items[0].reportinfo()[1] == 0  # a pair without a [pairs.<name>] header: line 0


class _Result:
    def __init__(self, message: str | None) -> None:
        self.message, self.properties = message, [("qaccuracy.pair", "a")]


def _fake_check(monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]], outcome: Any) -> None:
    """The session's check replaced: it records its arguments and returns or raises ``outcome``."""
    from pytest_qaccuracy.plugin.session import QAccuracySession

    def check(self: Any, spec: Any, tolerances: Any, rules: Any, nodeid: str, **kwargs: Any) -> _Result:
        calls.append({"spec": spec, "tolerances": tolerances, "rules": rules, "nodeid": nodeid, **kwargs})
        if isinstance(outcome, BaseException):
            raise outcome
        return _Result(outcome)

    monkeypatch.setattr(QAccuracySession, "check", check)


def test_an_item_runs_the_sessions_check(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    _suite(pytester.path, HEAD + '\n[pairs.a]\nquantized = "q.onnx"\nlayers = ["c* sqnr>=1"]\n')
    calls: list[dict[str, Any]] = []
    _fake_check(monkeypatch, calls, "a: min_cosine 0.5 < 0.99\n  second line")
    rec = pytester.inline_run(*ARGS, "-k", "min_cosine", "--junitxml=out.xml")
    ((call,),) = [calls]
    assert call["nodeid"] == "qaccuracy_a.toml::a::min_cosine" and call["spec"].id == "a"
    assert sorted(call["tolerances"]) == ["min_cosine", "topk"] and call["rules"] == []
    assert call["drift"] is False and call["xfail"] is None and sorted(call["measure"]) == ["min_cosine", "topk"]
    (report,) = [r for r in rec.getreports("pytest_runtest_logreport") if r.when == "call"]
    assert report.failed and str(report.longrepr) == "a: min_cosine 0.5 < 0.99\n  second line"
    assert report.user_properties == [("qaccuracy.pair", "a")]
    assert '<property name="qaccuracy.pair" value="a"' in (pytester.path / "out.xml").read_text()


def test_an_item_without_properties_and_passing(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    _suite(pytester.path, HEAD + '\n[pairs.a]\nquantized = "q.onnx"\nlayers = ["c* sqnr>=1"]\nxfail = "known"\n')
    pytester.makeini("[pytest]\nqaccuracy_junit_properties = false\n")
    calls: list[dict[str, Any]] = []
    _fake_check(monkeypatch, calls, None)
    rec = pytester.inline_run(*ARGS, "-k", "rules")
    ((call,),) = [calls]
    assert call["xfail"] == "known" and len(call["rules"]) == 1 and call["drift"] is False
    (report,) = [r for r in rec.getreports("pytest_runtest_logreport") if r.when == "call"]
    assert report.failed and report.user_properties == []  # strict xfail: a pass fails
    assert "[XPASS(strict)] known" in str(report.longrepr)


def test_an_item_whose_check_raises(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_qaccuracy.errors import CheckError

    _suite(pytester.path, HEAD + '\n[pairs.a]\nquantized = "q.onnx"\n')
    _fake_check(monkeypatch, [], CheckError("pair 'a': output 'y': broken"))
    rec = pytester.inline_run(*ARGS)
    (report,) = [r for r in rec.getreports("pytest_runtest_logreport") if r.when == "call"]
    assert str(report.longrepr) == "pair 'a': output 'y': broken"
    _fake_check(monkeypatch, [], KeyError("k"))
    rec = pytester.inline_run(*ARGS)
    (report,) = [r for r in rec.getreports("pytest_runtest_logreport") if r.when == "call"]
    assert "KeyError: 'k'" in str(report.longrepr) and "def check(" in str(report.longrepr)  # pytest's own


def test_a_drift_item_with_a_baseline_runs_the_check(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_qaccuracy.plugin.baselines import baseline_path
    from pytest_qaccuracy.plugin.pairs import PairSpec

    _suite(pytester.path, HEAD + '\n[pairs.a]\nquantized = "q.onnx"\n')
    folder = pytester.path / ".qaccuracy-baselines"
    folder.mkdir()
    spec = PairSpec("a", pytester.path / "m.onnx", pytester.path / "q.onnx", pytester.path / "d.npz")
    baseline_path(folder, spec, pytester.path).write_text("{}")
    calls: list[dict[str, Any]] = []
    _fake_check(monkeypatch, calls, None)
    rec = pytester.inline_run(*ARGS, "-k", "drift")
    assert [c["drift"] for c in calls] == [True]
    assert [r.outcome for r in rec.getreports("pytest_runtest_logreport") if r.when == "call"] == ["passed"]


def test_rtol_alone(pytester: pytest.Pytester) -> None:
    _suite(pytester.path, HEAD + '\n[pairs.a]\nquantized = "q.onnx"\ntolerances = { rtol = 0.1 }\n')
    items = _items(pytester)
    assert [i.name for i in items] == ["min_cosine", "rtol"]
    assert sorted(items[1].tolerances) == ["rtol", "topk"]  # type: ignore[attr-defined]


def test_only_drift_items_skip_without_a_baseline(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    _suite(pytester.path, HEAD + '\n[pairs.a]\nquantized = "q.onnx"\n')
    (pytester.path / ".qaccuracy-baselines").mkdir()
    calls: list[dict[str, Any]] = []
    _fake_check(monkeypatch, calls, None)
    rec = pytester.inline_run(*ARGS)
    outcomes = [(r.nodeid, r.outcome) for r in rec.getreports("pytest_runtest_logreport") if r.when == "call"]
    assert outcomes == [("qaccuracy_a.toml::a::min_cosine", "passed"), ("qaccuracy_a.toml::a::drift", "skipped")]
    assert [c["nodeid"] for c in calls] == ["qaccuracy_a.toml::a::min_cosine"]


def test_an_empty_xfail_reason_reads_xfail(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    _suite(pytester.path, HEAD + '\n[pairs.a]\nquantized = "q.onnx"\nxfail = ""\n')
    calls: list[dict[str, Any]] = []
    _fake_check(monkeypatch, calls, "failed as expected")
    rec = pytester.inline_run(*ARGS)
    assert [c["xfail"] for c in calls] == ["xfail"]
    assert [r.outcome for r in rec.getreports("pytest_runtest_logreport") if r.when == "call"] == ["skipped"]


def test_a_check_errors_cause_follows_with_verbose(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_qaccuracy.errors import CheckError

    _suite(pytester.path, HEAD + '\n[pairs.a]\nquantized = "q.onnx"\n')
    try:
        raise ValueError("the root cause")
    except ValueError as exc:
        error = CheckError("pair 'a': broken")
        error.__cause__ = exc
    _fake_check(monkeypatch, [], error)
    for args, shown in (((), "pair 'a': broken"), (("-v",), "ValueError: the root cause")):
        rec = pytester.inline_run(*ARGS, *args)
        (report,) = [r for r in rec.getreports("pytest_runtest_logreport") if r.when == "call"]
        assert str(report.longrepr).startswith("pair 'a': broken") and shown in str(report.longrepr)
        assert ("the root cause" in str(report.longrepr)) is bool(args)


def test_a_task_metric_module_beside_the_suite(tmp_path: Path) -> None:
    """A module next to the suite file, not on ``sys.path``, is imported from the suite's folder (a
    new name each run: an imported module would be found in ``sys.modules`` without the folder)."""
    module = f"suite_units_beside_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text("from pytest_qaccuracy.metrics.binary import BinaryF1 as F1\n")
    path = _suite(tmp_path, f'{HEAD}\n[pairs.a]\nquantized = "q.onnx"\ntask_metrics = ["{module}:F1"]\n')
    (pair,) = load_suite(path)
    assert [t.path for t in pair.spec.task_metrics] == [f"{module}:F1"]


def test_load_suite_numbers_rules_from_zero(tmp_path: Path) -> None:
    path = _suite(tmp_path, f'{HEAD}\n[pairs.a]\nquantized = "q.onnx"\nlayers = ["c* sqnr>=1", "d* sqnr>=2"]\n')
    (pair,) = load_suite(path)
    assert [r.position for r in pair.rules] == [0, 1]


def test_collection_declares_the_pairs_task_values(pytester: pytest.Pytester) -> None:
    from pytest_qaccuracy.plugin.fixtures import session_key

    _suite(pytester.path, HEAD + '\n[pairs.a]\nquantized = "q.onnx"\ntask_metrics = ["binary_f1"]\n')
    declared: list[set[str]] = []

    class Recorder:
        def pytest_collection_finish(self, session: pytest.Session) -> None:
            declared.append(set(session.config.stash[session_key].task_values_declared))

    pytester.inline_run(*ARGS, "--collect-only", plugins=[Recorder()])
    assert declared == [{"f1"}]
