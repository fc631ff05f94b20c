"""The plugin's options read into settings, in this process: defaults, the ini file, the command
line over it, each parser's accepted and refused values, and the one line naming a bad option.

Each test parses a real pytest configuration (``pytester.parseconfig``: options declared by the
plugin, no session run) and calls the readers directly, so a run takes milliseconds."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pytest_qaccuracy import defaults
from pytest_qaccuracy.plugin import ini, options, schemes, settings
from pytest_qaccuracy.plugin.settings import OPTIONS, QAccuracySettings, load_settings
from pytest_qaccuracy.presets import NAMES
from pytest_qaccuracy.tolerances import BadValue, Tolerance


@pytest.fixture
def parse(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """``parse(*args, ini=...)``: the configuration of a pytest invoked with ``args`` beside ``ini``
    (a ``tox.ini`` body of ``qaccuracy_*`` lines), without the suite's own PYTEST_ADDOPTS."""
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)

    def make(*args: str, ini: str | None = None, toml: str | None = None) -> pytest.Config:
        if ini is not None:
            pytester.makeini("[pytest]\n" + ini)
        else:
            (pytester.path / "tox.ini").unlink(missing_ok=True)
        if toml is not None:
            pytester.makefile(".toml", pyproject=toml)
        return pytester.parseconfig(*args)

    return make


def test_defaults(parse, pytester: pytest.Pytester) -> None:
    config = parse()
    s = load_settings(config)
    root = config.rootpath
    assert s.tolerances == {
        "min_cosine": Tolerance("min_cosine", 0.99, "default"),
        "topk": Tolerance("topk", 1, "default"),
    }
    assert (s.metrics, s.rules, s.max_drift, s.providers) == (None, (), (), ("CPUExecutionProvider",))
    assert (s.artifacts_dir, s.baseline_dir, s.save_baseline_dir) == (
        root / ".qaccuracy",
        root / ".qaccuracy-baselines",
        None,
    )
    assert (s.batch_size, s.junit_properties, s.baseline_required, s.save_failing_baselines) == (8, True, False, False)
    assert (s.prune_baselines, s.fail_on_improvement, s.sensitivity, s.sensitivity_metric) == (
        False,
        False,
        "failed",
        "cosine",
    )
    assert (s.sensitivity_mode, s.sensitivity_top, s.sensitivity_records) == ("single", defaults.TOP, 32)
    assert (s.analysis, s.analysis_budget, s.backend, s.scheme) == ("recipe", (2.0, None), "onnxruntime", "onnxruntime")
    assert (s.targets, s.task_metrics, s.report, s.origins) == ((), (), None, {})
    assert s.where("metrics") == "qaccuracy_metrics" and s.where("no_artifacts") == "--qaccuracy-no-artifacts"
    assert s.where("rules_cli") == "--qaccuracy-tolerance"


INI = """\
qaccuracy_min_cosine = 0.995
qaccuracy_rtol = 0.01
qaccuracy_metrics = mse sqnr
qaccuracy_tolerances =
    # a comment line
    * sqnr>=10
    *::conv* cosine>=0.9
qaccuracy_artifacts_dir = out/art
qaccuracy_report = out/page.html
qaccuracy_providers = CPUExecutionProvider
qaccuracy_batch_size = 3
qaccuracy_baseline_dir = base
qaccuracy_fail_on_improvement = yes
qaccuracy_max_drift =
    sqnr:-2.0
    mse:+10%
qaccuracy_junit_properties = off
qaccuracy_sensitivity = ALL
qaccuracy_sensitivity_metric = SQNR
qaccuracy_sensitivity_mode = leave-one-out
qaccuracy_sensitivity_top = 4
qaccuracy_sensitivity_records = 0
qaccuracy_analysis = rank
qaccuracy_analysis_budget = 90s
qaccuracy_backend = integer
qaccuracy_scheme = tflite
qaccuracy_targets =
    onnxruntime-avx2, onnxruntime-vnni
    onnxruntime-avx2
qaccuracy_task_metrics =
    ctc
qaccuracy_task_tolerances =
    # comment

    max_drop:cer = 0.005
    min:f1 = 0.5
"""


