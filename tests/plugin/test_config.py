"""Options from pytest.ini, [tool.pytest.ini_options], native TOML and the command line; bad values."""

from __future__ import annotations

import re

import pytest

#: pytest 9.0 added native TOML configuration (``pytest.toml``, ``[tool.pytest]``) and the ``strict`` ini key.
PYTEST_9 = pytest.version_tuple >= (9, 0)
native_toml = pytest.mark.skipif(not PYTEST_9, reason="native TOML configuration needs pytest >= 9.0")

#: A test that prints the tolerances in effect, so a run shows each value and its source.
SHOW = """
def test_show(qaccuracy):
    for name, tol in sorted(qaccuracy.tolerances().items()):
        value, source = tol.value, tol.source
        print(f"TOL {name}={value!r} from {source}")
"""


def _tolerances(result: pytest.RunResult) -> dict[str, str]:
    found = {}
    for line in result.outlines:
        if "TOL " in line:
            name, rest = line[line.index("TOL ") + 4 :].split("=", 1)
            found[name] = rest
    return found


def test_pytest_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nqaccuracy_min_cosine = 0.995\nqaccuracy_topk = 5\nqaccuracy_max_top1_drop = 5e-3\n")
    pytester.makepyfile(SHOW)
    result = pytester.runpytest("-s")
    assert result.ret == 0
    tol = _tolerances(result)
    assert tol["min_cosine"] == "0.995 from ini file tox.ini (qaccuracy_min_cosine)"
    assert tol["topk"] == "5 from ini file tox.ini (qaccuracy_topk)"
    assert tol["max_top1_drop"].startswith("0.005 from")


