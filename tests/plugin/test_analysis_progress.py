"""The end-of-session sensitivity analysis shows progress on stderr, and is quiet with ``-q``."""

from __future__ import annotations

import re

import pytest

from tests.ort_features import needs_cache

from .conftest import PAIRS_MODULE


def test_analysis_progress_on_stderr_and_none_with_quiet(digits: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv("QACCURACY_PROGRESS", "1")  # stderr is no terminal here
    digits.makepyfile(test_pairs=PAIRS_MODULE)
    result = digits.runpytest("--qaccuracy-no-artifacts")
    result.assert_outcomes(passed=1, failed=1)
    err = result.stderr.str()  # "\r" splits lines here
    assert "sensitivity: 0 / 32 records" in err and "sensitivity: 32 / 32 records, " in err and " left" in err
    # each job is drawn below pytest's last line of results, erased, and the cursor goes back up
    assert err.startswith("\n") and err.endswith("\x1b[K\x1b[A")
    assert err.count(" 0 / 32 records") >= 2  # sensitivity, cumulative
    # the pair checks inside the tests too (the 300 test records), on the stderr pytest does not capture
    assert err.count("compare: 300 / 300 records, ") == 2
    assert err.count("\x1b[A") == err.count(": 0 / ")  # every job went back up when done
    assert any("sensitivity (node) of" in line for line in result.outlines)  # the analysis ran as before

    quiet = digits.runpytest("--qaccuracy-no-artifacts", "-q")
    quiet.assert_outcomes(passed=1, failed=1)
    assert "records" not in quiet.stderr.str()


#: Loaded by the xdist workers too: a plain line for every advance instead of every 30 seconds.
FAST_LOG = """
from pytest_qaccuracy.data import progress

progress.LOG_INTERVAL = 0.0
"""


def test_xdist_workers_print_plain_lines_to_a_log(digits: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.delenv("QACCURACY_PROGRESS", raising=False)
    digits.makepyfile(test_pairs=PAIRS_MODULE)
    digits.makeconftest(FAST_LOG)
    result = digits.runpytest_subprocess("--qaccuracy-no-artifacts", "-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    lines = result.stderr.lines  # the workers share the controller's stderr, a pipe here
    worker_lines = [line for line in lines if line.startswith("[gw")]
    assert worker_lines, result.stderr.str()
    assert all("\x1b" not in line and "\r" not in line for line in lines)  # plain lines, no redrawing
    # the pair checks inside the tests and the end-of-session analysis, each line naming its worker
    assert any(re.fullmatch(r"\[gw[01]\] compare: \d+ / 300 records, .* rec/s, .* left", line) for line in lines)
    assert any(re.fullmatch(r"\[gw[01]\] sensitivity: \d+ / 32 records in \d+s", line) for line in lines)

    for quiet in (["-q"], []):
        if not quiet:
            monkeypatch.setenv("QACCURACY_PROGRESS", "0")
        silent = digits.runpytest_subprocess("--qaccuracy-no-artifacts", "-n", "2", "-p", "no:cacheprovider", *quiet)
        silent.assert_outcomes(passed=1, failed=1)
        assert not [line for line in silent.stderr.lines if line.startswith("[gw")]


#: The recipe search's lines: the first note, and each finished experiment with its verified figure.
RECIPE_NOTE = "recipe: measuring the fp32 model on the evaluation records"
# the broken pair fails min_cosine (default) and min_top1_agreement: the recipe aims at both
RECIPE_STEP = re.compile(
    r"recipe: step 0 \[\w+\] .*: cost 0, cosine [\d.]+ \(onnxruntime\); "
    r"min_top1_agreement [\d.]+ \(onnxruntime\): meets the target, [\d.]+s.*"
)


@needs_cache
def test_the_recipe_search_prints_its_steps_to_a_log(digits: pytest.Pytester, monkeypatch) -> None:
    """In a log (stderr no terminal), the recipe search's steps are plain lines, as often as
    ``LOG_INTERVAL`` allows (0 here); none with ``-q`` or ``QACCURACY_PROGRESS=0``."""
    from pytest_qaccuracy.data import progress

    monkeypatch.delenv("QACCURACY_PROGRESS", raising=False)
    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.0)
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:benchmark --qaccuracy-analysis-budget=60s")  # level recipe
    digits.makepyfile(test_pairs=PAIRS_MODULE)
    result = digits.runpytest("--qaccuracy-no-artifacts")
    result.assert_outcomes(passed=1, failed=1)
    lines = result.stderr.lines
    assert all("\x1b" not in line and "\r" not in line for line in lines)  # plain lines
    assert RECIPE_NOTE in lines, result.stderr.str()
    assert any(RECIPE_STEP.fullmatch(line) for line in lines), lines
    assert any(line.startswith("  recipe meets cosine >= 0.99") for line in result.outlines)

    for flags, env in ((["-q"], None), ([], "0")):
        if env is not None:
            monkeypatch.setenv("QACCURACY_PROGRESS", env)
        silent = digits.runpytest("--qaccuracy-no-artifacts", *flags)
        silent.assert_outcomes(passed=1, failed=1)
        assert not [line for line in silent.stderr.lines if "recipe" in line]


@needs_cache
def test_xdist_workers_prefix_the_recipe_steps(digits: pytest.Pytester, monkeypatch) -> None:
    """An xdist worker's recipe lines start with its id, as its ranking's do."""
    monkeypatch.delenv("QACCURACY_PROGRESS", raising=False)
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:benchmark --qaccuracy-analysis-budget=60s")
    digits.makepyfile(test_pairs=PAIRS_MODULE)
    digits.makeconftest(FAST_LOG)
    result = digits.runpytest_subprocess("--qaccuracy-no-artifacts", "-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    lines = result.stderr.lines
    assert any(re.fullmatch(rf"\[gw[01]\] {RECIPE_NOTE}", line) for line in lines), result.stderr.str()
    assert any(line[:5] in ("[gw0]", "[gw1]") and RECIPE_STEP.fullmatch(line[6:]) for line in lines), lines


#: A cosine target the broken pair's starting recipe misses on both x86 families, and the search
#: meets within its budget on both: the start gives 0.999926 with exact sums (VNNI) and 0.998028 where
#: u8 x s8 pairs saturate (AVX2, the integer backend's ``onnxruntime-avx2``), so the search goes on for
#: several steps (at 0.9995 the start met it on VNNI hosts).
STRICT_COSINE = 0.99995
#: The broken pair with that target.
STRICT_PAIR = f"""
FP32, DATA = "models/digits_cnn.onnx", "data/digits_test.npz"


def test_broken(qaccuracy, qaccuracy_pair):
    qaccuracy.check(qaccuracy_pair(FP32, "models/digits_cnn.broken.onnx", DATA), min_cosine={STRICT_COSINE})
"""

#: A heartbeat of the end-of-session analysis of the broken pair (interval 0.5 s: "1s" or "0s" since).
HEARTBEAT = re.compile(
    r"qaccuracy: analysing digits_cnn\.broken: still working \(\ds since the last line, \d+s in all\)"
)


@needs_cache
def test_a_log_gets_every_recipe_step_and_a_heartbeat_during_a_long_one(digits: pytest.Pytester, monkeypatch) -> None:
    """In a log (stderr no terminal), every step of the recipe search (verified or estimated) is a
    line of its own however close they follow (``LOG_INTERVAL`` throttles record progress and notes
    only), and a step longer than ``LOG_INTERVAL`` (the first model written, slowed to 1.5 s here)
    gets ``still working`` lines; with ``-q``, neither."""
    import time
    from importlib import import_module

    # the modules the session will import (sys.modules'): an earlier in-process run may leave a
    # package attribute naming an older copy
    build = import_module("pytest_qaccuracy.analysis.recipe.build")
    progress = import_module("pytest_qaccuracy.data.progress")
    recipe_tables = import_module("pytest_qaccuracy.report.recipe_tables")

    monkeypatch.delenv("QACCURACY_PROGRESS", raising=False)
    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.5)
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:benchmark --qaccuracy-analysis-budget=60s")  # level recipe
    made: list[tuple[object, str]] = []  # every step the search reported, and its line
    step_line, write = recipe_tables.step_line, build.RecipeBuilder.write

    def recorded(step, best, checks):
        made.append((step, step_line(step, best, checks)))
        return made[-1][1]

    def slow_first(self, recipe, out):
        if not made:
            time.sleep(1.5)
        return write(self, recipe, out)

    monkeypatch.setattr(recipe_tables, "step_line", recorded)
    monkeypatch.setattr(build.RecipeBuilder, "write", slow_first)
    digits.makepyfile(test_pairs=STRICT_PAIR)
    result = digits.runpytest("--qaccuracy-no-artifacts")
    result.assert_outcomes(failed=1)
    lines = result.stderr.lines
    assert all("\x1b" not in line and "\r" not in line for line in lines)  # plain lines
    assert any(HEARTBEAT.fullmatch(line) for line in lines), result.stderr.str()
    verified = [line for step, line in made if not step.estimated and step.skipped is None]
    assert verified and [s.index for s, _ in made] == list(range(len(made)))  # numbered as the search's
    printed = [line for line in lines if line.startswith("recipe: step ")]
    assert printed == [line for _, line in made]  # every step, in order, none dropped
    # steps 1.. follow within 0.5 s: a throttle would drop them
    assert len(verified) >= 2 and len(made) >= 3, [line for _, line in made]
    assert any(line.startswith(f"  recipe meets cosine >= {STRICT_COSINE}") for line in result.outlines)

    made.clear()
    quiet = digits.runpytest("--qaccuracy-no-artifacts", "-q")
    quiet.assert_outcomes(failed=1)
    assert made  # the search ran
    assert not [line for line in quiet.stderr.lines if "recipe" in line or "still working" in line]