def test_every_option_from_the_ini_file(parse) -> None:
    config = parse(ini=INI)
    s = load_settings(config)
    here = config.inipath.parent
    src = "ini file tox.ini"
    assert s.tolerances["min_cosine"] == Tolerance("min_cosine", 0.995, f"{src} (qaccuracy_min_cosine)")
    assert s.tolerances["rtol"] == Tolerance("rtol", 0.01, f"{src} (qaccuracy_rtol)")
    assert s.tolerances["max_drop:cer"] == Tolerance("max_drop:cer", 0.005, f"{src} (qaccuracy_task_tolerances)")
    assert s.tolerances["min:f1"] == Tolerance("min:f1", 0.5, f"{src} (qaccuracy_task_tolerances)")
    assert s.metrics == ("mse", "sqnr")
    assert [(r.text, r.position, r.source) for r in s.rules] == [
        ("* sqnr>=10", 0, f"{src} (qaccuracy_tolerances)"),
        ("*::conv* cosine>=0.9", 1, f"{src} (qaccuracy_tolerances)"),
    ]
    assert s.artifacts_dir == here / "out" / "art" and s.report == here / "out" / "page.html"
    assert (s.providers, s.batch_size, s.baseline_dir, s.save_baseline_dir) == (
        ("CPUExecutionProvider",),
        3,
        here / "base",
        None,
    )
    assert (s.fail_on_improvement, s.max_drift, s.junit_properties) == (True, ("sqnr:-2.0", "mse:+10%"), False)
    assert (s.sensitivity, s.sensitivity_metric, s.sensitivity_mode) == ("all", "sqnr", "leave-one-out")
    assert (s.sensitivity_top, s.sensitivity_records, s.analysis, s.analysis_budget) == (4, 0, "rank", (None, 90.0))
    assert (s.backend, s.scheme, s.targets, s.task_metrics) == (
        "integer",
        "tflite",
        ("onnxruntime-avx2", "onnxruntime-vnni"),
        ("ctc",),
    )
    assert s.origins == {
        name: f"qaccuracy_{name}"
        for name in (
            "batch_size", "max_drift", "artifacts_dir", "backend", "scheme", "metrics", "providers", "junit_properties",
            "fail_on_improvement", "sensitivity", "sensitivity_metric", "sensitivity_mode", "sensitivity_top",
            "sensitivity_records", "analysis", "analysis_budget", "targets", "task_metrics",
        )
    }  # fmt: skip
    assert s.where("metrics") == "qaccuracy_metrics"


def test_the_command_line_wins_and_is_named(parse, pytester: pytest.Pytester, monkeypatch) -> None:
    (pytester.path / "sub").mkdir()
    config = parse(
        "--qaccuracy-min-cosine=0.5",
        "--qaccuracy-tolerance=* mse<=1",
        "--qaccuracy-metrics=mse, cosine,,",
        "--qaccuracy-artifacts-dir=cli-art",
        "--qaccuracy-report=r.html",
        "--qaccuracy-baseline=cli-base",
        "--qaccuracy-update-baselines",
        "--qaccuracy-prune-baselines",
        "--qaccuracy-fail-on-improvement",
        "--qaccuracy-max-drift=sqnr:-0.5",
        "--qaccuracy-sensitivity=off",
        "--qaccuracy-analysis-budget=5m",
        "--qaccuracy-backend=onnxruntime",
        "--qaccuracy-targets=tflite glow,tflite",
        "--qaccuracy-task-tolerance=max_drop:cer = 0.01",
        ini=INI,
    )
    s = load_settings(config)
    cwd = config.invocation_params.dir
    assert s.tolerances["min_cosine"] == Tolerance("min_cosine", 0.5, "command line --qaccuracy-min-cosine")
    assert s.tolerances["max_drop:cer"] == Tolerance("max_drop:cer", 0.01, "command line --qaccuracy-task-tolerance")
    assert s.tolerances["min:f1"].source == "ini file tox.ini (qaccuracy_task_tolerances)"
    assert [(r.text, r.position, r.source) for r in s.rules][2] == ("* mse<=1", 2, "command line --qaccuracy-tolerance")
    assert (s.metrics, s.artifacts_dir, s.report, s.batch_size) == (
        ("mse", "cosine"),
        cwd / "cli-art",
        cwd / "r.html",
        3,
    )
    assert (s.baseline_dir, s.save_baseline_dir, s.baseline_required) == (cwd / "cli-base", cwd / "cli-base", True)
    assert (s.save_failing_baselines, s.prune_baselines, s.fail_on_improvement) == (False, True, True)
    assert (s.max_drift, s.sensitivity, s.analysis_budget) == (("sqnr:-0.5",), "off", (None, 300.0))
    assert (s.backend, s.targets) == ("onnxruntime", ("tflite", "glow"))
    assert s.origins["metrics"] == "--qaccuracy-metrics" and s.origins["artifacts_dir"] == "--qaccuracy-artifacts-dir"
    assert s.origins["batch_size"] == "qaccuracy_batch_size"  # an ini key only
    assert s.where("backend") == "--qaccuracy-backend"