def test_pyproject_ini_options(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nqaccuracy_min_sqnr = "25"\nqaccuracy_atol = 1e-3\n')
    pytester.makepyfile(SHOW)
    tol = _tolerances(pytester.runpytest("-s"))
    assert tol["min_sqnr"] == "25.0 from ini file pyproject.toml (qaccuracy_min_sqnr)"
    assert tol["atol"].startswith("0.001 from")
    assert tol["min_cosine"] == "0.99 from default"


@native_toml
def test_native_toml_and_cli_override(pytester: pytest.Pytester) -> None:
    pytester.maketoml(
        "[pytest]\nqaccuracy_min_cosine = 1\nqaccuracy_rtol = 0.02\nqaccuracy_tolerances = ['* sqnr>=2']\n"
    )
    pytester.makepyfile(SHOW)
    tol = _tolerances(pytester.runpytest("-s", "--qaccuracy-rtol=0.5"))
    assert tol["min_cosine"] == "1.0 from ini file pytest.toml (qaccuracy_min_cosine)"
    assert tol["rtol"] == "0.5 from command line --qaccuracy-rtol"


def test_marker_and_check_arguments_win(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nqaccuracy_min_cosine = 0.9\n")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.qaccuracy(min_cosine=0.95)
        def test_marker(qaccuracy):
            assert qaccuracy.tolerances()["min_cosine"].value == 0.95
            assert qaccuracy.tolerances()["min_cosine"].source == "marker @pytest.mark.qaccuracy(min_cosine=...)"
            assert qaccuracy.tolerances(min_cosine=0.99)["min_cosine"].value == 0.99
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            "[pytest]\nqaccuracy_max_top1_drop = 5%\n",
            "ERROR: qaccuracy_max_top1_drop: expected a number, got '5%' (write a fraction: 0.005, not 0.5%)",
        ),
        ("[pytest]\nqaccuracy_rtol = 0.02  # relative\n", "inline comments are not supported"),
        ("[pytest]\nqaccuracy_min_cosine = 1.5\n", "qaccuracy_min_cosine: must be between 0 and 1"),
        ("[pytest]\nqaccuracy_topk = five\n", "qaccuracy_topk: expected"),
        ("[pytest]\nqaccuracy_tolerances =\n    * sqnr=>20\n", "qaccuracy_tolerances: bad tolerance rule"),
        ("[pytest]\nqaccuracy_max_drift = sqnr:lots\n", "qaccuracy_max_drift: bad drift rule"),
        ("[pytest]\nqaccuracy_batch_size = 0\n", "qaccuracy_batch_size: expected an integer >= 1"),
        ("[pytest]\nqaccuracy_batch_size = 8.5\n", "qaccuracy_batch_size: expected an integer >= 1, got '8.5'"),
        ("[pytest]\nqaccuracy_sensitivity_top = many\n", "qaccuracy_sensitivity_top: expected an integer >= 1"),
        (
            "[pytest]\nqaccuracy_junit_properties = maybe\n",
            "ERROR: qaccuracy_junit_properties: expected true or false, got 'maybe'",
        ),
        ("[pytest]\nqaccuracy_backend = tpu\n", "qaccuracy_backend: unknown backend 'tpu'"),
    ],
    ids=[
        *("percent", "inline-comment", "out-of-range", "int", "rule", "drift", "batch-size", "batch-size-float"),
        *("sensitivity-top", "bool", "backend"),
    ],
)
def test_bad_ini_value_is_a_usage_error(pytester: pytest.Pytester, config: str, expected: str) -> None:
    pytester.makefile(".ini", pytest=config)
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1 and expected in errors[0], result.errlines
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@native_toml
def test_native_toml_string_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.maketoml('[pytest]\nqaccuracy_min_sqnr = "20 dB"\n')
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert any(line.startswith("ERROR: qaccuracy_min_sqnr:") for line in result.errlines)
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@native_toml
@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("qaccuracy_junit_properties = 1.5", "ERROR: qaccuracy_junit_properties: expected true or false, got 1.5"),
        ("qaccuracy_batch_size = true", "ERROR: qaccuracy_batch_size: expected an integer >= 1, got True"),
        ("qaccuracy_topk = 2.5", "ERROR: qaccuracy_topk: expected an integer, got '2.5'"),
        (
            "qaccuracy_tolerances = '* sqnr>=2'",
            "ERROR: qaccuracy_tolerances: expected a list of strings, got '* sqnr>=2'",
        ),
    ],
    ids=["bool", "int", "topk", "list"],
)
def test_bad_native_toml_value_is_a_usage_error(pytester: pytest.Pytester, toml: str, expected: str) -> None:
    pytester.maketoml(f"[pytest]\n{toml}\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert [line for line in result.errlines if line.startswith("ERROR:")] == [expected], result.errlines


@native_toml
def test_native_toml_numbers_booleans_and_strings(pytester: pytest.Pytester) -> None:
    """pytest refuses a native number for a string key; the plugin reads it from the file itself."""
    pytester.maketoml(
        "[pytest]\nqaccuracy_min_sqnr = 20\nqaccuracy_atol = '0.5'\nqaccuracy_batch_size = 4\n"
        "qaccuracy_junit_properties = false\nqaccuracy_sensitivity_top = 3\n"
    )
    pytester.makepyfile(
        """
        def test_show(qaccuracy, pytestconfig):
            from pytest_qaccuracy.plugin.fixtures import session_key

            s = pytestconfig.stash[session_key].settings
            print("SET", s.batch_size, s.junit_properties, s.sensitivity_top)
        """
        + SHOW.replace("test_show", "test_tol")
    )
    result = pytester.runpytest("-s")
    assert result.ret == 0, result.outlines
    result.stdout.fnmatch_lines(["*SET 4 False 3*"])
    tol = _tolerances(result)
    assert tol["min_sqnr"] == "20.0 from ini file pytest.toml (qaccuracy_min_sqnr)"
    assert tol["atol"] == "0.5 from ini file pytest.toml (qaccuracy_atol)"


def test_pytest_converts_no_option(pytester: pytest.Pytester) -> None:
    """Every ini key is a string or a list of strings, so the plugin, not pytest, parses and reports."""
    result = pytester.runpytest("--help")
    kinds = dict(re.findall(r"^\s+(qaccuracy_\w+) \((\w+)\):", result.stdout.str(), flags=re.M))
    assert len(kinds) > 20
    assert set(kinds.values()) <= {"string", "linelist", "args"}, kinds


def test_bad_cli_value_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--qaccuracy-min-cosine=high")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --qaccuracy-min-cosine: expected a number, got 'high'"])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--qaccuracy-backend=tpu",), "ERROR: --qaccuracy-backend: unknown backend 'tpu' (known: onnxruntime, "),
        (("--qaccuracy-scheme=x87",), "ERROR: --qaccuracy-scheme: unknown scheme 'x87' (presets: onnxruntime, "),
        (("--qaccuracy-targets=tflite,x87",), "ERROR: --qaccuracy-targets: unknown scheme 'x87' (presets: "),
        (("--qaccuracy-tolerance=* sqnr=>20",), "ERROR: --qaccuracy-tolerance: bad tolerance rule '* sqnr=>20'"),
        (("--qaccuracy-max-drift=sqnr:lots",), "ERROR: --qaccuracy-max-drift: bad drift rule"),
        (("--qaccuracy-topk=0",), "ERROR: --qaccuracy-topk: must be >= 1, got 0"),
        (("--qaccuracy-sensitivity-records=-2",), "ERROR: --qaccuracy-sensitivity-records: expected an integer >= 0"),
    ],
    ids=["backend", "scheme", "targets", "rule", "drift", "topk", "sensitivity-records"],
)
def test_bad_cli_value_names_the_flag(pytester: pytest.Pytester, args: tuple[str, ...], expected: str) -> None:
    """The same values in the ini file name the ini key (test_bad_ini_value_is_a_usage_error)."""
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1 and errors[0].startswith(expected), result.errlines