def test_update_all_baselines_writes_failing_ones_too_and_no_artifacts(parse) -> None:
    s = load_settings(parse("--qaccuracy-update-all-baselines", "--qaccuracy-no-artifacts"))
    assert s.save_baseline_dir == s.baseline_dir and s.save_failing_baselines is True
    assert s.baseline_required is False and s.artifacts_dir is None and "artifacts_dir" not in s.origins


def test_a_path_from_the_ini_file_is_relative_to_it(parse, pytester: pytest.Pytester, monkeypatch) -> None:
    (pytester.path / "project").mkdir()
    (pytester.path / "project" / "tox.ini").write_text("[pytest]\nqaccuracy_artifacts_dir = art\n")
    (pytester.path / "elsewhere").mkdir()
    monkeypatch.chdir(pytester.path / "elsewhere")
    config = parse("-c", str(pytester.path / "project" / "tox.ini"), "--qaccuracy-report=page.html")
    s = load_settings(config)
    assert s.artifacts_dir == pytester.path / "project" / "art"
    assert s.report == pytester.path / "elsewhere" / "page.html"


def test_an_ini_override_without_an_ini_file_is_relative_to_the_invocation(parse) -> None:
    config = parse("-o", "qaccuracy_artifacts_dir=art")
    assert config.inipath is None
    s = load_settings(config)
    assert (
        s.artifacts_dir == config.invocation_params.dir / "art"
        and s.origins["artifacts_dir"] == "qaccuracy_artifacts_dir"
    )


def test_command_line_task_tolerances_skip_comments_and_blanks(parse) -> None:
    args = [
        "--qaccuracy-task-tolerance=# a note",
        "--qaccuracy-task-tolerance=  ",
        "--qaccuracy-task-tolerance=min:f1 = 0.5",
    ]
    s = load_settings(parse(*args))
    assert s.tolerances["min:f1"] == Tolerance("min:f1", 0.5, "command line --qaccuracy-task-tolerance")


def test_a_bad_rule_says_why(parse) -> None:
    with pytest.raises(pytest.UsageError) as info:
        load_settings(parse("--qaccuracy-tolerance=* sqnr>>5"))
    message = str(info.value)
    assert message.startswith("--qaccuracy-tolerance: ") and "sqnr>>5" in message and "None" not in message


def test_a_blank_command_line_value_leaves_the_ini_one(parse) -> None:
    s = load_settings(parse("--qaccuracy-min-cosine=  ", "--qaccuracy-metrics=", ini="qaccuracy_min_cosine = 0.9\n"))
    assert s.tolerances["min_cosine"].value == 0.9 and s.metrics is None


@pytest.mark.parametrize(
    ("args", "ini_text", "message"),
    [
        (["--qaccuracy-min-cosine=high"], None, "--qaccuracy-min-cosine: "),
        ([], "qaccuracy_batch_size = 0\n", "qaccuracy_batch_size: expected an integer >= 1, got '0'"),
        ([], "qaccuracy_batch_size = many\n", "qaccuracy_batch_size: expected an integer >= 1, got 'many'"),
        (["--qaccuracy-sensitivity-top=0"], None, "--qaccuracy-sensitivity-top: expected an integer >= 1, got '0'"),
        (["--qaccuracy-sensitivity-records=-1"], None, "--qaccuracy-sensitivity-records: expected an integer >= 0"),
        (["--qaccuracy-sensitivity=some"], None, "--qaccuracy-sensitivity: expected one of failed, all, off, got"),
        (["--qaccuracy-analysis=deep"], None, "--qaccuracy-analysis: expected one of off, rank, recipe, got 'deep'"),
        (["--qaccuracy-sensitivity-metric=a-b"], None, "--qaccuracy-sensitivity-metric: expected one metric name"),
        (["--qaccuracy-backend=gpu"], None, "--qaccuracy-backend: unknown backend 'gpu' (known: onnxruntime, integer)"),
        (["--qaccuracy-scheme=x"], None, "--qaccuracy-scheme: unknown scheme 'x' (presets: onnxruntime, "),
        (["--qaccuracy-targets=tflite,x"], None, "--qaccuracy-targets: unknown scheme 'x'"),
        (["--qaccuracy-max-drift=sqnr"], None, "--qaccuracy-max-drift: "),
        (["--qaccuracy-tolerance=nonsense"], None, "--qaccuracy-tolerance: "),
        ([], "qaccuracy_tolerances = nonsense\n", "qaccuracy_tolerances: "),
        (["--qaccuracy-task-tolerance=cer 0.1"], None, "--qaccuracy-task-tolerance: bad task tolerance 'cer 0.1'"),
        ([], "qaccuracy_task_tolerances = max:x = y\n", "qaccuracy_task_tolerances: expected a number, got 'y'"),
        ([], "qaccuracy_junit_properties = maybe\n", "qaccuracy_junit_properties: expected true or false, got 'maybe'"),
        (["--qaccuracy-analysis-budget=2d"], None, "--qaccuracy-analysis-budget: expected a multiple of"),
    ],
)  # fmt: skip
def test_a_bad_value_is_one_usage_error_naming_its_option(parse, args, ini_text, message) -> None:
    with pytest.raises(pytest.UsageError) as info:
        load_settings(parse(*args, ini=ini_text))
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2x", (2.0, None)),
        (" 0.5X ", (0.5, None)),
        ("90s", (None, 90.0)),
        ("5m", (None, 300.0)),
        ("1h", (None, 3600.0)),
    ],
)
def test_budget_accepts(text, expected) -> None:
    assert settings._budget(text) == expected


@pytest.mark.parametrize("text", ["0x", "-1s", "x", "", "5d", "abc", "m5", "2 x x"])
def test_budget_refuses(text) -> None:
    with pytest.raises(ValueError, match=r"expected a multiple of the check time \(2x\) or a time \(90s, 5m\), got "):
        settings._budget(text)


def test_integer_choice_and_metric_name_parsers() -> None:
    assert settings._integer(1)(" 4 ") == 4 and settings._integer(1)("1") == 1 and settings._integer(0)("0") == 0
    assert settings._integer(1)(5) == 5
    for bad, minimum in (("0", 1), ("-1", 0), ("a", 0), (True, 0), (False, 0), ("1.5", 0)):
        with pytest.raises(ValueError, match=rf"expected an integer >= {minimum}, got "):
            settings._integer(minimum)(bad)
    assert settings._choice(("a", "bb"))(" BB ") == "bb"
    with pytest.raises(ValueError, match=r"^expected one of a, bb, got 'c'$"):
        settings._choice(("a", "bb"))("c")
    assert settings._metric_name(" SQNR ") == "sqnr" and settings._metric_name("_x1") == "_x1"
    for bad in ("1a", "a b", "a-b", ""):
        with pytest.raises(ValueError, match="expected one metric name such as cosine"):
            settings._metric_name(bad)