def test_a_blank_cli_value_leaves_the_ini_value(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nqaccuracy_min_cosine = 0.5\n")
    pytester.makepyfile(SHOW)
    tol = _tolerances(pytester.runpytest("-s", "--qaccuracy-min-cosine="))
    assert tol["min_cosine"] == "0.5 from ini file tox.ini (qaccuracy_min_cosine)"


def test_help_lists_options_and_writes_nothing(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*quantization accuracy regression testing*", "*--qaccuracy-baseline=DIR*"])
    result.stdout.fnmatch_lines(["*qaccuracy_tolerances (linelist)*"])
    assert not (pytester.path / ".qaccuracy").exists()


def test_every_option_is_declared_from_the_table(pytester: pytest.Pytester) -> None:
    """Each ``OPTIONS`` entry's flag and ini key are in ``--help`` with their help, and no other
    ``--qaccuracy-*`` flag or ``qaccuracy_*`` key is: every declaration comes from the table."""
    from pytest_qaccuracy.plugin.settings import OPTIONS

    result = pytester.runpytest("--help")
    out = result.stdout.str()
    flags = set(re.findall(r"^  (--qaccuracy-[a-z0-9-]+)", out, re.MULTILINE))
    keys = set(re.findall(r"^  (qaccuracy_[a-z0-9_]+) \(", out, re.MULTILINE))
    assert flags == {o.flag for o in OPTIONS.values() if o.flag}
    assert keys == {o.ini for o in OPTIONS.values() if o.ini}
    text = re.sub(r"\s+", "", out)  # the help is wrapped: compare without whitespace
    for option in OPTIONS.values():
        if option.flag:
            shown = option.flag + (f"={option.metavar}" if option.metavar else "") + option.help.replace("%%", "%")
            assert re.sub(r"\s+", "", shown) in text
        if option.ini:
            assert re.sub(r"\s+", "", f"{option.ini} ({option.ini_type}):{option.ini_help or option.help}") in text


def test_report_header(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nqaccuracy_min_sqnr = 20\nqaccuracy_tolerances = *::* sqnr>=10\n")
    result = pytester.runpytest("-v", "--qaccuracy-tolerance=* cosine>=0.9")
    result.stdout.fnmatch_lines(["qaccuracy: min_cosine=0.99, min_sqnr=20, topk=1; rules: 2; artifacts: *.qaccuracy"])


def test_markers_listed(pytester: pytest.Pytester) -> None:
    pytester.runpytest("--markers").stdout.fnmatch_lines(["@pytest.mark.qaccuracy(fp32=None, quantized=None*"])


def test_disabled_plugin(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:benchmark")  # no --qaccuracy-* flags: the plugin is off
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.qaccuracy(min_cosine=0.9)
        def test_x(qaccuracy):
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:qaccuracy", "--strict-markers")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*'qaccuracy' not found in `markers` configuration option*"])
    result = pytester.runpytest_subprocess("-p", "no:qaccuracy")
    result.stdout.fnmatch_lines(["*fixture 'qaccuracy' not found*"])


def test_strict_markers_and_warnings_as_errors(digits: pytest.Pytester) -> None:
    # pytest 9's `strict` key turns on strict markers and config; before 9 each has its own flag
    strict = "strict = true" if PYTEST_9 else "addopts = --strict-markers --strict-config"
    digits.makeini(f"[pytest]\nfilterwarnings = error\n{strict}\njunit_family = xunit2\n")
    digits.makefile(
        ".toml",
        qaccuracy_models='[pairs.a]\nfp32 = "models/digits_cnn.onnx"\n'
        'quantized = "models/digits_cnn.qoperator.onnx"\ndata = "data/digits_test.npz"\n',
    )
    digits.makepyfile(
        """
        import pytest

        @pytest.mark.qaccuracy(fp32="models/digits_cnn.onnx", quantized="models/digits_cnn.qdq.onnx",
                               data="data/digits_test.npz", min_cosine=0.9, rtol=1.0, atol=1.0, max_top1_drop=0.01)
        def test_x(qaccuracy):
            qaccuracy.check()
        """
    )
    result = digits.runpytest("--junitxml=out.xml", "--qaccuracy-baseline=base", "--qaccuracy-update-all-baselines")
    result.assert_outcomes(passed=3, warnings=0)
    digits.runpytest("--qaccuracy-baseline=base").assert_outcomes(passed=3, warnings=0)


def test_unknown_marker_key_names_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.qaccuracy(rtl=0.1)
        def test_typo(qaccuracy):
            pass

        @pytest.mark.qaccuracy(min_cosine="high")
        def test_bad_value(qaccuracy):
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*@pytest.mark.qaccuracy: unknown key 'rtl' (known: fp32, *"])
    result.stdout.fnmatch_lines(["*min_cosine: expected a number, got 'high'*"])


@native_toml
def test_pyproject_native_toml(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml(
        '[tool.pytest]\nqaccuracy_max_top1_drop = 0.005\nqaccuracy_topk = 5\nqaccuracy_metrics = ["mse"]\n'
    )
    pytester.makepyfile(SHOW)
    tol = _tolerances(pytester.runpytest("-s"))
    assert tol["max_top1_drop"] == "0.005 from ini file pyproject.toml (qaccuracy_max_top1_drop)"
    assert tol["topk"] == "5 from ini file pyproject.toml (qaccuracy_topk)"


def test_command_line_rules_beat_ini_rules_after_comment_lines(digits: pytest.Pytester) -> None:
    """docs/pytest.md: on a specificity tie the later line wins, and ``--qaccuracy-tolerance`` lines come
    after the ini ones. Comment lines in the ini list must not push the ini rule past them."""
    digits.makepyprojecttoml('[tool.pytest.ini_options]\nqaccuracy_tolerances = ["# note", "# note", "*::* sqnr>=1"]\n')
    digits.makepyfile(
        """
        ARGS = ("models/digits_cnn.onnx", "models/digits_cnn.qdq.onnx", "data/digits_test.npz")

        def test_layers(qaccuracy, qaccuracy_pair):
            qaccuracy.check(qaccuracy_pair(*ARGS))
        """
    )
    assert digits.runpytest().ret == 0  # every layer is above 1 dB: the ini rule alone passes
    result = digits.runpytest("--qaccuracy-tolerance=*::* sqnr>=200")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E       Tolerance from: command line --qaccuracy-tolerance, rule '*::* sqnr>=200'"])
    result.stdout.no_fnmatch_line("*rule '*::* sqnr>=1'*")