def test_names_targets_and_drift_rules() -> None:
    assert settings._names("a, b,,c ") == ("a", "b", "c")
    assert settings._names(["a,b", " c "]) == ("a", "b", "c")
    assert settings._names("") is None and settings._names(" , ") is None and settings._names(5) is None
    assert settings._targets(["tflite", "glow tflite"]) == ("tflite", "glow")
    assert settings._targets("glow, tflite") == ("glow", "tflite")
    assert settings._drift_rules(["sqnr:-1.0", "mse:+20%"]) == ("sqnr:-1.0", "mse:+20%")
    assert settings._drift_rules("sqnr:-1.0") == ()
    with pytest.raises(ValueError):
        settings._drift_rules(["sqnr"])


def test_check_metrics_names_the_option_each_metric_came_from(parse) -> None:
    settings.check_metrics(load_settings(parse()))  # nothing named: nothing imported or checked
    ok = load_settings(parse("--qaccuracy-metrics=mse,sqnr", "--qaccuracy-tolerance=* cosine>=0.5"))
    settings.check_metrics(ok)
    cases = [
        (("--qaccuracy-metrics=mse,nope",), None, "--qaccuracy-metrics: unknown metric 'nope'"),
        ((), "qaccuracy_metrics = nope\n", "qaccuracy_metrics: unknown metric 'nope'"),
        (("--qaccuracy-tolerance=* nope>=1",), None, "--qaccuracy-tolerance: tolerance rule '* nope>=1': "),
        ((), "qaccuracy_tolerances = * nope>=1\n", "qaccuracy_tolerances: tolerance rule '* nope>=1': "),
        (("--qaccuracy-sensitivity-metric=nope",), None, "--qaccuracy-sensitivity-metric: unknown metric 'nope'"),
        ((), "qaccuracy_sensitivity_metric = nope\n", "qaccuracy_sensitivity_metric: unknown metric 'nope'"),
    ]
    for args, ini_text, message in cases:
        with pytest.raises(pytest.UsageError) as info:
            settings.check_metrics(load_settings(parse(*args, ini=ini_text)))
        assert str(info.value).startswith(message) and "nope" in str(info.value), (args, str(info.value))
    off = load_settings(parse("--qaccuracy-sensitivity-metric=nope", "--qaccuracy-sensitivity=off"))
    settings.check_metrics(off)  # not analysed: not checked


def test_check_task_metrics_names_the_option(parse) -> None:
    settings.check_task_metrics(load_settings(parse()))
    settings.check_task_metrics(load_settings(parse("--qaccuracy-task-metrics=ctc")))
    for args, ini_text, where in (
        (("--qaccuracy-task-metrics=no_such_module:Metric",), None, "--qaccuracy-task-metrics: "),
        ((), "qaccuracy_task_metrics = no_such_module:Metric\n", "qaccuracy_task_metrics: "),
    ):
        with pytest.raises(pytest.UsageError) as info:
            settings.check_task_metrics(load_settings(parse(*args, ini=ini_text)))
        assert str(info.value).startswith(where) and "no_such_module" in str(info.value)


def test_every_option_is_declared_with_its_action_and_default(parse) -> None:
    config = parse()
    assert config.getoption("qaccuracy_tolerances") == [] and config.getoption("qaccuracy_max_drift") == []
    assert config.getoption("qaccuracy_task_tolerances") == []
    assert config.getoption("qaccuracy_fail_on_improvement") is None
    assert config.getoption("qaccuracy_no_artifacts") is False and config.getoption("qaccuracy_rtol") is None
    config = parse("--qaccuracy-fail-on-improvement", "--qaccuracy-tolerance=a", "--qaccuracy-tolerance=b")
    assert config.getoption("qaccuracy_fail_on_improvement") is True
    assert config.getoption("qaccuracy_tolerances") == ["a", "b"]
    for option in OPTIONS.values():
        if option.ini is not None:
            assert config.getini(option.ini) in ("", [], None)


class _Recorder:
    def __init__(self) -> None:
        self.flags: list[tuple[str, dict]] = []
        self.inis: list[tuple[str, str, str]] = []

    def addoption(self, flag: str, **kwargs) -> None:
        self.flags.append((flag, kwargs))

    def addini(self, name: str, help: str, type: str) -> None:
        self.inis.append((name, help, type))


def test_declare_passes_each_option_as_written() -> None:
    rec = _Recorder()
    options.Option.named("max_lsb", "Steps (overrides ini)", "N", ini_help="Steps (integer)").declare(rec, rec)
    assert rec.flags == [
        ("--qaccuracy-max-lsb", {"action": "store", "help": "Steps (overrides ini)", "metavar": "N", "default": None})
    ]
    assert rec.inis == [("qaccuracy_max_lsb", "Steps (integer)", "string")]
    rec = _Recorder()
    options.Option(flag="--x-rule", dest="x_rules", help="h", metavar="RULE", action="append").declare(rec, rec)
    options.Option("x_on", "--x-on", "on?", action="store_const").declare(rec, rec)
    options.Option(flag="--x-flag", help="f", action="store_true").declare(rec, rec)
    options.Option("x_lines", help="lines", ini_type="linelist").declare(rec, rec)
    assert rec.flags == [
        ("--x-rule", {"action": "append", "help": "h", "dest": "x_rules", "metavar": "RULE", "default": []}),
        ("--x-on", {"action": "store_const", "help": "on?", "const": True, "default": None}),
        ("--x-flag", {"action": "store_true", "help": "f"}),
    ]
    assert rec.inis == [("x_on", "on?", "string"), ("x_lines", "lines", "linelist")]
    assert options.Option("a", ini_type="args").lines and options.Option("a", ini_type="linelist").lines
    assert not options.Option("a").lines


def test_given_and_read_option(parse) -> None:
    config = parse("--qaccuracy-rtol=0.5", ini="qaccuracy_atol = 0.25\nqaccuracy_metrics = a b\n")
    rtol = options.given(config, OPTIONS["rtol"])
    assert rtol == ("0.5", options.Origin("--qaccuracy-rtol", "command line --qaccuracy-rtol", True))
    atol = options.given(config, OPTIONS["atol"])
    assert atol == ("0.25", options.Origin("qaccuracy_atol", "ini file tox.ini (qaccuracy_atol)", False))
    assert options.given(config, OPTIONS["metrics"])[0] == ["a", "b"]
    assert options.given(config, OPTIONS["min_sqnr"]) is None
    assert options.read_option(config, OPTIONS["min_sqnr"], float) is None
    assert options.read_option(config, OPTIONS["atol"], float)[0] == 0.25
    with pytest.raises(pytest.UsageError, match=r"^qaccuracy_atol: could not convert string to float: '0.25x'$"):
        options.read_option(config, OPTIONS["atol"], lambda v: float(v + "x"))
    with pytest.raises(pytest.UsageError, match=r"^--qaccuracy-rtol: too big$"):
        options.read_option(config, OPTIONS["rtol"], lambda v: (_ for _ in ()).throw(BadValue("rtol", "too big")))
    assert options.ini_source(config) == "ini file tox.ini"


def test_ini_source_without_a_file(parse) -> None:
    config = parse()
    assert config.inipath is None and options.ini_source(config) == "ini file"


def test_given_counts_blank_text_and_empty_lists_as_not_given() -> None:
    assert not options._given("  ") and not options._given(None) and not options._given([])
    assert options._given(" x ") and options._given(0) and options._given(False) and options._given(["a"])


def test_usage_error_reads_reason_or_text() -> None:
    assert str(options.usage_error("--f", BadValue("key", "why"))) == "--f: why"
    assert str(options.usage_error("k", ValueError("plain"))) == "k: plain"


def test_parse_bool() -> None:
    for text in ("true", " Yes ", "ON", "1", 1, True):
        assert ini.parse_bool(text) is True
    for text in ("false", "No", "off", "0", 0, False):
        assert ini.parse_bool(text) is False
    for bad in ("maybe", "", "2", None):
        with pytest.raises(ValueError, match=r"^expected true or false, got "):
            ini.parse_bool(bad)


def test_ini_text_and_lines(parse) -> None:
    config = parse(ini="qaccuracy_rtol =   0.5  \nqaccuracy_atol =\nqaccuracy_metrics = a  b\n")
    assert ini.ini_text(config, "qaccuracy_rtol") == "0.5"
    assert ini.ini_text(config, "qaccuracy_atol") is None
    assert ini.ini_lines(config, "qaccuracy_metrics") == ["a", "b"]
    assert ini.ini_lines(config, "qaccuracy_targets") == []


PYTEST_9 = pytest.version_tuple >= (9, 0)


@pytest.mark.skipif(not PYTEST_9, reason="native TOML configuration needs pytest >= 9.0")
def test_native_toml_values_are_read_from_the_file(parse) -> None:
    toml = """\
[tool.pytest]
qaccuracy_rtol = 0.5
qaccuracy_topk = 3
qaccuracy_junit_properties = false
qaccuracy_metrics = ["mse", "sqnr"]
qaccuracy_targets = ["tflite"]
"""
    bad = "qaccuracy_providers = [1, 2]\nqaccuracy_atol = [1, 2]\n"
    config = parse(toml=toml + bad)
    assert ini.ini_text(config, "qaccuracy_rtol") == 0.5
    assert ini.ini_text(config, "qaccuracy_topk") == 3
    assert ini.ini_text(config, "qaccuracy_junit_properties") is False
    assert ini.ini_lines(config, "qaccuracy_metrics") == ["mse", "sqnr"]
    with pytest.raises(pytest.UsageError, match=r"^qaccuracy_providers: "):
        ini.ini_lines(config, "qaccuracy_providers")
    with pytest.raises(pytest.UsageError, match=r"^qaccuracy_atol: "):
        ini.ini_text(config, "qaccuracy_atol")
    s = load_settings(parse(toml=toml))
    assert s.tolerances["rtol"] == Tolerance("rtol", 0.5, "ini file pyproject.toml (qaccuracy_rtol)")
    assert s.junit_properties is False and s.metrics == ("mse", "sqnr") and s.targets == ("tflite",)


def test_native_toml_outside_a_toml_file_is_missing(parse, pytester: pytest.Pytester) -> None:
    config = parse(ini="qaccuracy_rtol = 1\n")
    assert ini._native_toml(config, "qaccuracy_rtol") is ini._MISSING
    (pytester.path / "pytest.toml").write_text("[pytest]\nqaccuracy_rtol = 0.25\n")
    (pytester.path / "tox.ini").unlink()
    config = pytester.parseconfig()
    if config.inipath is not None and config.inipath.name == "pytest.toml":
        assert ini._native_toml(config, "qaccuracy_rtol") == 0.25
        assert ini._native_toml(config, "qaccuracy_atol") is ini._MISSING


def test_native_toml_of_a_broken_or_odd_file_is_missing(tmp_path: Path) -> None:
    class Config:
        def __init__(self, path):
            self.inipath = path

    broken = tmp_path / "pytest.toml"
    broken.write_text("[pytest\n")
    assert ini._native_toml(Config(broken), "x") is ini._MISSING
    odd = tmp_path / "odd" / "pyproject.toml"
    odd.parent.mkdir()
    odd.write_text('[tool]\npytest = "text"\n')
    assert ini._native_toml(Config(odd), "x") is ini._MISSING
    odd.write_text('[project]\nname = "x"\n')  # no [tool] table at all
    assert ini._native_toml(Config(odd), "x") is ini._MISSING
    odd.write_text("[tool.pytest]\nx = 4\n[pytest]\nx = 5\n")
    assert ini._native_toml(Config(odd), "x") == 4
    broken.write_text("[tool.pytest]\nx = 4\n[pytest]\nx = 5\n")
    assert ini._native_toml(Config(broken), "x") == 5
    assert ini._native_toml(Config(None), "x") is ini._MISSING
    assert ini._native_toml(Config(tmp_path / "missing.toml"), "x") is ini._MISSING
    assert ini.load_toml(broken) == {"tool": {"pytest": {"x": 4}}, "pytest": {"x": 5}}
    assert issubclass(ini.toml_decode_error(), ValueError)


def test_ini_value_reports_pytests_refusal_without_its_prefix() -> None:
    class Config:
        inipath = None

        def getini(self, name):
            raise ValueError(f"'{name}' is bad: invalid value for '{name}' expected a string")

    with pytest.raises(pytest.UsageError) as info:
        ini.ini_value(Config(), "qaccuracy_rtol")
    assert str(info.value) == "qaccuracy_rtol: expected a string"

    class Terse(Config):
        def getini(self, name):
            raise TypeError("not a string")

    with pytest.raises(pytest.UsageError) as info:
        ini.ini_value(Terse(), "qaccuracy_rtol")
    assert str(info.value) == "qaccuracy_rtol: not a string"  # a message without the key: all of it


def test_schemes_check_names_and_list_what_is_known() -> None:
    assert schemes.check_backend("integer") == "integer"
    with pytest.raises(BadValue) as info:
        schemes.check_backend("gpu")
    assert str(info.value) == "backend: unknown backend 'gpu' (known: onnxruntime, integer)"
    assert schemes.check_scheme("glow") == "glow"
    with pytest.raises(BadValue) as info:
        schemes.check_scheme("nope")
    assert str(info.value) == f"scheme: unknown scheme 'nope' (presets: {', '.join(NAMES)})"
    assert schemes.check_targets(" glow,\ttflite  glow ") == ("glow", "tflite")
    assert schemes.check_targets(["tflite"]) == ("tflite",) and schemes.check_targets(("glow",)) == ("glow",)
    assert schemes.check_targets("") == ()
    with pytest.raises(BadValue) as info:
        schemes.check_targets(["glow", "x"])
    assert str(info.value) == f"targets: unknown scheme 'x' (presets: {', '.join(NAMES)})"
    with pytest.raises(BadValue) as info:
        schemes.check_targets(3)
    assert str(info.value) == "targets: expected a list of scheme presets, got 3"


def test_schemes_take_a_preset_pinned_to_a_release_and_name_the_key_of_a_bad_pin() -> None:
    """A pin is split off before the preset is looked up; a bad one is the key's error, with the
    pin's own reason (``presets.split_release``); a name that is not a string is unknown, not a crash."""
    assert schemes.check_scheme("onnxruntime-arm64-neon@1.28") == "onnxruntime-arm64-neon@1.28"
    assert schemes.check_targets("onnxruntime-avx2@1.20 glow") == ("onnxruntime-avx2@1.20", "glow")
    with pytest.raises(BadValue) as info:
        schemes.check_scheme("onnxruntime-avx2@one")
    assert str(info.value) == (
        "scheme: 'onnxruntime-avx2@one': expected PRESET@MAJOR.MINOR, e.g. onnxruntime-arm64-neon@1.28"
    )
    with pytest.raises(BadValue) as info:
        schemes.check_targets(["glow@1.28"])
    assert str(info.value) == "targets: 'glow@1.28': only onnxruntime's presets follow its releases"
    with pytest.raises(BadValue) as info:
        schemes.check_targets([7])
    assert str(info.value) == f"targets: unknown scheme 7 (presets: {', '.join(NAMES)})"


def test_settings_are_frozen_and_where_falls_back() -> None:
    s = QAccuracySettings(
        tolerances={}, metrics=None, rules=(), max_drift=(), artifacts_dir=None, providers=(), batch_size=1,
        baseline_dir=None, save_baseline_dir=None, junit_properties=True, origins={"rtol": "--qaccuracy-rtol"},
    )  # fmt: skip
    assert s.where("rtol") == "--qaccuracy-rtol" and s.where("atol") == "qaccuracy_atol"
    with pytest.raises(AttributeError):
        s.batch_size = 2  # type: ignore[misc]
    assert argparse  # the flags are argparse's
