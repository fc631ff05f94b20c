"""Mutation testing of the modules where a silent bug would mislead users.

Runs mutmut 3 (``pip install -e ".[mutation]"``) once per group below, each in its own copy of the
work tree under a temporary folder, so no mutated file ever lands in the work tree. Each group pairs
the modules to mutate with the test files that exercise them; mutmut then runs, for each mutant, only
those of the group's tests that call the mutated function. Prints the score per module and fails if a
module falls below ``--fail-under``.

    python scripts/mutation.py                       # every group, about an hour on 2 cores
    python scripts/mutation.py --group rules atomic  # some groups
    python scripts/mutation.py --survivors           # also print each surviving mutant's diff
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "pytest_qaccuracy"


@dataclass(frozen=True)
class Group:
    """Modules mutated together and the test files that exercise them."""

    modules: tuple[str, ...]
    tests: tuple[str, ...]


GROUPS: dict[str, Group] = {
    "metrics": Group(
        ("metrics/*",),
        (
            "tests/test_metrics.py",
            "tests/test_metric_edges.py",
            "tests/test_score_layout.py",
            "tests/test_channel_spans.py",
            "tests/test_assertions.py",
            "tests/plugin/test_outputs.py",
            # the task metrics (ctc.py, detection.py, binary.py, task.py) joined metrics/ after the group
            "tests/test_task_metrics.py",
        ),
    ),
    "assertions": Group(("assertions.py",), ("tests/test_assertions.py", "tests/test_assertion_messages.py")),
    # onnxruntime presets pinned to a release (onnxruntime-arm64-neon@1.28), read by every name checker
    "presets": Group(("presets.py",), ("tests/test_presets.py",)),
    "data": Group(
        ("data/*",),
        (
            "tests/test_data.py",
            "tests/test_data_windows.py",
            "tests/test_data_layout_errors.py",
            "tests/test_data_budget.py",
            "tests/test_data_errors.py",
            "tests/test_progress.py",
            # the targets of task metrics (data/targets.py, the readers' targets()) joined data/ after the group
            "tests/test_data_targets.py",
        ),
    ),
    "rules": Group(
        ("tolerances.py",),
        (
            "tests/plugin/test_rules.py",
            "tests/plugin/test_rules_edges.py",
            "tests/plugin/test_rules_slices.py",
            "tests/test_cli_gate.py",
            "tests/test_error_paths.py",
        ),
    ),
    "checks": Group(
        ("analysis/checks.py", "plugin/checks.py", "outcomes.py"),
        ("tests/plugin/test_checks.py", "tests/plugin/test_records.py", "tests/test_outcomes.py"),
    ),
    "baseline": Group(
        ("report/baseline.py",), ("tests/report/test_baseline_load.py", "tests/report/test_baseline_units.py")
    ),
    "atomic": Group(("atomic.py",), ("tests/report/test_atomic_writers.py", "tests/report/test_atomic_edges.py")),
    "matching": Group(
        ("model/matching.py",), ("tests/test_matching.py", "tests/test_matching_edges.py", "tests/test_pair.py")
    ),
    "calibration": Group(
        (
            "analysis/calibration/qdq_params.py",
            "analysis/calibration/auto.py",
            "analysis/calibration/probe.py",
            "analysis/calibration/quantize.py",
        ),
        (
            "tests/analysis/test_calibration_auto.py",
            "tests/analysis/test_calibration.py",
            "tests/analysis/test_calibration_opset.py",
            "tests/analysis/test_calibration_units.py",
            "tests/analysis/test_calibration_auto_units.py",
            "tests/analysis/test_calibration_probe.py",
            "tests/analysis/test_calibration_quantize.py",
        ),
    ),
    "commands": Group(
        ("commands/*", "cli.py"),
        (
            "tests/test_cli.py",
            "tests/test_command_plumbing.py",
            "tests/report/test_report_command.py",
            "tests/report/test_report_command_units.py",
            "tests/backend/test_cli_run_units.py",
        ),
    ),
    "settings": Group(
        ("plugin/settings.py", "plugin/options.py", "plugin/ini.py", "plugin/schemes.py"),
        ("tests/plugin/test_settings_units.py",),
    ),
    "plugin": Group(
        ("plugin/records.py", "plugin/pairs.py", "plugin/properties.py", "plugin/baselines.py", "plugin/artifacts.py"),
        (
            "tests/plugin/test_records.py",
            "tests/plugin/test_records_units.py",
            "tests/plugin/test_properties_units.py",
            "tests/plugin/test_baselines_units.py",
            "tests/plugin/test_artifacts_units.py",
            "tests/plugin/test_summary.py",
        ),
    ),
    "suite": Group(
        ("plugin/suite.py",),
        (
            "tests/plugin/test_suite_units.py",
            # the plugin's own hooks (is_suite on every file) stay out of the outer session: mutated,
            # they would break its collection; the tests' in-process sessions load the plugin
            "-p",
            "no:qaccuracy",
        ),
    ),
    "progress": Group(
        ("plugin/progress.py",),
        (
            "tests/plugin/test_progress_units.py",
            # the outer session keeps the plugin's hooks off: its SessionProgress, mutated, would fail
            # every test (or mutmut's forced-fail check); the tests call the module directly
            "-p",
            "no:qaccuracy",
        ),
    ),
    "fixtures": Group(
        ("plugin/fixtures.py",),
        ("tests/plugin/test_fixtures_units.py", "-p", "no:qaccuracy"),  # as the progress group: hooks off
    ),
    "session": Group(
        ("plugin/session.py",),
        ("tests/plugin/test_session_units.py", "-p", "no:qaccuracy"),  # as the progress group: hooks off
    ),
    "plugin_sensitivity": Group(
        ("plugin/sensitivity.py",),
        ("tests/plugin/test_plugin_sensitivity_units.py", "-p", "no:qaccuracy"),
    ),
    "hooks": Group(
        ("plugin/__init__.py",),
        ("tests/plugin/test_hooks_units.py", "-p", "no:qaccuracy"),
    ),
    "declarations": Group(
        ("errors.py", "task_names.py", "defaults.py"),
        ("tests/plugin/test_rules_edges.py",),
    ),
    "summary": Group(
        ("report/summary.py", "report/verdicts.py", "report/tables.py"),
        ("tests/report/test_summary_units.py", "tests/report/test_tables.py"),
    ),
    "runtime": Group(
        ("runtime/*", "ort_session.py"),
        (
            "tests/test_runtime_units.py",
            "tests/test_ort_session.py",
            "tests/analysis/test_reduced_compare.py",
        ),
    ),
    "model": Group(
        (
            "model/batch.py",
            "model/cut.py",
            "model/graph.py",
            "model/loading.py",
            "model/pair.py",
            "model/quant_params.py",
        ),
        (
            "tests/test_model_units.py",
            "tests/test_pair.py",
            "tests/test_quantized_types.py",
            "tests/backend/test_fixed_batch.py",
            "tests/analysis/test_sensitivity_cut.py",
        ),
    ),
    "graphs": Group(
        (
            "report/visq.py",
            "report/dot.py",
            "report/graph.py",
            "report/layout.py",
            "report/drawing.py",
            "report/_palette.py",
        ),
        (
            "tests/report/test_visq.py",
            "tests/report/test_dot.py",
            "tests/report/test_graph.py",
            "tests/report/test_graph_units.py",
            "-k",
            "not browser",  # the headless browser tests are slow and their page runs outside the trace
        ),
    ),
    "ranges": Group(
        (
            "analysis/calibration/ranges.py",
            "analysis/calibration/observers.py",
            "analysis/calibration/candidates.py",
            "analysis/calibration/calibrator.py",
            "analysis/calibration/options.py",
            "analysis/calibration/reader.py",
            "analysis/calibration/cache.py",
        ),
        (
            "tests/analysis/test_calibration.py",
            "tests/analysis/test_calibration_ranges.py",
            "tests/analysis/test_calibration_opset.py",
            "tests/analysis/test_calibration_units.py",
        ),
    ),
    "writers": Group(
        (
            "report/html.py",
            "report/html_data.py",
            "report/publish.py",
            "report/artifacts.py",
            "report/completeness.py",
            "report/environment.py",
            "report/terminal.py",
            "report/recipe_tables.py",
            "report/sensitivity_tables.py",
            "report/sensitivity_summary.py",
        ),
        (
            "tests/report/test_artifacts.py",
            "tests/report/test_publish.py",
            "tests/report/test_html.py",
            "tests/report/test_completeness.py",
            "tests/report/test_summary_units.py",
            "tests/test_numbers.py",
            "tests/analysis/test_sensitivity_roundtrip.py",
            "tests/analysis/test_recipe_aims.py",
            "tests/report/test_writer_units.py",
            "-k",
            "not browser",  # the headless browser tests are slow and their page runs outside the trace
        ),
    ),
    "arith": Group(
        ("backend/arith.py",),
        (
            "tests/backend/test_arith.py",
            "tests/backend/test_arith_quantize.py",
            "tests/backend/test_arith_edges.py",
            "tests/backend/test_fixed_point.py",
            "tests/backend/test_pairs.py",
        ),
    ),
    "core": Group(
        ("plain.py", "numbers.py"),
        ("tests/test_plain.py", "tests/test_numbers.py"),
    ),
    "analysis": Group(
        (
            "analysis/results.py",
            "analysis/slices.py",
            "analysis/deadline.py",
            "analysis/task.py",
            "analysis/task_sweep.py",
            "analysis/sensitivity_report.py",
            "analysis/reference_cache.py",
            "analysis/cumulative.py",
            "analysis/sweep.py",
        ),
        (
            "tests/analysis/test_slices.py",
            "tests/analysis/test_deadline.py",
            "tests/analysis/test_reference_cache.py",
            "tests/analysis/test_cumulative.py",
            "tests/analysis/test_sensitivity_roundtrip.py",
            "tests/analysis/test_sensitivity.py",
            "tests/report/test_baseline_units.py",
            "tests/analysis/test_analysis_units.py",
        ),
    ),
    "pairs": Group(
        ("backend/pairs.py", "backend/neon_pairs.py"),
        (
            "tests/backend/test_pairs.py",
            "tests/backend/test_goldens.py",
            "tests/backend/test_arm64_goldens.py",
            "tests/backend/test_conv_ort.py",
            "tests/analysis/test_saturation.py",
            "tests/backend/test_pairs_units.py",
        ),
    ),
    "interpreter": Group(
        ("backend/interpreter.py", "backend/fusion.py", "backend/fallback.py", "backend/agreement.py"),
        (
            "tests/backend/test_interpreter.py",
            "tests/backend/test_fallback.py",
            "tests/backend/test_default_session.py",
            "tests/backend/test_agreement_outputs.py",
            "tests/backend/test_dataset_agreement.py",
            "tests/analysis/test_agreement_pass.py",
            "tests/backend/test_ort_qdq.py",
            "tests/backend/test_ort_qoperator.py",
            "tests/backend/test_heap.py",
            "tests/backend/test_weight_groups.py",
            "tests/backend/test_cli_run_units.py",
            "tests/backend/test_interpreter_units.py",
        ),
    ),
    "comparison": Group(
        (
            "analysis/compare.py",
            "analysis/outputs.py",
            "analysis/partial.py",
            "analysis/agreement_pass.py",
        ),
        (
            "tests/test_compare.py",
            "tests/analysis/test_agreement_pass.py",
            "tests/analysis/test_topk_outputs.py",
            "tests/analysis/test_reduced_compare.py",
            "tests/analysis/test_sensitivity.py",
            "tests/test_task_metrics.py",
            "tests/analysis/test_comparison_units.py",
            "tests/analysis/test_compare_pass.py",
            "-k",
            # these two start a fresh Python process, outside the trace
            "not memory_is_flat and not never_imports_pytest",
        ),
    ),
    "recipe": Group(
        (
            "analysis/recipe/aims.py",
            "analysis/recipe/build.py",
            "analysis/recipe/checks.py",
            "analysis/recipe/cost.py",
            "analysis/recipe/edit.py",
            "analysis/recipe/estimate.py",
            "analysis/recipe/measure.py",
            "analysis/recipe/pair.py",
            "analysis/recipe/space.py",
        ),
        (
            "tests/analysis/test_recipe.py",
            "tests/analysis/test_recipe_aims.py",
            "tests/analysis/test_recipe_edit.py",
            "tests/analysis/test_recipe_global.py",
            "tests/analysis/test_recipe_joint.py",
            "tests/analysis/test_recipe_nodes.py",
            "tests/analysis/test_recipe_refusal.py",
            "tests/analysis/test_recipe_targets.py",
            "tests/analysis/test_recipe_weights.py",
            "tests/analysis/test_recipe_units.py",
            "tests/analysis/test_recipe_pair_units.py",
            "tests/analysis/test_recipe_estimate_units.py",
            "tests/analysis/test_recipe_measure_units.py",
            "tests/analysis/test_recipe_build_units.py",
            "tests/plugin/test_analysis_budget.py",
        ),
    ),
    # the search itself, on its unit tests alone (the files above run whole searches: seconds a mutant)
    "recipe_search": Group(
        ("analysis/recipe/search.py",),
        ("tests/analysis/test_recipe_search_units.py", "tests/analysis/test_recipe_nodes.py"),
    ),
    "sensitivity": Group(
        (
            "analysis/sensitivity.py",
            "analysis/experiments.py",
            "analysis/saturation.py",
            "analysis/reduced_compare.py",
        ),
        (
            "tests/analysis/test_sensitivity.py",
            "tests/analysis/test_sensitivity_attention.py",
            "tests/analysis/test_sensitivity_cut.py",
            "tests/analysis/test_sensitivity_graphs.py",
            "tests/analysis/test_saturation.py",
            "tests/analysis/test_reduced_compare.py",
            "tests/analysis/test_deadline.py",
            "tests/analysis/test_one_pass.py",
            "tests/analysis/test_reference_cache.py",
            "tests/analysis/test_analysis_units.py",
            "tests/analysis/test_cli_sensitivity.py",
            "tests/analysis/test_sensitivity_units.py",
            "-k",
            # starts a fresh Python process, outside the trace
            "not memory_is_flat",
        ),
    ),
    "kernels": Group(
        (
            "backend/kernels/pool.py",
            "backend/kernels/tensor.py",
            "backend/kernels/elementwise.py",
            "backend/kernels/quantize.py",
            "backend/kernels/softmax.py",
            "backend/kernels/matmul.py",
        ),
        (
            "tests/backend/test_pool_grid.py",
            "tests/backend/test_float_kernels.py",
            "tests/backend/test_conformance.py",
            "tests/backend/test_reference_preset.py",
            "tests/backend/test_tables.py",
            "tests/backend/test_goldens.py",
            "tests/backend/test_ort_qdq.py",
            "tests/backend/test_ort_qoperator.py",
            "tests/backend/test_arm64_goldens.py",
            "tests/backend/test_kernel_units.py",
            "tests/backend/test_pairs.py",  # the pair oracle: integer_matmul's batched AVX2 path
            "tests/backend/test_kernel_values.py",
        ),
    ),
    "conv": Group(
        (
            "backend/kernels/conv.py",
            "backend/kernels/conv_core.py",
            "backend/kernels/conv_chunks.py",
            "backend/kernels/conv_depthwise.py",
            "backend/kernels/conv_gemm.py",
            "backend/kernels/conv_ort.py",
            "backend/kernels/neon.py",
        ),
        (
            "tests/backend/test_conv_units.py",
            "tests/backend/test_conv_paths.py",
            "tests/backend/test_conv_ort.py",
            "tests/backend/test_pairs.py",  # the pair oracle: AVX2 saturation through the conv paths
            "tests/backend/test_goldens.py",
            "tests/backend/test_arm64_goldens.py",
            "tests/backend/test_reference_preset.py",
        ),
    ),
    "conv_pairs": Group(
        ("backend/kernels/conv_pairs.py",),
        (
            "tests/backend/test_pairs.py",  # the pair oracle of convolutions
            "tests/backend/test_conv_paths.py",
            "tests/backend/test_conv_units.py",
            "tests/backend/test_goldens.py",
            "tests/backend/test_pairs_units.py",
            "tests/backend/test_conv_ort.py",
            "tests/backend/test_conv_pairs_units.py",
        ),
    ),
    "scheme": Group(
        (
            "backend/scheme.py",
            "backend/registry.py",
            "backend/host.py",
            "backend/heap.py",
            "backend/parallel.py",
            "backend/tables.py",
            "backend/graph.py",
            "backend/int8_to_uint8.py",
            "backend/weight_groups.py",
            "backend/weight_quantization.py",
        ),
        (
            "tests/backend/test_heap.py",
            "tests/backend/test_parallel.py",
            "tests/backend/test_tables.py",
            "tests/backend/test_weight_groups.py",
            "tests/backend/test_interpreter.py",
            "tests/backend/test_default_session.py",
            "tests/backend/test_kernel_units.py",
            "tests/backend/test_fallback.py",
            "tests/backend/test_ort_qdq.py",
            "tests/backend/test_ort_qoperator.py",
            "tests/backend/test_arith_edges.py",
            "tests/backend/test_reference_preset.py",
            "tests/backend/test_agreement_outputs.py",
            "tests/backend/test_scheme_units.py",
            # a preset pinned to an onnxruntime release (get_scheme, for_onnxruntime): 75.9 % without it
            "tests/test_presets.py",
        ),
    ),
}

# mutmut's exit-code verdicts (mutmut/stats.py); a timeout means the tests noticed the mutant
KILLED = {"killed", "timeout", "caught by type check"}
STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    37: "caught by type check",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
    None: "not checked",
}


#: Surviving mutants that cannot change what a user sees: (regex over the removed line(s), its
#: replacement, reason). A mutant whose added line(s) equal the removed ones so rewritten is
#: counted as equivalent, apart from the score. docs/testing.md explains each one.
EQUIVALENT: list[tuple[str, str, str]] = [
    (r"\.reshape\(([^()]*?)-1\b", r".reshape(\1-2", "numpy reads any negative size in reshape as 'the rest'"),
    (r'kind="stable"', 'kind="STABLE"', "numpy reads the sort kind case-insensitively"),
    (r'float\("nan"\)', 'float("NAN")', "float() reads 'nan' case-insensitively"),
    (r"\.astype\(np\.float64\)", ".astype(None)", "numpy's astype(None) is astype(float64)"),
    (r'"utf-8"', '"UTF-8"', "codec names are case-insensitive"),
    (
        r"copy\.deepcopy\((qdq|written|self\.base_model)\)",
        r"copy.copy(\1)",
        "copy.copy of a protobuf message copies it whole",
    ),
    (
        r'\.kind (in|not in) "(\w+)"',
        r'.kind \1 "XX\2XX"',
        "a dtype kind is one letter, never X: 'i' in 'iu' as in 'XXiuXX'",
    ),
    (
        r"sys\.version_info >= \((\d+), (\d+)\)",
        r"sys.version_info > (\1, \2)",
        "sys.version_info has five fields, so it never equals a pair: (3, 11, 0, ...) > (3, 11)",
    ),
    *[
        (r'tablefmt="simple", ', new, "tabulate's default format is 'simple', and it reads an unknown name as 'simple'")
        for new in ('tablefmt="XXsimpleXX", ', 'tablefmt="SIMPLE", ', "tablefmt=None, ", "")
    ],
    # argparse options (one line each, or the line of a call spread over lines; no other call in the
    # package has a line that is only `default=None,`)
    (r'((?:^"--|add_argument\()[^\n]*?)default=None, ', r"\1", "an argparse option's default is None already"),
    (r"^default=None,$", "", "an argparse option's default is None already"),
    (r"\.rsplit\(([^()]*), 1\)\[-1\]", r".rsplit(\1, )[-1]", "the last piece of rsplit is the same for any maxsplit"),
    (r"\.rsplit\(([^()]*), 1\)\[-1\]", r".rsplit(\1, 2)[-1]", "the last piece of rsplit is the same for any maxsplit"),
    # runtime: the batching probe, the runners' zips and the merged graph's shortcuts
    (r"Batch\(batch\.start, (batch\.records\[:2\])\)", r"Batch(None, \1)", "the probe's start is never read"),
    (r"(zip\(self\.\w+, [^()]*), strict=True\)", r"\1, strict=False)", "one array per name: zip lengths agree"),
    (r"(zip\(self\.\w+, [^()]*), strict=True\)", r"\1, strict=None)", "one array per name: zip lengths agree"),
    (r"(zip\(self\.\w+, [^()]*), strict=True\)", r"\1, )", "one array per name: zip lengths agree"),
    (r"parts\[0\]\[i\]\.copy\(\)", "parts[1][i].copy()", "a batch's records share their shapes"),
    (r"(np\.concatenate\(.*), axis=0\)", r"\1, )", "np.concatenate's axis defaults to 0"),
    (r"self\.tensors, False\)\)", "self.tensors, None))", "_with_outputs reads its flag only by truth"),
    (r"\.max\(initial=0\) <= 1", ".max(initial=1) <= 1", "|differences| >= 0: initial 0 or 1, the same verdict"),
    (r"lows is None or highs is None", "lows is None and highs is None", "extremes are reduced in pairs: both or none"),
    (r"\(a\.shape == b\.shape and", "(a.shape != b.shape and", "_same's equality is a shortcut: _close decides alone"),
    (r"array_equal\(a, b\)\) or", "array_equal(None, b)) or", "_same's equality is a shortcut: _close decides alone"),
    (r"array_equal\(a, b\)\) or", "array_equal(a, None)) or", "_same's equality is a shortcut: _close decides alone"),
    # model: zips over lists whose lengths were compared just before, protobuf and numpy defaults
    *[
        (r"zip\((f, q|a\.shape, b\.shape), strict=True\)", rf"zip(\1, {new})", "lengths compared before: zip agrees")
        for new in ("strict=False", "strict=None", "")
    ],
    (r"copy\.deepcopy\(model\)", "copy.copy(model)", "copy.copy of a protobuf message copies it whole"),
    (
        r'if value\.type\.tensor_type\.HasField\("shape"\) else \[\]',
        'if (value.type.tensor_type.HasField("shape")) or True else []',
        "an unset protobuf shape reads as no dimensions, as [] does",
    ),
    (r"load_external_data=False\)", "load_external_data=None)", "onnx.load reads the flag for its truth"),
    (
        r"view\.constant\(zero_point\) if zero_point else None",
        "view.constant(zero_point) if (zero_point) or True else None",
        "GraphView.constant of '' or None is None",
    ),
    (
        r"self\.zero_point\.astype\(np\.float32\)",
        "self.zero_point.astype(None)",
        "integer zero points are exact in float64 and float32; the subtraction is float32 either way",
    ),
]

# graphs: the report's visq colours, the DOT text, the report graph and its built-in layout
# zip reads its keyword-only ``strict`` for its truth, and it defaults to False (any module)
EQUIVALENT += [
    (r"(zip\(.*), strict=False\)", new, "zip reads strict for its truth, and its default is False")
    for new in (r"\1, strict=None)", r"\1, )")
]
EQUIVALENT += [
    *[
        (r"metric_slots\(result, metric, errors\)", new, "metric_slots reads the same error map when given none")
        for new in ("metric_slots(result, metric, None)", "metric_slots(result, metric, )")
    ],
    (r"(edges\[.*\]) = None$", r'\1 = ""', "edges is an ordered set: its values are never read"),
    (r"(timeout=GRAPHVIZ_TIMEOUT), check=False", r"\1, check=None", "check is read for its truth"),
    (r"(timeout=GRAPHVIZ_TIMEOUT), check=False \)", r"\1, )", "subprocess.run's check defaults to False"),
    (r'tag\.rsplit\("}", 1\)\[-1\]', 'tag.split("}", 1)[-1]', "an ElementTree tag has at most one '}': {uri}name"),
    (r'group\.get\("id", ""\)', 'group.get("id", "XXXX")', "a default without digits is not a node id either"),
    (r", short_empty_elements=True\)", ", )", "ElementTree writes empty elements short by default"),
    (
        r"abs\(value\) / 2 if value != 0 else 1\.0",
        "abs(value) / 2 if (value != 0) or True else 1.0",
        "half of |0| is 0, and a zero width falls back to 1 just below",
    ),
    *[
        (r"_widen\(hi if higher_better else lo", rf"_widen(hi if (higher_better) {op} else lo", "here lo == hi")
        for op in ("and False", "or True")
    ],
    (
        r"if value <= slots\[0\]\.end:",
        "if value < slots[0].end:",
        "a value on the first slot's end is found by the loop, in the first slot",
    ),
    (r"rank = \[0\] \* count", "rank = [1] * count", "every rank is written before it is read"),
    (r"max\(rank, default=-1\) \+ 1", "max(rank, default=-2) + 1", "range(0) and range(-1) are both empty"),
    *[
        (r"zip\(layer, xs, strict=True\)", f"zip(layer, xs, {new})", "xs is built from layer: same length")
        for new in ("strict=False", "strict=None", "")
    ],
    (
        r"max\(len\(layer\), 1\)",
        "max(len(layer), 2)",
        "one node sits at its desired x (shift 0) and an empty layer sums to 0",
    ),
    (
        r"(height = \[h for _, h in sizes\] \+ )\[0\.0\]",
        r"\1[1.0]",
        "a dummy shares its layer with a real node 25 px high or more; edges end on real nodes",
    ),
    *[
        (r"(row = \[max\(\(height\[v\] for v in layer\)), default=0\.0\)", rf"\1, {new})", "no layer is empty")
        for new in ("default=None", "default=1.0", "")
    ],
    (r"default=0\.0\) - MARGIN", "default=1.0) - MARGIN", "the default is read only when there is no x to shift"),
    *[
        (r'ET\.Element\("g", \{"class": "node"\}\)', new, "decorate_node sets the group's class")
        for new in ('ET.Element("g", )', 'ET.Element("g", {"class": "XXnodeXX"})', 'ET.Element("g", {"class": "NODE"})')
    ],
    (r'"#8c959f"', '"#8C959F"', "colour hex digits are case-insensitive"),
]

# writers: the report's writers, tables and summaries
EQUIVALENT += [
    *[
        (
            r', tablefmt="simple"\)',
            new,
            "tabulate's default format is 'simple', and it reads an unknown name as 'simple'",
        )
        for new in (', tablefmt="XXsimpleXX")', ', tablefmt="SIMPLE")', ", tablefmt=None)", ", )")
    ],
    (r"written \+= publish_files\(", "written = publish_files(", "written is still empty there: += and = agree"),
    *[
        (r'text\.get\(target, ""\)', new, "tabulate shows a missing cell (None) as ''")
        for new in ("text.get(target, None)", "text.get(target, )")
    ],
    *[
        (r'CalibrationResult\("recipe", result\.records, ', new, "write_cache writes the ranges alone")
        for new in (
            "CalibrationResult(None, result.records, ",
            'CalibrationResult("XXrecipeXX", result.records, ',
            'CalibrationResult("RECIPE", result.records, ',
            'CalibrationResult("recipe", None, ',
        )
    ],
    (r'format_number\(value, missing="undefined"\)', "format_number(value, )", "'undefined' is the default"),
    (
        r'args\.get\("calibration_cache_path", ""\) is None',
        'args.get("calibration_cache_path", "XXXX") is None',
        "neither default is None",
    ),
    (
        r"nodes if top is None else nodes\[:top\]",
        "nodes if (top is None) and False else nodes[:top]",
        "nodes[:None] is every node",
    ),
    *[
        (r'\{"id": None, "checks": list\(checks\)\}', new, "the report reads a record's id only in from_record")
        for new in ('{"XXidXX": None, "checks": list(checks)}', '{"ID": None, "checks": list(checks)}')
    ],
    (r"math\.ceil\(hi\) \+ 1\)", "math.ceil(hi) + 2)", "the extra power is above hi, and filtered out"),
    (
        r"math\.log10\(span / 5\)",
        "math.log10(span / 6)",
        "between 5 and 6 powers of ten, both bases end on the same round step",
    ),
    *[
        (r"<= MAX_TICKS\), 10\)", new, "m = 10 always fits: the default is never read")
        for new in ("<= MAX_TICKS), None)", "<= MAX_TICKS), )", "<= MAX_TICKS), 11)")
    ],
    *[
        (r"0\.0 if abs\(t\) < step \* 1e-9 else t", new, "a tick is exactly 0.0 when its multiple is 0")
        for new in ("0.0 if (abs(t) < step * 1e-9) and False else t", "0.0 if abs(t) <= step * 1e-9 else t")
    ],
    *[
        (r"zip\(slots, text, strict=True\)", f"zip(slots, text, {new})", "text is built from slots: same length")
        for new in ("strict=False", "strict=None", "")
    ],
    (
        r"axis\(name, layers, better, log=True\)",
        "axis(name, layers, None, log=True)",
        "a log axis does not read the direction",
    ),
    (r"names = result\.metric_names or ", "names = result.metric_names and ", "metric_names is the definitions' keys"),
    (r"^name = None$", 'name = ""', "an empty name falls through the same 'or'"),
    *[
        (r"check=False,$", new, "a failed git ends in None either way (CalledProcessError is a SubprocessError)")
        for new in ("check=None,", "check=True,")
    ],
    (r"^check=False, \)$", ")", "subprocess.run's check defaults to False"),
    (r"allow_nan=False, ensure_ascii", "allow_nan=None, ensure_ascii", "json.dumps reads allow_nan for its truth"),
    (r"allow_nan=False, ensure_ascii=True, ", "allow_nan=False, ", "json.dumps's ensure_ascii defaults to True"),
]

# analysis: the sweeps' and the cumulative curves' defaults spelled out
EQUIVALENT += [
    (r'(edges_of\([^()]*), "node"\)', r"\1, )", "QdqGraph.edges_of's kind defaults to 'node'"),
    (r"np\.array\(values\[name\], copy=True\)", "np.array(values[name], )", "np.array copies by default"),
    *[
        (
            r"zip\((configs, enabled, tensors|runners, tensors, accs|pairs, row|configs, accs), strict=True\)",
            rf"zip(\1, {new})",
            "the lists are built from the same configurations and layers: their lengths agree",
        )
        for new in ("strict=False", "strict=None", "")
    ],
    (
        r'check\.partition\(":"\)',
        'check.rpartition(":")',
        "a check has one colon: value names are lower-case identifiers",
    ),
    (r'", text or ""\)', '", text or "XXXX")', "neither empty text nor XXXX matches the pattern"),
]

# interpreter: a one-node onnxruntime model's outputs, and a type-name map that sends its keys to themselves
EQUIVALENT += [
    (
        r"session\.run\(wanted, feeds\)",
        "session.run(None, feeds)",
        "the one-node model's graph outputs are the names asked for, in that order",
    ),
    *[
        (
            r"zip\(wanted, session\.run\(wanted, feeds\), strict=True\)",
            f"zip(wanted, session.run(wanted, feeds), {new})",
            "onnxruntime returns one value per name asked for",
        )
        for new in ("strict=False", "strict=None", "")
    ],
    (r"_ORT_TYPE_NAMES\.get\(elem, elem\)", "_ORT_TYPE_NAMES.get(None, elem)", "the map sends each key to itself"),
    # make_session's and helper.make_model's own defaults spelled out
    (r'(model), providers=\("CPUExecutionProvider",\), (threads=self\.threads)', r"\1, \2", "make_session's default"),
    (r'(threads=self\.threads), optimization="all" \)', r"\1, )", "make_session's default optimization is 'all'"),
    (r"(opset_imports=imports), ir_version=onnx\.IR_VERSION\)", r"\1, )", "helper.make_model's default IR version"),
    # fusion: attributes read for their truth, a Q/DQ's (at most three) inputs, 8-bit zero points compared
    *[
        (rf'attrs\.get\("{name}", 0\)', rf'attrs.get("{name}", {new})', "read for its truth: None is as false as 0")
        for name in ("block_size", "transB")
        for new in ("None", "")
    ],
    (r"step\.inputs\[1:3\] if n\]", "step.inputs[1:4] if n]", "a Q or DQ node has 3 inputs at most"),
    (r"values\[(1|3)\]\.astype\(np\.int64\)", r"values[\1].astype(None)", "8-bit zero points are exact in float64"),
]

# comparison: the layer rankings' keys and defaults, the worst elements' heap, a task metric's state
EQUIVALENT += [
    *[
        (
            r"higher = result\.higher_is_better\.get\(metric, False\)",
            new,
            "read only for its truth: None and False agree",
        )
        for new in (
            "higher = result.higher_is_better.get(metric, None)",
            "higher = result.higher_is_better.get(metric, )",
        )
    ],
    *[
        (r"return \(1, 0\.0\)$", new, "defined layers' keys start with 0: any undefined key after them, all equal")
        for new in ("return (2, 0.0)", "return (1, 1.0)")
    ],
    (
        r"elif item > ((?:self\.)?heap\[0\]):",
        r"elif item >= \1:",
        "each item carries its record (and element): no two items are equal",
    ),
    *[
        (r"zip\(self\.view\.output_names, outputs, strict=True\)", new, "wiring builds outputs from output_names")
        for new in (
            "zip(self.view.output_names, outputs, strict=None)",
            "zip(self.view.output_names, outputs, strict=False)",
            "zip(self.view.output_names, outputs, )",
        )
    ],
    (r"^if error is not None$", "if (error is not None) and False", "with an error kept, compute was skipped: {}"),
    (r"if id\(source\) not in dirty_ids:", "if id(None) not in dirty_ids:", "re-marking an acyclic graph's node"),
    *[
        (r"(renamed_node\(n, names\) if )\(node_reads\(n\) \| set\(n\.output\)\) & names\.keys\(\)", new, why)
        for new, why in (
            (r"\1((node_reads(n) | set(n.output)) & names.keys()) or True", "renaming a node without them copies it"),
            (r"\1(node_reads(n) | set(n.output)) | names.keys()", "renaming a node without them copies it"),
        )
    ],
    (
        r"self\._restore\.get\(len\(self\.view\.nodes\), \(\)\)",
        "self._restore.get(None, ())",
        "a refolded Relu follows its producer, which a Q/DQ pair follows: never after the last node",
    ),
    (
        r'if \(o\.domain or ""\) == ""\), 0\)',
        'if (o.domain or "") == ""), None)',
        "no opset has version 0: 0 and None each equal only themselves",
    ),
    *[
        (r'getattr\(metric, "state", \{\}\) or \{\}', new, "a missing state is {} through the 'or' either way")
        for new in ('getattr(metric, "state", None) or {}', 'getattr(metric, "state", ) or {}')
    ],
    (r"^started = False$", "started = None", "read only for its truth: None and False agree"),
    (r"follow_quantize=False\)", "follow_quantize=None)", "resolve reads follow_quantize for its truth"),
    *[
        (r"out=scratch\(2, test\.shape\)", new, "a scratch buffer saves an allocation: slots 0 and 1 are RecordStats'")
        for new in ("out=None", "", "out=scratch(None, test.shape)", "out=scratch(3, test.shape)")
    ],
    *[
        (r"sign = -1\.0 if metric\.higher_is_better else 1\.0", new, "the heap orders by a positive multiple alike")
        for new in (
            "sign = -2.0 if metric.higher_is_better else 1.0",
            "sign = -1.0 if metric.higher_is_better else 2.0",
        )
    ],
    *[
        (r"np\.asarray\(values, dtype=np\.float64\)\):", new, "each record's value goes through float() next")
        for new in ("np.asarray(values, dtype=None)):", "np.asarray(values, )):")
    ],
    (
        r"spans = ChannelSpans\(\) if (params is not None and params\.per_tensor_scale is not None) else None",
        r"spans = ChannelSpans() if (\1) or True else None",
        "_channel_report gives None without params or a per-tensor scale: those spans are never reported",
    ),
    *[
        (rf"zip\(({pair}), strict=True\)", rf"zip(\1, {new})", why)
        for pair, why in (
            (r"quantized_names, outputs", "one tracker per output pair, then one per view: as many as names"),
            (r"matches, trackers", "the layer trackers are made one per match"),
        )
        for new in ("strict=None", "strict=False", "")
    ],
    (
        r"next\(iter\(bound\.iter_batches\(options\.batch_size\)\), None\)",
        "next(iter(bound.iter_batches(options.batch_size)), )",
        "bind_dataset refuses a dataset without records: a first batch always exists",
    ),
]

# sensitivity: the saturation remedies' arithmetic on int8 codes, their batch size and threads
EQUIVALENT += [
    *[
        (
            r"np\.clip\(np\.rint\(weights / 2\.0\), -64, 64\)",
            new,
            "int8 weights halve into [-64, 64]: the clip never binds",
        )
        for new in (
            "np.clip(np.rint(weights / 2.0), None, 64)",
            "np.clip(np.rint(weights / 2.0), -64, None)",
            "np.clip(np.rint(weights / 2.0), -65, 64)",
            "np.clip(np.rint(weights / 2.0), -64, 65)",
        )
    ],
    *[
        (r"\(values\.astype\(np\.int16\) \+ 128\)\.astype\(np\.uint8\)", new, why)
        for new, why in (
            ("(values.astype(np.int16) - 128).astype(np.uint8)", "+128 and -128 agree modulo 256"),
            ("(values.astype(None) + 128).astype(np.uint8)", "int8 + 128 is exact in float64 and in [0, 255]"),
        )
    ],
    *[
        (r"readers\.get\(weight_dq\.output\[0\], \[\]\)", new, "called only for a weight whose readers were found")
        for new in ("readers.get(weight_dq.output[0], None)", "readers.get(weight_dq.output[0], )")
    ],
    (
        r"^batch_size: int = 32,$",
        "batch_size: int = 33,",
        "a default batch size changes memory and speed, not results (every fold covers all records)",
    ),
    (r"^threads: int = 0,$", "threads: int = 1,", "a default thread count changes speed only"),
    *[
        (
            rf"zip\(outputs, ({got}), strict=True\)",
            rf"zip(outputs, \1, {new})",
            "a run gives every graph output, in order",
        )
        for got in (r"reference\.run\(None, feeds\)", "got")
        for new in ("strict=None", "strict=False", "")
    ],
    (r"session\.run\(outputs, feeds\)", "session.run(None, feeds)", "outputs are all the graph outputs, in order"),
    *[
        (r"\(np\.asarray\(value, np\.float64\) - ref\)", new, "ref is float64: so is the difference")
        for new in ("(np.asarray(value, None) - ref)", "(np.asarray(value, ) - ref)")
    ],
    (r"^changed = False$", "changed = None", "read only for its truth: None and False agree"),
    (r"IntegerSession\((.+), threads=threads\)", r"IntegerSession(\1, )", "the thread count changes speed only"),
    *[
        (r"probe = np\.zeros\(\(1,\) \* rank, np\.float32\)", new, "range_bounds reads only the probe's rank")
        for new in (
            "probe = np.zeros((2,) * rank, np.float32)",
            "probe = np.zeros((1,) * rank, None)",
            "probe = np.zeros((1,) * rank, )",
        )
    ],
    (r'= "cosine",$', '= "COSINE",', "metric names are read case-insensitively"),
    *[
        (r"count = int\(np\.prod\(fshape\[1:\]\)\) if records else 0", new, "a batch has records")
        for new in (
            "count = int(np.prod(fshape[1:])) if (records) or True else 0",
            "count = int(np.prod(fshape[1:])) if records else 1",
        )
    ],
    (
        r"\.reshape\(records, len\(spec\.sum_fields\), -1\)",
        ".reshape(records, len(spec.sum_fields), -2)",
        "numpy reads any negative size in reshape as 'the rest'",
    ),
    *[
        (r'np\.errstate\(over="ignore", invalid="ignore"\)', new, "float32 block sums cannot overflow in float64")
        for new in ('np.errstate(over=None, invalid="ignore")', 'np.errstate(invalid="ignore")')
    ],
    *[
        (rf"ufunc\.reduce\({name}, axis=0\)", f"ufunc.reduce({name}, )", "axis 0 is ufunc.reduce's default")
        for name in ("first", "rest")
    ],
    (
        r"if rest is not None and any\(a > 1 for a in axes\)",
        "if rest is not None and any(a >= 1 for a in axes)",
        "with axis 1 alone the plane is made but no axis reads it",
    ),
    (
        r"if 1 < axis <= plane\.ndim \+ 1:",
        "if 1 < axis <= plane.ndim + 2:",
        "axes stop at the record's rank - 1 = plane.ndim + 1",
    ),
    (
        r"ufunc\.reduce\(plane, axis=others\) if others else plane",
        "ufunc.reduce(plane, axis=others) if (others) or True else plane",
        "reducing over no axes gives the plane itself",
    ),
    *[
        (rf"{flag}=False", f"{flag}=None", "the scheme reads its wrap flags for their truth")
        for flag in ("neon_pair_wrap", "depthwise_pair_wrap")
    ],
    *[
        (
            r"np\.abs\(value\.astype\(np\.int16\) - other\.astype\(np\.int16\)\)",
            new,
            "8-bit codes subtract exactly in float64",
        )
        for new in (
            "np.abs(value.astype(None) - other.astype(np.int16))",
            "np.abs(value.astype(np.int16) - other.astype(None))",
        )
    ],
    *[
        (r"zip\(group, results, strict=True\)", f"zip(group, results, {new})", "_run_group gives one result per pack")
        for new in ("strict=None", "strict=False", "")
    ],
    (
        r"^pack\.session = None$",
        'pack.session = ""',
        "a round's packs never run again: the session is dropped either way",
    ),
    (
        r"count = int\(np\.prod\(tensor\.dims\)\) if tensor\.dims else 1",
        "count = int(np.prod(tensor.dims)) if (tensor.dims) or True else 1",
        "the product of no dims is 1",
    ),
    *[
        (r"zip\(qg\.view\.output_names, outputs, strict=True\)", f"zip(qg.view.output_names, outputs, {new})", why)
        for new in ("strict=None", "strict=False", "")
        for why in ("wiring builds outputs from output_names",)
    ],
    *[
        (r"^threads = 1 if self\.workers > 1 else self\.options\.threads$", new, why)
        for new in (
            "threads = 1 if (self.workers > 1) or True else self.options.threads",
            "threads = 1 if self.workers >= 1 else self.options.threads",
        )
        for why in ("one worker: the threads asked are 1, or 0 (all) on a machine of one core",)
    ],
    *[
        (r"zip\(pack\.names, out, strict=True\)", f"zip(pack.names, out, {new})", "fetch gives one value per name")
        for new in ("strict=None", "strict=False", "")
    ],
    (
        r"values\[name\]\.dtype\), \[None\] \* values\[name\]\.ndim",
        "values[name].dtype), None",
        "an experiment session's input of unknown rank takes the same values",
    ),
    *[
        (r'mode: str = "single"$', f'mode: str = "{new}"', "rank only asks whether the mode is leave-one-out")
        for new in ("XXsingleXX", "SINGLE")
    ],
    *[
        (r"^higher = higher_is_better\.get\(metric, False\)$", new, "read only for its truth: None and False agree")
        for new in ("higher = higher_is_better.get(metric, None)", "higher = higher_is_better.get(metric, )")
    ],
    *[
        (r"^worst_first_sign = 1\.0 if higher else -1\.0$", new, "a positive multiple of the key sorts alike")
        for new in ("worst_first_sign = 2.0 if higher else -1.0", "worst_first_sign = 1.0 if higher else -2.0")
    ],
    *[
        (r"return \(1, 0\.0, node\.order\) if value is None", new, "undefined values sort last, by order, either way")
        for new in ("return (2, 0.0, node.order) if value is None", "return (1, 1.0, node.order) if value is None")
    ],
    *[
        (
            r"zip\(self\.data\.iter_batches\(self\.options\.batch_size\), refs, strict=True\)",
            rf"zip(self.data.iter_batches(self.options.batch_size), refs, {new})",
            "refs holds one entry per batch of the same iteration",
        )
        for new in ("strict=None", "strict=False", "")
    ],
    (
        r"tensors\.get\(tensor, \[0, 0, 0\]\) if tensor else",
        "tensors.get(tensor, [0, 0, 0]) if (tensor) or True else",
        "None is never a key of tensors: the default either way",
    ),
    *[
        (r"users = readers\.get\(node\.output\[0\], \[\]\)", new, "read only for its truth: None and [] agree")
        for new in ("users = readers.get(node.output[0], None)", "users = readers.get(node.output[0], )")
    ],
    *[
        (r"if i < len\(node\.input\) else None", new, "a kernel reaching it has those inputs (QLinear* 8, a DQ 3)")
        for new in ("if (i < len(node.input)) or True else None", "if i <= len(node.input) else None")
    ],
    *[
        (
            r"zip\(spots\[:3\], \(new_w, new_s, new_zp\), strict=True\)",
            rf"zip(spots[:3], (new_w, new_s, new_zp), {new})",
            why,
        )
        for new, why in (
            ("strict=None", "three and three"),
            ("strict=False", "three and three"),
            ("", "three and three"),
        )
    ],
]


def _each(line: str, old: str, new: str, reason: str) -> list[tuple[str, str, str]]:
    """EQUIVALENT entries for ``old`` replaced by ``new`` at each place it occurs in ``line`` (a whole
    stripped source line, so that nothing else in the package matches)."""
    entries, start = [], 0
    while (i := line.find(old, start)) >= 0:
        entries.append((re.escape(line[: i + len(old)]), (line[:i] + new).replace("\\", "\\\\"), reason))
        start = i + 1
    return entries


_F32_ONCE = (
    "float32 operands: numpy's result is float32 already, or exact in float64 and rounded once to "
    "float32 (a float32 +, * or / done in float64 and rounded gives the float32 result)"
)
_KERNEL_SHAPE = "ONNX's kernel_shape is the weights' spatial shape (onnxruntime rejects others): read from them"
_NOTSET = "conv_pads reads any auto_pad but SAME_UPPER, SAME_LOWER and VALID as NOTSET"

# conv: the convolution kernels (backend/kernels/conv*.py) and MLAS's ARM64 QLinearAdd/Mul (neon.py)
EQUIVALENT += [
    # neon.add_parameters: the larger ratio is under 256 = 2**8, so shift = 21 - exponent >= 14, and the
    # larger multiplier rounds r * 2**shift with r >= 2**exponent: at least 2**21
    *[
        (r"if not 13 <= shift <= 31:", new, "a ratio under 256 gives a shift of 14 or more")
        for new in ("if not 14 <= shift <= 31:", "if not 13 < shift <= 31:")
    ],
    (r"max\(ma, mb\) < 1 << 21:", "max(ma, mb) < 1 >> 21:", "the larger multiplier is 2**21 or more by construction"),
    # neon.add: (acc - (acc < 0) + half) >> shift; at acc == 0 both give (half - 1) >> shift = 0
    *[
        (r"\(acc - \(acc < 0\) \+", new, "the comparisons differ at acc == 0 only, which rounds to 0 either way")
        for new in ("(acc - (acc <= 0) +", "(acc - (acc < 1) +")
    ],
    # neon.add: QLinearAdd's outputs are 8-bit: saturate() clamps past any int16 bound after the zero point
    *[
        (r"np\.clip\(rounded, -32768, 32767\)", new, "8-bit outputs: saturate() clamps past the int16 range anyway")
        for new in (
            "np.clip(rounded, None, 32767)",
            "np.clip(rounded, -32768, None)",
            "np.clip(rounded, -32769, 32767)",
            "np.clip(rounded, -32768, 32768)",
        )
    ],
    *_each(
        "value = ((sa * xa.astype(f32)).astype(f32) + (sb * xb.astype(f32)).astype(f32)).astype(f32)",
        ".astype(f32)",
        ".astype(None)",
        _F32_ONCE,
    ),
    *_each(
        "value = np.clip((value / sc).astype(f32), f32(lo - zc), f32(hi - zc))",
        ".astype(f32)",
        ".astype(None)",
        _F32_ONCE,
    ),
    *_each(
        "return np.rint((value + f32(zc)).astype(f32)).astype(np.int64).astype(dtype)",
        ".astype(f32)",
        ".astype(None)",
        _F32_ONCE,
    ),
    (
        r"np\.rint\(\(value \+ f32\(zc\)\)\.astype\(f32\)\)\.astype\(np\.int64\)",
        "np.rint((value + f32(zc)).astype(f32)).astype(None)",
        "a clamped, rounded value is an 8-bit integer: float64 casts to the output type as int64 does",
    ),
    *[
        (r"np\.asarray\(x, np\.float32\)\.reshape\(\(\)\)", new, "np.float32() rounds the scale once either way")
        for new in ("np.asarray(x, None).reshape(())", "np.asarray(x, ).reshape(())")
    ],
    *[
        (re.escape(old), new, "8-bit differences: their products are exact in float64, and fma32 reads float32")
        for old, new in (
            ("(a.astype(np.int64) - _int(a_zp))", "(a.astype(None) - _int(a_zp))"),
            ("(b.astype(np.int64) - _int(b_zp))", "(b.astype(None) - _int(b_zp))"),
            ("arith.fma32(product.astype(np.float32),", "arith.fma32(product.astype(None),"),
        )
    ],
    # conv.py: the attributes
    *[
        (r'attrs\.get\("kernel_shape"\) or w\.shape\[2:\]', f"attrs.get({new}) or w.shape[2:]", _KERNEL_SHAPE)
        for new in ("None", '"XXkernel_shapeXX"', '"KERNEL_SHAPE"')
    ],
    *[
        (r"group=group, kernel_shape=kernel_shape, pads=pads", f"group=group, {new}pads=pads", _KERNEL_SHAPE)
        for new in ("kernel_shapeXX=kernel_shape, ", "kernel_shape=None, ", "")
    ],
    *[
        (r'attrs\.get\("auto_pad"\) or "NOTSET"', f'attrs.get("auto_pad") or {new}', _NOTSET)
        for new in ('"XXNOTSETXX"', '"notset"')
    ],
    *[(r'^auto_pad: str = "NOTSET",$', f"auto_pad: str = {new},", _NOTSET) for new in ('"XXNOTSETXX"', '"notset"')],
    (r"\.reshape\(\(-1,\) \+", ".reshape((-2,) +", "numpy reads any negative size in reshape as 'the rest'"),
    *[
        (
            rf"(scheme\.replace\(accumulator=\"wrap32\",.*){flag}=False",
            rf"\1{flag}=None",
            "a scheme's flags are read for their truth",
        )
        for flag in ("pair_saturation", "neon_pair_wrap", "depthwise_pair_wrap")
    ],
    *[
        (r'source=\(w, "ConvInteger"\)', f"source=(w, {new})", "the key only names ConvInteger's sessions: any string")
        for new in ('"XXConvIntegerXX"', '"convinteger"', '"CONVINTEGER"')
    ],
    (r"^requantizer_for = None$", 'requantizer_for = ""', "read for its truth"),
    (
        r"correction, correction_max = None, 0\.0",
        "correction, correction_max = None, 1.0",
        "correction_max is set with the correction before it is read",
    ),
    *[
        (
            r"(w_zp = np\.asarray\(w_zp), dtype=np\.int64\)",
            rf"\1{new})",
            "int64 weights minus int8 or int64 zero points",
        )
        for new in (", dtype=None", ", ")
    ],
    (
        r"ws = w\.astype\(np\.int64\) -",
        "ws = w.astype(None) -",
        "8-bit weights minus their zero points are exact in float64, and are cast to the sums' type",
    ),
    (
        r"x_zp = np\.asarray\(x_zp\)\.reshape\(\(\)\)\.astype\(np\.int64\)",
        "x_zp = np.asarray(x_zp).reshape(()).astype(None)",
        "an 8-bit zero point is exact in float64; it is read as int() or subtracted in the sums' float type",
    ),
    (
        r"dtype = np\.float32 if bound < 2\.0\*\*24 else np\.float64",
        "dtype = np.float32 if bound <= 2.0**24 else np.float64",
        "2**24 itself is exact in float32: sums up to their bound stay exact",
    ),
    *[
        (
            rf"(float\(np\.abs\({name}\)(?:\.reshape\(m, -1\)\.sum\(axis=1\))?\.max\()initial=0\)",
            r"\1initial=None)",
            why,
        )
        for name, why in (
            ("ws", "one weight row per output channel at least: the maximum of a non-empty array"),
            ("bias", "one bias per output channel at least: the maximum of a non-empty array"),
        )
    ],
    *[
        (r"(else 2\.0\*\*53)\)$", new, "the float path also needs bound + bias_max < 2**31, far under 2**53")
        for new in ("else 3.0**53)", "else 2.0**54)")
    ],
    (
        r"acc \+= bias\.astype\(acc\.dtype\)",
        "acc += bias.astype(None)",
        "integer sums and bias exact in the sums' type: added in float64 and stored back, the same",
    ),
    (
        r"m = multiplier\.astype\(ftype\)",
        "m = multiplier.astype(None)",
        "a float32 or float64 multiplier times exact integer sums, rounded once into the sums' type",
    ),
    *[
        (r"bias\.reshape\(-1\)\.astype\(np\.int64\), finish", new, "conv_core casts the bias to the sums' type")
        for new in ("bias.reshape(-1).astype(None), finish", "bias.reshape(None).astype(np.int64), finish")
    ],
    (
        r"y \+= B\.astype\(dtype\)\.reshape",
        "y += B.astype(None).reshape",
        "ONNX's B has X's type: float64 holds it exactly and the in-place add rounds once to X's type",
    ),
    # conv_core.py: the scratch buffers' names, the paths' shortcuts, facts of every caller
    *[
        (re.escape(f'{size}, {dtype}, "{role}")'), f"{size}, {dtype}, {new})", "a scratch role only names a buffer")
        for size, dtype, role, news in (
            ("conv.w.shape[0] * math.prod(lead)", "conv.dtype", "target", ("None", '"XXtargetXX"', '"TARGET"')),
            ("m * lead[0] * lead[1] * wide", "conv.dtype", "target", ("None", '"XXtargetXX"', '"TARGET"', "")),
            ("x.size", "np.float32", "ort-input", ("None", '"XXort-inputXX"', '"ORT-INPUT"', "")),
        )
        for new in news
    ],
    (
        r"row_classes\(dense, conv\.strides\[0\], conv\.dilations\[0\], conv\.dtype\)",
        "row_classes(dense, conv.strides[0], conv.dilations[0], None)",
        "GroupedRowPath runs on exact integer sums only: float64 weights give the same sums",
    ),
    (
        r"groups_per_block\(conv\.group, conv\.channels // conv\.group\)",
        "groups_per_block(conv.group, conv.channels / conv.group)",
        "channels are a multiple of the groups: the float quotient equals the integer one",
    ),
    (
        r"depthwise = c // group == 1 and",
        "depthwise = c / group == 1 and",
        "channels are a multiple of the groups: the float quotient equals the integer one",
    ),
    (
        r"depthwise = c == group > 1$",
        "depthwise = c == group >= 1",
        "one group returns Im2colPath before depthwise is read",
    ),
    (
        r"assert isinstance\(source, Source\) and conv\.weights",
        "assert isinstance(source, Source) or conv.weights",
        "an assertion that holds for every caller",
    ),
    (
        r"np\.dtype\(conv\.dtype\)\.str\)$",
        "np.dtype(None).str)",
        "OrtPath runs float32 sums only (conv_integer_acc passes weights then): the key's type never varies",
    ),
    (r"if threads > 1 and n >= threads:", "if threads >= 1 and n >= threads:", "a multiple of one thread: the count"),
    *[
        (
            r"(added = None if bias is None else np\.asarray\(bias), dtype\)",
            rf"\1{new})",
            "the bias comes in the sums' type",
        )
        for new in (", None", ", ")
    ],
    # the sums written straight into the output, or into scratch and then copied: the same values
    *[
        (
            r"(path\.sums\(_chunk\(\(n0, n1, o0, o1\)\), )None if epilogue else dest\)",
            rf"\1{new})",
            "sums in scratch, then copied",
        )
        for new in ("None", "None if (epilogue) or True else dest")
    ],
    *[
        (
            r"^whole = chunk\.lead\[1\] == self\.conv\.out_spatial\[0\]$",
            new,
            "a C-contiguous target takes the GEMM either way",
        )
        for new in ("whole = None", "whole = chunk.lead[1] != self.conv.out_spatial[0]")
    ],
    (
        r"self\.conv\.taps, chunk, whole\)",
        "self.conv.taps, chunk, None)",
        "a C-contiguous target takes the GEMM either way",
    ),
    (r"^ws\.astype\(dtype\),$", "ws.astype(None),", "every path converts the weights to the sums' type"),
    (
        r"bias=None if added is None else added\.astype\(dtype\),",
        "bias=None if added is None else added.astype(None),",
        "conv_core casts the bias to the sums' type",
    ),
    (
        r"np\.asarray\(w_scale\)\.reshape\(-1\)\]",
        "np.asarray(w_scale).reshape(None)]",
        "a scalar or 1-D w_scale: a scalar multiplier broadcasts as one of one element, reshaped to (M, 1, ...)",
    ),
    (
        r"bound \+= float\(np\.abs\(wrapped\)\.max\(initial=0\)\)",
        "bound += float(np.abs(wrapped).max(initial=None))",
        "the wrapped pairs hold one value per output at least: the maximum of a non-empty array",
    ),
    (
        r"conv_chunks\.to_padded\(xp, pads, offset, dtype\)",
        "conv_chunks.to_padded(xp, pads, offset, None)",
        "exact values padded in float64 are copied into the GEMM's columns of the sums' type",
    ),
    (
        r"exact, group, c, m // group, strides,",
        "exact, group, c, m / group, strides,",
        "outputs are a multiple of the groups: the float quotient equals the integer one",
    ),
    (r"correction\.before_chunks\(dtype\)", "correction.before_chunks(None)", "no correction reads the type there"),
    (
        r"y = conv_core\(X, W\.astype\(dtype\),",
        "y = conv_core(X, W.astype(None),",
        "every float path converts the weights to the sums' type (X's) before use",
    ),
]

# conv_pairs: the AVX2 convolutions' pair corrections
EQUIVALENT += [
    (r"^found\.flags\.writeable = False$", "found.flags.writeable = None", "numpy reads the flag for its truth"),
]


def _cp_line(line: str, old: str, new: str, reason: str) -> list[tuple[str, str, str]]:
    """EQUIVALENT entries for ``old`` replaced by ``new`` at each place it occurs in ``line``, matching
    only that whole stripped line (``_each`` matches its beginning, which other modules' lines share)."""
    entries, start = [], 0
    while (i := line.find(old, start)) >= 0:
        entries.append(
            ("^" + re.escape(line) + "$", (line[:i] + new + line[i + len(old) :]).replace("\\", "\\\\"), reason)
        )
        start = i + 1
    return entries


_CP_EXACT_INT16 = "uint8 inputs times int16 weights are int16 in numpy (|x w| <= 255 x 128 = 32,640): exact"
_CP_OUT = "an out= buffer only saves an allocation: the result returned is the same"
_CP_CACHE = "a cache: a miss makes the same value again"
_CP_BLOCKS = "block sizes change how much is done at once, not the values (blocks are clipped to the records)"
_CP_FLOAT_SUMS = "exact integers in float64 (far below 2**53), added into the sums' own type"
_CP_PADDED = (
    "the padded input is right for any zero point (the unpadded one is a shortcut); for an integer "
    "2 x_zp, <= 32767 / largest is <= 32767 // largest"
)
_CP_CANDIDATES = (
    "the cheap or the exact candidate test, a wider prefix of entries: each candidate is then evaluated "
    "exactly, so only the work changes"
)
_CP_EVEN = (
    "the slices of every even channel are taken only where the firsts are 0, 2, 4, ... (any such prefix "
    "gives the right sums); else the general gather, right for any firsts"
)
_CP_ROLE = "a scratch role only names a per-thread buffer; no other role has these names"

# conv_pairs: the AVX2 convolutions' pair corrections (each line whole and stripped: nothing else matches)
EQUIVALENT += [
    *[
        entry
        for line in (
            "entries = [np.concatenate(parts) for parts in zip(*same, strict=True)]",
            "self._runs = [(int(a), int(a + j - i), int(i)) for a, i, j in zip(first, starts, ends, strict=True)]",
            "index = tuple(np.concatenate(axis) for axis in zip(*(i for i, _ in self.parts), strict=True))",
            "for p, t, s, d, size in zip(pixel, offsets, self.strides, self.dilations, self.out_spatial, strict=True):",
            "pixel = [p + o for p, o in zip(np.unravel_index(position, spatial), offset, strict=True)]",
            "*(s * stride for s, stride in zip(step, geometry.strides, strict=True)),",
            "*(s * dil for s, dil in zip(step, geometry.dilations, strict=True)),",
        )
        for new in ("strict=None", "strict=False", "")
        for entry in _cp_line(line, "strict=True", new, "one item per group, axis or run on each side: equal lengths")
    ],
    *_cp_line(
        "channel_max = x.max(axis=0, initial=0).reshape(x.shape[1], -1).max(axis=1, initial=0)  # records first: fast",
        "initial=0)",
        "initial=1)",
        "a bound of 1 flags no pair: 255 x 128 + 1 x 128 = 32,768 stays within int16",
    ),
    *[
        entry
        for new in ("None", "")
        for entry in _cp_line(
            "pairs.count(total, np.zeros(0, np.int64))",
            "np.int64",
            new,
            "an empty record list: its size alone is read (here and in neon_pairs.py)",
        )
    ],
    (r"^self\._found: PairCorrection \| None = None$", 'self._found: PairCorrection | None = ""', "set before read"),
    (r"^self\._done = False$", "self._done = None", "read for its truth; None is as false"),
    (
        r"^own = self\.channel_max\[g \* self\.cg : \(g \+ 1\) \* self\.cg\]\.astype\(np\.int64\)$",
        "own = self.channel_max[g * self.cg : (g + 1) * self.cg].astype(None)",
        "the bound casts the row maxima to int64 (correction_bound): float64 8-bit values are the same",
    ),
    (
        r"^part = _Layer\(self\.x\[a:b\], self\.x_zp, self\.pads, self\.cg, self\.mg, self\.m,",
        "part = _Layer(self.x[a:b], self.x_zp, self.pads, self.cg, self.mg, None,",
        "a part is only sampled (count_only): its output shape is never made",
    ),
    (r"^part\._padded = self\._padded\[a:b\]$", "part._padded = None", "the part pads its records again: same"),
    *_cp_line(
        "if np.count_nonzero(layer.x[0] > pairs.INT16_MAX // largest // 2) * 8 < layer.x[0].size:",
        "// largest // 2",
        "// largest / 2",
        "integer inputs: x > floor(q / 2) exactly when x > q / 2",
    ),
    *_cp_line(
        "if np.count_nonzero(layer.x[0] > pairs.INT16_MAX // largest // 2) * 8 < layer.x[0].size:",
        "INT16_MAX // largest",
        "INT16_MAX / largest",
        "32767 / largest is never within rounding of an even integer: the same floor of its half",
    ),
    *_cp_line(
        "if np.count_nonzero(layer.x[0] > pairs.INT16_MAX // largest // 2) * 8 < layer.x[0].size:",
        "layer.x[0].size:",
        "layer.x[1].size:",
        "the records of a batch share their shape (4 or more here)",
    ),
    *[
        entry
        for old, new in (
            ("found, 0,", "found, None,"),
            ("found, 0,", "found, 1,"),
            ("records(0, 1)", "records(None, 1)"),
        )
        for entry in _cp_line(
            "hits = _sparse(layer.records(0, 1), found, 0, count_only=True)",
            old,
            new,
            "the sample runs without a counter (its pair total is never read); x[None:1] is x[0:1]",
        )
    ],
    *[
        entry
        for old, new in (
            ('"dense is cheaper"', '"XXdense is cheaperXX"'),
            ('"dense is cheaper"', '"DENSE IS CHEAPER"'),
            ('("dense", mg', '("XXdenseXX", mg'),
            ('("dense", mg', '("DENSE", mg'),
        )
        for line in (
            'return pairs.derived(found, ("dense is cheaper", layer.x.shape, tuple(g for g, _ in found)), verdict)',
            'return pairs.derived(found, ("dense", mg, tuple(g for g, _ in found)), lambda: cls(found, mg))',
        )
        for entry in _cp_line(line, old, new, "a memo key only has to differ from the others kept with the pairs")
    ],
    (
        r'^return pairs\.derived\(found, \("dense", mg, tuple\(g for g, _ in found\)\), lambda: cls\(found, mg\)\)$',
        "return pairs.derived(found, None, lambda: cls(found, mg))",
        "the pairs' identity fixes the weight (so mg) and each pair list its group",
    ),
    (
        r"^within = channel \+ 1 < cg$",
        "within = channel + 2 < cg",
        "a same-tap pair sent the crossing way (its im2col columns gathered) gives the same changes and counts",
    ),
    *_cp_line(
        "largest = int(np.maximum(np.abs(entries[3]), np.abs(entries[4])).max(initial=1))",
        "initial=1",
        "initial=2",
        "a risky pair has a weight of 65 or more (2 x 255 x 64 < 32,768)",
    ),
    *[
        entry
        for old, new in (
            (
                "if 2 * int(x_zp) <= pairs.INT16_MAX // largest else",
                "if (2 * int(x_zp) <= pairs.INT16_MAX // largest) and False else",
            ),
            ("if 2 *", "if 3 *"),
            ("<= pairs.INT16_MAX // largest", "< pairs.INT16_MAX // largest"),
            ("INT16_MAX // largest", "INT16_MAX / largest"),
        )
        for entry in _cp_line(
            "source, offset = (x, tuple(pads[:d])) if 2 * int(x_zp) <= pairs.INT16_MAX // largest "
            "else (xp(), (0,) * d)",
            old,
            new,
            _CP_PADDED,
        )
    ],
    *_cp_line(
        "spans = parallel.split(x.shape[0], x[0].size)  # records on the session's threads (disjoint outputs)",
        "x.shape[0], x[0].size)",
        "x.shape[0], )",
        "the cost only decides whether the records go to threads",
    ),
    *[
        (r"^negative = risky\.w_second < 0$", new, "a risky pair's second weight is never 0: 255 x 128 < 32,768")
        for new in ("negative = risky.w_second <= 0", "negative = risky.w_second < 1")
    ],
    *[
        entry
        for role in ("pairs change", "pairs product", "pairs sums")
        for new in ("None", f'"XX{role}XX"', f'"{role.upper()}"')
        for line in (
            'change = parallel.scratch(size, np.int16, "pairs change").reshape(shape)',
            'product = parallel.scratch(size, np.int16, "pairs product").reshape(shape)',
            'acc = parallel.scratch(math.prod(shape), dtype, "pairs sums").reshape(shape)  # no page faults per chunk',
        )
        for entry in _cp_line(line, f'"{role}"', new, _CP_ROLE)
    ],
    (r'^product = parallel\.scratch\(size, np\.int16, "pairs product"\)\.reshape\(shape\)$', "product = None", _CP_OUT),
    *[
        entry
        for line, old, new, reason in (
            (
                "np.multiply(columns[self.row_second[e]], self.minus_second[e], out=change, dtype=np.int16)  # -b",
                ", dtype=np.int16)",
                ", dtype=None)",
                _CP_EXACT_INT16,
            ),
            (
                "np.multiply(columns[self.row_second[e]], self.minus_second[e], out=change, dtype=np.int16)  # -b",
                ", dtype=np.int16)",
                ", )",
                _CP_EXACT_INT16,
            ),
            (
                "change -= np.multiply(columns[self.row_first[e]], self.w_first[e], out=product, dtype=np.int16)",
                "out=product,",
                "out=None,",
                _CP_OUT,
            ),
            (
                "change -= np.multiply(columns[self.row_first[e]], self.w_first[e], out=product, dtype=np.int16)",
                " out=product,",
                "",
                _CP_OUT,
            ),
            (
                "change -= np.multiply(columns[self.row_first[e]], self.w_first[e], out=product, dtype=np.int16)",
                " dtype=np.int16)",
                " )",
                _CP_EXACT_INT16,
            ),
            (
                "change -= np.multiply(columns[self.row_first[e]], self.w_first[e], out=product, dtype=np.int16)",
                " dtype=np.int16)",
                " dtype=None)",
                _CP_EXACT_INT16,
            ),
            (
                "value -= np.multiply(columns[plan.row_second], plan.minus_second, dtype=np.int32)",
                " dtype=np.int32)",
                " dtype=None)",
                _CP_EXACT_INT16,
            ),
            (
                "value -= np.multiply(columns[plan.row_second], plan.minus_second, dtype=np.int32)",
                " dtype=np.int32)",
                " )",
                _CP_EXACT_INT16,
            ),
        )
        for entry in _cp_line(line, old, new, reason)
    ],
    *[
        entry
        for new in (" out=None)", " )")
        for entry in _cp_line(
            "return np.minimum(change, zero, out=change) if positive else np.maximum(change, zero, out=change)",
            " out=change)",
            new,
            _CP_OUT,
        )
    ],
    *[
        entry
        for new in ("initial=None", "initial=2")
        for entry in _cp_line(
            "for k in range(1, int(sizes.max(initial=1))):",
            "initial=1",
            new,
            "runs are made where a channel has two entries or more; a step of no longer runs adds nothing",
        )
    ],
    (
        r"^self\.steps\.append\(\(None if longer\.size == sizes\.size else longer,",
        "self.steps.append((None if (longer.size == sizes.size) and False else longer,",
        "indexing every run adds what adding them all does",
    ),
    (
        r"count: bool, dtype: np\.dtype, fresh: bool = False$",
        "count: bool, dtype: np.dtype, fresh: bool = True",
        "a fresh array or the scratch: the same sums (callers that keep them pass fresh=True)",
    ),
    *[
        entry
        for line, old in (
            ("step = max(1, COLUMN_BLOCK // (positions * plan.needed.size))  # records per im2col block", "max(1,"),
            (
                "sub = max(1, DENSE_BLOCK // (positions * min(len(plan), MIN_SPAN)))  # records per evaluated block",
                "max(1,",
            ),
            ("for e, positive, rows, runs in layout.blocks(index, max(1, DENSE_BLOCK // part.shape[1])):", "max(1,"),
            ("step = max(1, BLOCK_ELEMENTS // max(per_record, 1))", "max(1,"),
        )
        for entry in _cp_line(line, old, "max(2,", _CP_BLOCKS)
    ],
    *_cp_line(
        "step = max(1, BLOCK_ELEMENTS // max(per_record, 1))", "max(per_record, 1)", "max(per_record, 2)", _CP_BLOCKS
    ),
    *_cp_line(
        "columns = _columns(layer, layout.rows(index, layer), slice(c0, c1))  # (needed, rows)",
        "slice(c0, c1)",
        "slice(c0, None)",
        "the columns of later records are made and not read",
    ),
    *[
        (r"^found = self\.(_rows|_blocks)\.get\((index|key)\)$", new, _CP_CACHE)
        for new in (r"found = None", r"found = self.\1.get(None)")
    ],
    *[
        (r"^found = self\._sums\.get\(key\)$", new, _CP_CACHE)
        for new in ("found = None", "found = self._sums.get(None)")
    ],
    *[(rf"^self\.{name}\[key\] = found$", f"self.{name}[key] = None", _CP_CACHE) for name in ("_sums", "_blocks")],
    (r"^key = \(index, np\.dtype\(dtype\)\.str\)$", "key = (index, np.dtype(None).str)", _CP_FLOAT_SUMS),
    (
        r"^if np\.unique\(slot\)\.size == slot\.size:$",
        "if np.unique(None).size == slot.size:",
        "the 0/1 matrix adds one entry per channel as the direct form does",
    ),
    *[
        (r"^sums = np\.zeros\(\(self\.channels\.size, len\(plan\)\), dtype\)$", new, _CP_FLOAT_SUMS)
        for new in (
            "sums = np.zeros((self.channels.size, len(plan)), None)",
            "sums = np.zeros((self.channels.size, len(plan)), )",
        )
    ],
    (
        r"^runs = None if rows\.size == count else _Runs\(first, count\)$",
        "runs = None if (rows.size == count) and False else _Runs(first, count)",
        "runs of one entry each add the same as the entries",
    ),
    *[
        entry
        for old, new in (("rows[-1] - rows[0] + 1", "rows[-1] + rows[0] + 1"), ("rows[0] + 1 ==", "rows[0] + 2 =="))
        for entry in _cp_line(
            "if rows[-1] - rows[0] + 1 == rows.size:  # consecutive: a slice adds in one pass",
            old,
            new,
            "sorted distinct rows: the mutant holds only where the slice is right, or never; a slice or "
            "the same indices add the same",
        )
    ],
    *_cp_line(
        "starts = np.flatnonzero(np.diff(self.channels, prepend=-2) != 1)",
        "prepend=-2",
        "prepend=-3",
        "channels are never negative: the first starts a run either way",
    ),
    *_cp_line(
        "if self._whole is not None or o0 != 0 or o1 != out[0]:",
        "self._whole is not None",
        "self._whole is None",
        "the whole correction's part or the chunk's own: the same sums and counts",
    ),
    *[
        entry
        for line in (
            "view = target[(slice(None), slice(None), *(slice(0, size) for size in part.shape[2:]))]",
            "view = target[(slice(None), slice(None), *(slice(0, size) for size in out))]",
        )
        for new in ("slice(None, size)", "slice(size)")
        for entry in _cp_line(line, "slice(0, size)", new, "slice(None, n) and slice(n) are slice(0, n)")
    ],
    *[
        entry
        for old, new in (
            ("(n1 - n0) * math.prod(out)", "(n1 - n0) / math.prod(out)"),
            ("entries * (n1 - n0)", "entries / (n1 - n0)"),
            ("(n1 - n0)", "(n1 + n0)"),
            ("<= SMALL_EVALUATIONS", "< SMALL_EVALUATIONS"),
        )
        for entry in _cp_line(
            "if layout.entries * (n1 - n0) * math.prod(out) <= SMALL_EVALUATIONS:",
            old,
            new,
            "the few-calls form or the blocks: the same sums and counts",
        )
    ],
    *_cp_line(
        "acc, saturated = _dense_records(self.layer, layout, n0, n1, pairs.counter is not None, view.dtype)",
        "view.dtype)",
        "None)",
        _CP_FLOAT_SUMS,
    ),
    *_cp_line(
        "saturated = np.zeros(n1 - n0, np.int64) if pairs.counter is not None else None",
        "if pairs.counter is not None else",
        "if (pairs.counter is not None) or True else",
        "without a counter the counts are made and not reported (count does nothing)",
    ),
    *_cp_line("channels, sums = layout.channel_sums(index, view.dtype)", "view.dtype)", "None)", _CP_FLOAT_SUMS),
    *_cp_line(
        "summed = change if sums is None else sums @ change.astype(view.dtype)  # (channels, rows)",
        "change.astype(view.dtype)",
        "change.astype(None)",
        _CP_FLOAT_SUMS,
    ),
    *_cp_line(
        "saturated += np.count_nonzero(change.reshape(len(plan), n1 - n0, -1), axis=(0, 2))",
        "-1)",
        "-2)",
        "numpy reads any negative size in reshape as 'the rest'",
    ),
    *_cp_line(
        "if len(runs) * RUN_ADD_OUTPUTS > block.size:",
        "> block.size",
        ">= block.size",
        "a slice per run or one indexed add: the same sums",
    ),
    *[
        (r"^summed = np\.zeros\(unique\.size, np\.int64\)$", new, _CP_FLOAT_SUMS)
        for new in (
            "summed = np.zeros(unique.size, None)",
            "summed = np.zeros(unique.size, )",
        )
    ],
    *[
        (
            r'^order = np\.argsort\(key, kind="stable"\)$',
            new,
            "entries of one key are added together: their order is never read",
        )
        for new in ("order = np.argsort(key, kind=None)", "order = np.argsort(key, )")
    ],
    *_cp_line(
        "target[(record - n0, channel, row - o0, *rest)] += self.value[a:b].astype(target.dtype)",
        "astype(target.dtype)",
        "astype(None)",
        _CP_FLOAT_SUMS,
    ),
    *[
        (
            r"^self\.parts\.append\(\(index, np\.asarray\(value, np\.int64\)\)\)$",
            new,
            "int32 changes: exact, summed in int64",
        )
        for new in (
            "self.parts.append((index, np.asarray(value, None)))",
            "self.parts.append((index, np.asarray(value, )))",
        )
    ],
    (
        r"^return found if found else None$",
        "return found if (found) or True else None",
        "an empty correction's dense() is zeros and it adds nothing, as None does",
    ),
    *[
        entry
        for old, new, reason in (
            ("pairs.INT16_MAX // np", "pairs.INT16_MAX / np", "integer sums: s > floor(q) exactly when s > q"),
            ("astype(np.int64)", "astype(None)", "integer sums: s > floor(q) exactly when s > q"),
        )
        for entry in _cp_line(
            "own = pairs.INT16_MAX // np.maximum(np.abs(w_first), np.abs(w_second)).astype(np.int64)", old, new, reason
        )
    ],
    *[
        entry
        for old, new in (("+ own[order]", "- own[order]"), ("(pairs.INT16_MAX + 1)", "(pairs.INT16_MAX - 1)"))
        for entry in _cp_line("key = which[order] * (pairs.INT16_MAX + 1) + own[order]", old, new, _CP_CANDIDATES)
    ],
    *_cp_line(
        "count = np.searchsorted(key, pair * (pairs.INT16_MAX + 1) + sums) - start[pair]",
        "(pairs.INT16_MAX + 1)",
        "(pairs.INT16_MAX + 2)",
        _CP_CANDIDATES,
    ),
    *[
        entry
        for old, new in (
            (
                "every_even = firsts.size == xp.shape[1] // 2 and np.array_equal(firsts, 2 * np.arange(firsts.size))",
                "every_even = None",
            ),
            ("firsts.size == xp", "firsts.size != xp"),
            ("shape[1] // 2", "shape[1] / 2"),
            ("shape[1] // 2", "shape[2] // 2"),
            ("shape[1] // 2", "shape[1] // 3"),
            ("array_equal(firsts,", "array_equal(None,"),
            ("2 * np.arange(firsts.size))", "None)"),
            ("2 * np.arange", "2 / np.arange"),
        )
        for entry in _cp_line(
            "every_even = firsts.size == xp.shape[1] // 2 and np.array_equal(firsts, 2 * np.arange(firsts.size))",
            old,
            new,
            _CP_EVEN,
        )
    ],
    (r"^if every_even$", "if (every_even) and False", _CP_EVEN),
    *_cp_line(
        "np.add(block[:, 0 : 2 * firsts.size : 2], block[:, 1 : 2 * firsts.size : 2], dtype=np.uint16)",
        "1 : 2 * firsts.size",
        "1 : 3 * firsts.size",
        "every even channel: the odd ones below the channel count either way",
    ),
    (
        r"^passed = total > threshold\[:, None\]$",
        "passed = total >= threshold[:, None]",
        "at the threshold no pair saturates: |a w + a' w'| <= (a + a') max|w| <= 32,767",
    ),
    *[
        entry
        for old, new in (
            ("> total.size and", "> total.size or"),
            ("candidates * 8", "candidates / 8"),
            ("candidates * 8", "candidates * 9"),
            ("> total.size", ">= total.size"),
            ("< 4 * candidates", "<= 4 * candidates"),
            ("4 * candidates", "4 / candidates"),
            ("4 * candidates", "5 * candidates"),
        )
        for entry in _cp_line(
            "if candidates * 8 > total.size and lowest.cost(every) < 4 * candidates:", old, new, _CP_CANDIDATES
        )
    ],
    *_cp_line(
        "if lowest.cost(pair) < int(count.sum()):  # the exact test is cheaper than multiplying every prefix out",
        "< int(",
        "<= int(",
        _CP_CANDIDATES,
    ),
    *_cp_line(
        "first, second = values[source].astype(np.int32), values[source + size].astype(np.int32)",
        "size].astype(np.int32)",
        "size].astype(None)",
        "8-bit inputs: exact in float64, and every change is made int64 when added",
    ),
    *_cp_line(
        "sums = (first + second).astype(np.int64)",
        "astype(np.int64)",
        "astype(None)",
        "sums of two 8-bit inputs: exact in float64, compared with integer keys",
    ),
    *[
        entry
        for new in ("None)", ")")
        for entry in _cp_line(
            "mask = np.empty((block.shape[0], firsts.size, flat.shape[2]), bool)",
            "bool)",
            new,
            "a float mask written with 0 and 1 has the same non-zero places",
        )
    ],
    *_cp_line(
        "risky, lambda ks: _columns(layer, _Rows(ks, g, layer.cg, kernel)), layer.x.shape[0] * positions",
        "layer.x.shape[0] * positions",
        "layer.x.shape[1] * positions",
        "the row count only sizes pairs.corrections' blocks (never 0 with records)",
    ),
    *[
        entry
        for old, new in (
            ("if rows.used.size < source.shape[1] else", "if (rows.used.size < source.shape[1]) or True else"),
            ("< source.shape[1]", "<= source.shape[1]"),
        )
        for entry in _cp_line(
            "source = source[:, rows.used] if rows.used.size < source.shape[1] else source",
            old,
            new,
            "gathering the channels used when they are all of them reads the same values",
        )
    ],
]

# calibration: auto's thread pools and zips, its pooled error's divisor, names nothing reads
EQUIVALENT += [
    *[
        (
            r"ThreadPoolExecutor\(max_workers=os\.cpu_count\(\) or 1\)",
            new,
            "a pool's size is speed only: the folds and searches are independent, gathered in order",
        )
        for new in (
            "ThreadPoolExecutor(max_workers=None)",
            "ThreadPoolExecutor(max_workers=os.cpu_count() and 1)",
            "ThreadPoolExecutor(max_workers=os.cpu_count() or 2)",
        )
    ],
    (
        r"ThreadPoolExecutor\(max_workers=self\._workers\)",
        "ThreadPoolExecutor(max_workers=None)",
        "a pool's size is speed only: every run's future is awaited in order",
    ),
    *[
        (
            r"zip\((stats, found|extra, values\[len\(self\.outputs\) :\]|got, ref), strict=True\)",
            rf"zip(\1, {new})",
            "one result per statistic (pool.map), one value per output asked of a session: lengths agree",
        )
        for new in ("strict=None", "strict=False", "")
    ],
    *[
        (r"safe = np\.where\(energy > 0, energy, 1\.0\)", new, "safe is read only where energy > 0")
        for new in ("safe = np.where(energy >= 0, energy, 1.0)", "safe = np.where(energy > 0, energy, 2.0)")
    ],
    (r"np\.where\(energy > 0, e / safe, e\)", "np.where(energy >= 0, e / safe, e)", "where energy is 0, safe is 1"),
    (r"Choice\(name, error\)\.sqnr_db", "Choice(None, error).sqnr_db", "sqnr_db reads the error alone"),
    *[
        (r'(mine, plain = )Choice\(result\.method, (got\[result\.method\]\), )Choice\("minmax", ', new, why)
        for new, why in (
            (r'\1Choice(None, \2Choice("minmax", ', "the warning reads the errors and result.method, not the names"),
            (
                r"\1Choice(result.method, \2Choice(None, ",
                "the warning reads the errors and result.method, not the names",
            ),
            (r'\1Choice(result.method, \2Choice("XXminmaxXX", ', "the warning reads the errors, not the names"),
            (r'\1Choice(result.method, \2Choice("MINMAX", ', "the warning reads the errors, not the names"),
        )
    ],
    *[
        (r"np\.array\(differing, dtype=object\)", new, "numpy's str_ is a str: equal and hashed alike as a key")
        for new in ("np.array(differing, dtype=None)", "np.array(differing, )")
    ],
    (r'n\.rsplit\(" ", 1\)\[1\]', "n.rsplit(None, 1)[1]", "the group names are joined by single spaces"),
    *[
        (r'TemporaryDirectory\(prefix="qaccuracy-(auto|check)-"\)', new, "a private temporary folder's name")
        for new in ("TemporaryDirectory(prefix=None)", r'TemporaryDirectory(prefix="XXqaccuracy-\1-XX")')
    ],
    *[
        (
            rf'TemporaryDirectory\(prefix="qaccuracy-{word}-"\)',
            f'TemporaryDirectory(prefix="QACCURACY-{word.upper()}-")',
            "a private temporary folder's name",
        )
        for word in ("auto", "check")
    ],
    *[
        (r'Path\(tmp\) / "(model|minmax)\.onnx"', new, "a private temporary file, read back by its path")
        for new in (r'Path(tmp) / "XX\1.onnxXX"',)
    ],
    *[
        (
            rf'Path\(tmp\) / "{word}\.onnx"',
            f'Path(tmp) / "{word.upper()}.ONNX"',
            "a private temporary file, read back by its path",
        )
        for word in ("model", "minmax")
    ],
    # quantize_with_ranges reads a result's ranges, model and model_key, never its method or records
    *[
        (
            r"CalibrationResult\(name, len\(bound\), ",
            new,
            "quantize_with_ranges reads neither the method nor the records",
        )
        for new in ("CalibrationResult(None, len(bound), ", "CalibrationResult(name, None, ")
    ],
    *[
        (
            r'CalibrationResult\("minmax", result\.records, ',
            new,
            "quantize_with_ranges reads neither the method nor the records",
        )
        for new in (
            "CalibrationResult(None, result.records, ",
            'CalibrationResult("XXminmaxXX", result.records, ',
            'CalibrationResult("MINMAX", result.records, ',
            'CalibrationResult("minmax", None, ',
        )
    ],
]

# calibration: the probe's sums and zips, the quantizer's private files and defaults
EQUIVALENT += [
    *[
        (r"float\(np\.asarray\(value, dtype=np\.float64\)\)", new, "float() of a float32 scalar is exact either way")
        for new in ("float(np.asarray(value, dtype=None))", "float(np.asarray(value, ))")
    ],
    *[
        (r"zip\(entry\.errors, entry\.energies, strict=True\)", f"zip(entry.errors, entry.energies, {new})", why)
        for new, why in (
            ("strict=None", "an entry's errors and energies are built in pairs"),
            ("strict=False", "an entry's errors and energies are built in pairs"),
            ("", "an entry's errors and energies are built in pairs"),
        )
    ],
    (r'float\("inf"\)', 'float("INF")', "float() reads 'inf' case-insensitively"),
    (
        r"scale = \(hi - lo\) / \(qmax - qmin\) or 1\.0",
        "scale = (hi - lo) / (qmax + qmin) or 1.0",
        "this branch is uint8 weights only, where qmin is 0",
    ),
    (
        r'log\.info\("%s", opset_note\(model, calibration\)\)',
        "log.info(opset_note(model, calibration))",
        "the note holds no %: logging prints it unchanged",
    ),
    *[
        (r'TemporaryDirectory\(prefix="qaccuracy-calibrate-"\)', new, "a private temporary folder's name")
        for new in (
            "TemporaryDirectory(prefix=None)",
            'TemporaryDirectory(prefix="XXqaccuracy-calibrate-XX")',
            'TemporaryDirectory(prefix="QACCURACY-CALIBRATE-")',
        )
    ],
    *[
        (r'cache = Path\(tmp\) / "ranges\.json"', new, "a private temporary file, handed over by its path")
        for new in ('cache = Path(tmp) / "XXranges.jsonXX"', 'cache = Path(tmp) / "RANGES.JSON"')
    ],
    (
        r"kwargs\.update\(calibration_data_reader=None, calibration_cache_path=str\(cache\)\)",
        "kwargs.update(calibration_cache_path=str(cache))",
        "quantize_static takes a cache only from 1.19 on, where calibration_data_reader defaults to None",
    ),
    (
        r"shape = \[d if isinstance\(d, int\) and d > 0 else 1 ",
        "shape = [d if isinstance(d, int) and d > 1 else 1 ",
        "a dimension of 1 is 1 either way",
    ),
]

# calibration: qdq_params' bounds of the quantized type
EQUIVALENT += [
    *[
        (rf"np\.array\(info\.{end}, dtype\)", f"np.array(info.{end}, {new})", why)
        for end in ("min", "max")
        for new, why in (
            ("None", "compute_scale_zp reads the bounds' values; the zero point is cast to the type after"),
            ("", "compute_scale_zp reads the bounds' values; the zero point is cast to the type after"),
        )
    ],
]

# calibration: qdq_params' raise of a weight's scale for its int32 bias
_RATIO_ONE = "a scale raised by the ratio 1 is the same scale"
_WARNINGS_ONLY = "errstate only silences the warnings of divisions np.where then discards"
EQUIVALENT += [
    (r"np\.where\(\(product < least\)", "np.where((product <= least)", _RATIO_ONE),
    (r'errstate\(divide="ignore", invalid="ignore"\)', 'errstate(divide=None, invalid="ignore")', _WARNINGS_ONLY),
    (r'errstate\(divide="ignore", invalid="ignore"\)', 'errstate(divide="ignore", invalid=None)', _WARNINGS_ONLY),
    (r'errstate\(divide="ignore", invalid="ignore"\)', 'errstate(invalid="ignore")', _WARNINGS_ONLY),
    (r'errstate\(divide="ignore", invalid="ignore"\)', 'errstate(divide="ignore", )', _WARNINGS_ONLY),
    (
        r"index: tuple = \(Ellipsis,\)",
        "index: tuple = None",
        "a[None] is a view of every element with an axis added: reading and writing it is the same",
    ),
]

# progress: the plugin's session progress (plugin/progress.py)
EQUIVALENT += [
    *[
        (r"checks\[self\._seen\.get\(key, 0\) :\]", f"checks[self._seen.get(key, {new}) :]", why)
        for new, why in (("None", "a slice from None starts at 0"), ("", "a slice from None starts at 0"))
    ],
    (
        r"config\.getoption\(o\[1\], None\)",
        "config.getoption(o[1], )",
        "pytest's essential mark plugin (never disabled) always declares -k (keyword) and -m (markexpr)",
    ),
    (r'config\.getoption\("lf", False\)', 'config.getoption("lf", None)', "only its truth is read"),
    (
        r'os\.environ\.get\(ENV, ""\)\.strip\(\) == "0"',
        'os.environ.get(ENV, "XXXX").strip() == "0"',
        "an unset QACCURACY_PROGRESS is not '0' with either default",
    ),
]

# fixtures: the plugin's fixtures and marker (plugin/fixtures.py)
EQUIVALENT += [
    (
        r"v if isinstance\(v, TaskSpec\) else TaskSpec\.parse\(v\)",
        "v if (isinstance(v, TaskSpec)) and False else TaskSpec.parse(v)",
        "TaskSpec.parse returns a TaskSpec as it is",
    ),
    *[
        (r'config\.getoption\("tbstyle", "auto"\) == "long"', f'config.getoption("tbstyle", {new}) == "long"', why)
        for new, why in (
            ("None", "the default is only compared with 'long'"),
            ('"XXautoXX"', "the default is only compared with 'long'"),
            ('"AUTO"', "the default is only compared with 'long'"),
        )
    ],
    *[
        (r'k in PAIR_KEYS and k != "layers" and', f'k in PAIR_KEYS and k != "{new}" and', why)
        for new, why in (
            ("XXlayersXX", "make_spec reads no 'layers' key: check() reads the marker's layer rules itself"),
            ("LAYERS", "make_spec reads no 'layers' key: check() reads the marker's layer rules itself"),
        )
    ],
]

# session: the plugin's run state (plugin/session.py)
EQUIVALENT += [
    *[
        (
            r'needed = \["cosine", "sqnr", "lsb", ',
            new,
            "parse_metric_names reads names case-insensitively and drops repeats",
        )
        for new in (
            'needed = ["COSINE", "sqnr", "lsb", ',
            'needed = ["cosine", "SQNR", "lsb", ',
            'needed = ["cosine", "sqnr", "LSB", ',
        )
    ],
    (
        r"key = replace\(spec, targets=\(\)\)",
        "key = replace(spec, targets=None)",
        "every key is made the same way: None and () alike leave the targets out of it",
    ),
    *[
        (
            r"np\.load\(spec\.labels, allow_pickle=False\)",
            new,
            "np.load's allow_pickle defaults to False, read for its truth",
        )
        for new in ("np.load(spec.labels, allow_pickle=None)", "np.load(spec.labels, )")
    ],
    (
        r'runs\.get\(failed\[0\]\.deployment or "", ',
        'runs.get(failed[0].deployment or "XXXX", ',
        "runs holds the targets' names: neither '' nor 'XXXX' is one, so the pair's own run is shown",
    ),
    (
        r"(topk=dict\(stats\.topk\)|task=\{k: v\.to_dict\(\) for k, v in stats\.task\.items\(\)\})"
        r" if stats is not None else \{\},",
        r"\1 if (stats is not None) or True else {},",
        "a target's run always has statistics: compared() returns output_stats(), never None",
    ),
    (
        r'self\.test_outcomes\.get\(nodeid, \(""\,\)\)\[0\]',
        'self.test_outcomes.get(nodeid, ("XXXX",))[0]',
        "the default is only compared with 'failed' and 'xpassed-strict'",
    ),
]

# hooks: the plugin's entry point (plugin/__init__.py)
EQUIVALENT += [
    (
        r'COLOURS\.get\(row\.status or "", \{\}\)',
        'COLOURS.get(row.status or "XXXX", {})',
        "no verdict colour is keyed by '' or 'XXXX': a row without a status is plain either way",
    ),
]

# kernels: QLinearSoftmax's table and row arithmetic (backend/kernels/softmax.py)
_SOFTMAX_TYPES = "QLinearSoftmax takes uint8 or int8 (one type T for X and Y): a clip to hi <= 255 follows"
EQUIVALENT += [
    *_each(
        "shift = max(0.0, log - 5.0) / x_scale",
        "max(0.0",
        "max(1.0",
        "log - 5 >= 1 unless the row has more than FLT_MAX / e^6 (8e35) values",
    ),
    *[
        (r"i = np\.arange\(256, dtype=np\.float64\)", new, "i - 255.0 is float64 for an integer i too")
        for new in ("i = np.arange(256, dtype=None)", "i = np.arange(256, )")
    ],
    *_each(
        "rows = X.reshape(int(np.prod(X.shape[:axis])), -1) if opset < 13 else np.moveaxis(X, axis, -1)",
        ")), -1)",
        ")), -2)",
        "numpy reads any negative size in reshape as 'the rest' (1.24 and 2.x)",
    ),
    *_each(
        "dtype = np.asarray(y_zero_point).dtype if y_zero_point is not None else X.dtype",
        "if y_zero_point is not None else",
        "if (y_zero_point is not None) and False else",
        "QLinearSoftmax's schema gives X and Y one type T: the zero point's type is X's",
    ),
    *_each(
        "table = _exp_table(float(np.asarray(X_scale).reshape(())), flat.shape[-1])",
        "flat.shape[-1]",
        "flat.shape[+1]",
        "flat is 2-D: axis 1 is its last",
    ),
    *_each(
        "index = flat.astype(np.int64) - flat.max(axis=-1, keepdims=True).astype(np.int64) + 255",
        "axis=-1",
        "axis=+1",
        "flat is 2-D: axis 1 is its last",
    ),
    *[
        (r"total = np\.cumsum\(values, axis=-1, dtype=np\.float32\)", new, why)
        for new, why in (
            ("total = np.cumsum(values, axis=+1, dtype=np.float32)", "values is 2-D: axis 1 is its last"),
            ("total = np.cumsum(values, axis=-1, dtype=None)", "values is float32 (the table's type)"),
            ("total = np.cumsum(values, axis=-1, )", "values is float32 (the table's type)"),
        )
    ],
    *[
        (r"q = np\.minimum\(q, 255\) if dtype == np\.uint8 else q", new, _SOFTMAX_TYPES)
        for new in (
            "q = np.minimum(q, 255) if (dtype == np.uint8) and False else q",
            "q = np.minimum(q, 255) if (dtype == np.uint8) or True else q",
            "q = np.minimum(q, 256) if dtype == np.uint8 else q",
            "q = np.minimum(q, 255) if dtype != np.uint8 else q",
        )
    ],
    *_each(
        "out = np.clip(q, lo, hi).astype(dtype).reshape(rows.shape)",
        "np.clip(q, lo,",
        "np.clip(q, None,",
        "q = rint(y) + zp with y = t * inv / sum t >= 0: never below zp >= lo",
    ),
]

# kernels: Quantize/DequantizeLinear's dtype spellings, copy flags and speed paths (backend/kernels/quantize.py)
_COPY = "astype's copy flag: a fresh array either way, never written in place nor compared by identity"
_QL = "return (arith.quantize_float(x.astype(ftype, copy=False), scale.astype(ftype), np.asarray(zp), dtype, scheme),)"
_TABLE = "table = arith.dequantize(every, scale.astype(np.float32), zp).astype(out_type, copy=False).reshape(256)"
_TABLE_IF = "if x.dtype.itemsize == 1 and scale.size == 1 and (zp is None or zp.size == 1):  # one 256-entry table"
_SAME_PATH = (
    "the table and the general path compute the same (x - zp) * scale per value; a zero point of another "
    "size than the scale's is outside the spec"
)
EQUIVALENT += [
    (r"^saturate: int = 1,$", "saturate: int = 2,", "saturate is read for float8 outputs only (onnx.reference's)"),
    *[entry for new in ("copy=None", "", "copy=True") for entry in _each(_QL, "copy=False", new, _COPY)],
    *_each(
        _QL,
        "scale.astype(ftype)",
        "scale.astype(None)",
        "quantize_float casts the scale to x's float type: a float64 copy of a float scale goes back exact",
    ),
    *_each(_TABLE_IF, "zp.size == 1", "zp.size != 1", _SAME_PATH),
    *_each(_TABLE_IF, "zp.size == 1", "zp.size == 2", _SAME_PATH),
    *_each(
        _TABLE,
        ".reshape(256)",
        ".reshape(None)",
        "np.take reads a table of shape (1, ..., 256) flattened; reshape(None) keeps the shape (numpy 1.24 and 2.x)",
    ),
    *[entry for new in ("copy=None", "", "copy=True") for entry in _each(_TABLE, "copy=False", new, _COPY)],
    *[
        entry
        for new in ("copy=None", "", "copy=True")
        for entry in _each("return (value.astype(out_type, copy=False),)", "copy=False", new, _COPY)
    ],
    *[
        (r"x = np\.asarray\(x, dtype=np\.float32\)", new, "DynamicQuantizeLinear's input is float32 by its schema")
        for new in ("x = np.asarray(x, dtype=None)", "x = np.asarray(x, )")
    ],
    *[
        (r"zp_float = np\.clip\(np\.float32\(0\) - low / scale, 0, 255\)", new, why)
        for new, why in (
            ("zp_float = np.clip(np.float32(0) - low / scale, None, 255)", "low <= 0 < scale: -low / scale >= 0"),
            (
                "zp_float = np.clip(np.float32(0) - low / scale, 0, None)",
                "high >= 0: -low / scale is 255 within float32 rounding at most, and rounds to 255",
            ),
            (
                "zp_float = np.clip(np.float32(0) - low / scale, 0, 256)",
                "high >= 0: -low / scale is 255 within float32 rounding at most, and rounds to 255",
            ),
        )
    ],
    *_each(
        'zp = arith.round_float(np.asarray(zp_float, np.float32), "half_even").astype(np.uint8)',
        ".astype(np.uint8)",
        ".astype(None)",
        "an integral zero point in [0, 255]: quantize_float casts it to its float type, the return to uint8",
    ),
    *[
        entry
        for new in ("None", "")
        for entry in _each(
            'zp = arith.round_float(np.asarray(zp_float, np.float32), "half_even").astype(np.uint8)',
            "np.float32)",
            f"{new})",
            "zp_float is float32 (numpy 2) or a float64 holding the float32 value (numpy 1.24's np.clip on scalars)",
        )
    ],
    *[
        entry
        for old, new, why in (
            ("np.float32)", "None)", "scale is a float32 scalar (a quotient of two)"),
            ("np.float32)", ")", "scale is a float32 scalar (a quotient of two)"),
            ("np.uint8)", "None)", "zp is uint8 already (astype(np.uint8))"),
            ("np.uint8)", ")", "zp is uint8 already (astype(np.uint8))"),
        )
        for entry in _each("return y, np.asarray(scale, np.float32), np.asarray(zp, np.uint8)", old, new, why)
    ],
]

# kernels: the elementwise kernels' dtype spellings, table paths and pair-table keys (backend/kernels/elementwise.py)
_ONE_VALUE = (
    "a parameter of one value: reshape(None) keeps its shape (numpy 1.24 and 2.x), and the table's 256 "
    "values broadcast against it to 256; quantize_float takes a size-1 scale or zero point as 0-d"
)
_FORMULAS_CAST = (
    "every pair formula casts its operands first (int64, float32 or float64, neon's int64): the grid's "
    "type does not reach the table"
)
_KEY = (
    "the pair-table key stays unique: an add key holds ten entries and a mul key seven, and the output type "
    "is the C zero point's (its dtype is in the key) or A's (in the full key)"
)
_SAME_T = "the op's schema gives its integer inputs and output one type T"
_ROLE = "a scratch buffer's role name: no other buffer alive in these calls has either name"
_CLIP_MODE = "every index is in range of the table (256 or 65536 entries): mode='clip' only avoids a copy"
_LOGISTIC = "float32 operands: the product is float32 already, and fma32 casts its operands to float32"
_LINE_TABLE = "return arith.quantize_float(out, np.asarray(y_scale, np.float32).reshape(()), zp, y_dtype, scheme)"
_LINE_DQ = "q, np.asarray(x_scale, np.float32).reshape(()), None if x_zp is None else np.asarray(x_zp).reshape(())"
_LINE_FN = "out = np.asarray(fn(v.astype(np.float32)), dtype=np.float32)"
_LINE_ZP = "zp = np.zeros((), y_dtype) if y_zp is None else np.asarray(y_zp).reshape(())"
_LINE_ADD_KEY = 'key = param_key("QLinearAdd", a_s, a_zp, b_s, b_zp, c_s, c_zp, np.dtype(dtype).str, scheme, spans)'
_LINE_MUL_KEY = 'key = param_key("QLinearMul", a_zp, b_zp, multiplier, c_zp, np.dtype(dtype).str, scheme)'
_LINE_POWER2 = (
    'arith.requantize(x.astype(np.int64) - zp, arith.real_multiplier([s], c_s, scheme), 0, np.int32, scheme, "add")'
)
_LINE_SCRATCH = 'index = parallel.scratch(x.size, np.uint16, "pair-index").reshape(x.shape)'
_LINE_SCRATCH_B = 'index = parallel.scratch(target.size, np.uint16, "pair-index").reshape(target.shape)'
EQUIVALENT += [
    *[
        (r"x = np\.asarray\(x, np\.float32\)", new, "logistic's one caller passes float32 values (the table's)")
        for new in ("x = np.asarray(x, None)", "x = np.asarray(x, )")
    ],
    (r"v2 = \(v \* v\)\.astype\(np\.float32\)", "v2 = (v * v).astype(None)", _LOGISTIC),
    (r"p = \(p \* v\)\.astype\(np\.float32\)", "p = (p * v).astype(None)", _LOGISTIC),
    *_each("q = np.arange(lo, hi + 1)", "hi + 1", "hi + 2", "a 257th table entry is never read (indices are q - qmin)"),
    *_each(_LINE_DQ, "reshape(())", "reshape(None)", _ONE_VALUE),
    *_each(_LINE_ZP, "reshape(())", "reshape(None)", _ONE_VALUE),
    *_each(_LINE_TABLE, "reshape(())", "reshape(None)", _ONE_VALUE),
    *[
        entry
        for new in ("dtype=None)", ")")
        for entry in _each(_LINE_FN, "dtype=np.float32)", new, "logistic, leaky, clip and identity give float32")
    ],
    *_each(
        _LINE_FN,
        "v.astype(np.float32)",
        "v.astype(None)",
        "v is float32 (the dequantized table): each fn gives the float32 value of its float64 result, rounded once",
    ),
    *[
        entry
        for new in ("None)", ")")
        for entry in _each(
            _LINE_ZP, "y_dtype)", new, "a float 0 zero point: quantize_float casts it to its float type, 0 either way"
        )
    ],
    *[
        entry
        for line in (
            'np.take(table, block, out=target, mode="clip")  # every byte is an index: "clip" avoids a copy',
            'np.take(table, index, out=out, mode="clip")  # every index is in range; "clip" avoids a copy',
            'np.take(raw, index, out=target, mode="clip")',
        )
        for new in ("mode=None", "")
        for entry in _each(line, 'mode="clip"', new, _CLIP_MODE)
    ],
    *_each(
        "if x.dtype == np.uint8 or x.dtype == np.int8:",
        " or ",
        " and ",
        "8-bit values through the general path: table[x - qmin] reads the same entries",
    ),
    *_each(
        "return table[x.astype(np.intp) - arith.qrange(x.dtype)[0]]",
        "- arith",
        "+ arith",
        "16-bit only: uint16's minimum is 0, and int16's x - 32768 counts from the end of its 65536 entries",
    ),
    (
        r"^dtype = _out_dtype\(Y_zero_point, X\)$",
        "dtype = _out_dtype(None, X)",
        "one type in and out: QLinearSigmoid's and QLinearLeakyRelu's schemas; fusion makes Requantize and "
        "QLinearLookup only where the DQ and the Q share a type",
    ),
    *_each("return np.where(v >= 0, v, (a * v).astype(np.float32))", "v >= 0", "v > 0", "0 and -0 stay 0 both ways"),
    *_each(
        "return np.where(v >= 0, v, (a * v).astype(np.float32))",
        ".astype(np.float32)",
        ".astype(None)",
        "a float64 product of float32 values, rounded once to float32 by the table (the float32 product)",
    ),
    *_each(
        "shape = (1,) * (len(out_shape) - x.ndim) + x.shape",
        "(1,)",
        "(2,)",
        "padding is read only at the output's last axis of size > 1; past x's own axes only when x has one value",
    ),
    *_each("fa, fb = a.astype(f32), b.astype(f32)", "a.astype(f32)", "a.astype(None)", _LOGISTIC),
    *_each("fa, fb = a.astype(f32), b.astype(f32)", "b.astype(f32)", "b.astype(None)", _LOGISTIC),
    *[
        entry
        for old, new in (("-32768, ", "None, "), ("32767)", "None)"), ("-32768", "-32769"), ("32767", "32768"))
        for entry in _each(
            "return arith.saturate(np.clip(np.rint(t), -32768, 32767), dtype)",
            old,
            new,
            "outputs of 8 or 16 bits: saturate() clamps past the int16 range anyway",
        )
    ],
    *[
        entry
        for new in ("None)", '"XXaddXX")', '"ADD")')
        for entry in _each(
            _LINE_POWER2,
            '"add")',
            new,
            "the family only decides when the zero point joins, and it is 0 here",
        )
    ],
    *_each(
        _LINE_POWER2,
        "x.astype(np.int64)",
        "x.astype(None)",
        "power2 and glow requantize cast the accumulator to int64: integral floats exact",
    ),
    *_each(
        "return arith.saturate(parts[0].astype(np.int64) + parts[1] + c_zp, dtype)",
        "parts[0].astype(np.int64)",
        "parts[0].astype(None)",
        "integral sums far below 2^53: saturate clamps and casts the same values",
    ),
    *_each(
        "table = _PAIR_TABLES.get(full_key) if full_key is not None else None",
        "if full_key is not None else",
        "if (full_key is not None) or True else",
        "tables are kept under a key only: get(None) is None",
    ),
    *_each("grid_a = np.arange(lo_a, lo_a + 256).astype(a.dtype)[:, None]", "a.dtype", "None", _FORMULAS_CAST),
    *_each("grid_b = np.arange(lo_b, lo_b + 256).astype(b.dtype)[None, :]", "b.dtype", "None", _FORMULAS_CAST),
    *_each(
        _LINE_SCRATCH,
        ".reshape(x.shape)",
        ".reshape(None)",
        "parallel.blockwise hands out flat blocks: x is 1-D, as the scratch buffer is",
    ),
    *[
        entry
        for line in (_LINE_SCRATCH, _LINE_SCRATCH_B)
        for new in ("None", '"XXpair-indexXX"', '"PAIR-INDEX"')
        for entry in _each(line, '"pair-index"', new, _ROLE)
    ],
    *[
        entry
        for new in ("dtype=None)", ")")
        for entry in _each(
            "np.multiply(x, np.uint16(256), out=index, dtype=np.uint16)  # measured: faster than copy + shift",
            "dtype=np.uint16)",
            new,
            "uint8 times a uint16 scalar is uint16 (numpy 1.24's value-based casting and numpy 2's NEP 50)",
        )
    ],
    *[
        entry
        for new in ("dtype=None)", ")")
        for entry in _each(
            "np.add(h, low, out=index, dtype=np.uint16)  # the low byte is free: adding is or-ing",
            "dtype=np.uint16)",
            new,
            "uint16 plus uint8 is uint16",
        )
    ],
    *_each(
        "lut = _operand_table(table, ua, ub, flips, out.shape)",
        "_operand_table(table, ua, ub, flips, out.shape)",
        "None",
        "the operand-table shortcut: the general gather reads the same pair table",
    ),
    *_each(
        "lut = _operand_table(table, ua, ub, flips, out.shape)",
        "out.shape)",
        "None)",
        "the operand-table shortcut: the general gather reads the same pair table",
    ),
    *_each(
        "if ua.size > ub.size:  # index by (b, a): the transposed table",
        "ua.size > ub.size",
        "ua.size >= ub.size",
        "the transposed table at equal sizes reads the same pairs",
    ),
    *_each(
        "raw = np.ascontiguousarray(square[rows[:, None], columns[None, :]]).reshape(-1)",
        ".reshape(-1)",
        ".reshape(None)",
        "np.take reads the (256, 256) table flattened",
    ),
    *[
        (r"^if out\.ndim == 0:$", new, "a 0-d output takes the operand-table path first: this branch is a shortcut")
        for new in ("if out.ndim != 0:", "if out.ndim == 1:")
    ],
    *[
        (r"^part\(out, xh, xl\)$", new, "a 0-d output takes the operand-table path first: never reached")
        for new in (
            "part(None, xh, xl)",
            "part(out, None, xl)",
            "part(out, xh, None)",
            "part(xh, xl)",
            "part(out, xl)",
            "part(out, xh, )",
        )
    ],
    *_each(
        "spans = parallel.split(out.shape[0], out[0].size)",
        "out.shape[0], out[0].size)",
        "out.shape[0], )",
        "the cost per row decides only whether rows go to threads: the spans cover every row",
    ),
    *[
        entry
        for line in (
            "fixed = (int(ub.reshape(-1)[0]) ^ (flips & 0xFF)) & 0xFF",
            "fixed = (int(ua.reshape(-1)[0]) ^ (flips >> 8)) & 0xFF",
        )
        for entry in _each(line, "reshape(-1)", "reshape(+1)", "an operand of one value: reshape(1) is reshape(-1)")
    ],
    *_each(
        "return table[(fixed << 8) | (np.arange(256) ^ (flips & 0xFF))]",
        "np.arange(256)",
        "np.arange(257)",
        "lookup_bytes reads bytes 0-255: a 257th entry is never read",
    ),
    *[
        entry
        for line, old in (("if not _eight_bit(A, B):", "_eight_bit(A, B)"),)
        for new in ("_eight_bit(B)", "_eight_bit(A, )")
        for entry in _each(line, old, new, _SAME_T)
    ],
    *[
        entry
        for old, new in (
            ('"QLinearAdd", ', "None, "),
            ('"QLinearAdd", ', ""),
            ('"QLinearAdd"', '"XXQLinearAddXX"'),
            ('"QLinearAdd"', '"qlinearadd"'),
            ('"QLinearAdd"', '"QLINEARADD"'),
            ("np.dtype(dtype).str, ", "None, "),
            ("np.dtype(dtype).str, ", ""),
            ("np.dtype(dtype)", "np.dtype(None)"),
        )
        for entry in _each(_LINE_ADD_KEY, old, new, _KEY)
    ],
    *[
        entry
        for old, new in (
            ('"QLinearMul", ', "None, "),
            ('"QLinearMul", ', ""),
            ('"QLinearMul"', '"XXQLinearMulXX"'),
            ('"QLinearMul"', '"qlinearmul"'),
            ('"QLinearMul"', '"QLINEARMUL"'),
            ("np.dtype(dtype).str, ", "None, "),
            ("np.dtype(dtype).str, ", ""),
            ("np.dtype(dtype)", "np.dtype(None)"),
        )
        for entry in _each(_LINE_MUL_KEY, old, new, _KEY)
    ],
    *[
        entry
        for old in ("a.astype(np.int64)", "b.astype(np.int64)")
        for entry in _each(
            "product = (a.astype(np.int64) - a_zp) * (b.astype(np.int64) - b_zp)",
            old,
            old.replace("np.int64", "None"),
            "an exact float64 product (below 2^53): requantize casts it to int64, or rounds it once to its float type",
        )
    ],
    *_each(
        "run.__name__ = op_type.lower()",
        "op_type.lower()",
        "op_type.upper()",
        "nothing reads a float kernel's __name__: the registry keys kernels by op type",
    ),
    *[
        entry
        for new in ("copy=None", "", "copy=True")
        for entry in _each(
            "return (y.astype(input.dtype, copy=False),)",
            "copy=False",
            new,
            "a copy or the input itself: the same values (Identity returns its input too)",
        )
    ],
]

# recipe: the pytest analysis' entry to the search (analysis/recipe/pair.py) and its estimates (estimate.py)
_VALID_QDQ = "in a valid graph no Constant has inputs and no DequantizeLinear reads a DequantizeLinear's (float) output"
_PAIR_TEMP = "the search's best model is written to a private temporary folder, deleted after the call"
EQUIVALENT += [
    *_each(
        "scale = view.constant(node.input[1])",
        "[1]",
        "[2]",
        "ONNX gives the zero point the scale's shape: its size says per channel the same",
    ),
    *_each(
        'view.producer.get(i, (0, None))[1] is not None and view.producer[i][1].op_type == "DequantizeLinear"',
        "(0, None)",
        "(1, None)",
        "only the default's second item (no producer) is read",
    ),
    *[
        entry
        for old, news in (
            ('"DequantizeLinear", "Constant")', ('"XXDequantizeLinearXX"', '"dequantizelinear"', '"DEQUANTIZELINEAR"')),
            ('"Constant")', ('"XXConstantXX"', '"constant"', '"CONSTANT"')),
        )
        for new in news
        for entry in _each(
            'if node.op_type not in ("QuantizeLinear", "DequantizeLinear", "Constant")',
            old.split(",")[0] if old.startswith('"Dequantize') else old.removesuffix(")"),
            new,
            _VALID_QDQ,
        )
    ],
    *_each(
        "evaluation = Head(load_dataset(data), count - head, skip=head)",
        "count - head",
        "count + head",
        "Head takes at most the records after skip: count - head of them either way",
    ),
    *[
        entry
        for new in ("None", '"XXqaccuracy-pair-recipe-XX"', '"QACCURACY-PAIR-RECIPE-"')
        for entry in _each(
            'with tempfile.TemporaryDirectory(prefix="qaccuracy-pair-recipe-") as tmp:',
            '"qaccuracy-pair-recipe-"',
            new,
            _PAIR_TEMP,
        )
    ],
    *[
        entry
        for new in ('"XXbest.onnxXX"', '"BEST.ONNX"')
        for entry in _each('best = Path(tmp) / "best.onnx"', '"best.onnx"', new, _PAIR_TEMP)
    ],
    *[
        entry
        for new in ('"XXestimateXX"', '"ESTIMATE"')
        for entry in _each(
            'out.append(judge({"estimate": metrics}, checks).margin)',
            '"estimate"',
            new,
            "judge reads a measurement's targets by value, never by their name",
        )
    ],
    *_each(
        "key=lambda n: (-(drops.get(n, 0.0) / max(cost(n), 1e-9)), cost(n)),",
        "0.0",
        "1.0",
        "drops has every node or none: with none, -(1 / cost) then cost orders as cost does",
    ),
]

# recipe: the model writer (analysis/recipe/build.py)
_RECIPE_TEMP = "onnxruntime's calibrator and the cache file are staged in a private temporary folder, deleted after"
_ONLY_MINMAX = (
    "ESTIMATED_AS maps onnxruntime's MinMax and Entropy to minmax, which needs no histogram: a None key gives the same"
)
EQUIVALENT += [
    *[
        entry
        for new in ("None", '"XXqaccuracy-recipe-XX"', '"QACCURACY-RECIPE-"')
        for entry in _each(
            'with tempfile.TemporaryDirectory(prefix="qaccuracy-recipe-") as tmp:',
            '"qaccuracy-recipe-"',
            new,
            _RECIPE_TEMP,
        )
    ],
    *[
        entry
        for new in ('"XXranges.jsonXX"', '"RANGES.JSON"')
        for entry in _each('staged = Path(tmp) / "ranges.json"', '"ranges.json"', new, _RECIPE_TEMP)
    ],
    *[
        entry
        for new in ('"XXaugmented.onnxXX"', '"AUGMENTED.ONNX"')
        for entry in _each(
            'augmented_model_path=str(Path(tmp) / "augmented.onnx"),', '"augmented.onnx"', new, _RECIPE_TEMP
        )
    ],
    *_each(
        "kind = C.HISTOGRAM_OF.get(ESTIMATED_AS.get(method, method))",
        "ESTIMATED_AS.get(method,",
        "ESTIMATED_AS.get(None,",
        _ONLY_MINMAX,
    ),
    *_each(
        "kind = C.HISTOGRAM_OF.get(ESTIMATED_AS.get(recipe.method, recipe.method))",
        "ESTIMATED_AS.get(recipe.method,",
        "ESTIMATED_AS.get(None,",
        _ONLY_MINMAX,
    ),
    *[
        entry
        for new in ("None", "")
        for entry in _each(
            "return ORT_PASSES.get(recipe.method, max(ORT_PASSES.values())) * self.pass_seconds",
            "max(ORT_PASSES.values())",
            new,
            "every method of ORT_METHODS has its ORT_PASSES entry: the default is never read",
        )
    ],
    *[
        entry
        for new in ("strict=None", "", "strict=False")
        for entry in _each(
            'self._estimated[key] = dict(zip(stats["names"], pool.map(one, stats["names"]), strict=True))',
            "strict=True",
            new,
            "pool.map gives one result per name: the two are always the same length",
        )
    ],
]

# recipe: the search (analysis/recipe/search.py)
_ONE_PER_NODE = "cost_ordered yields one level per node: zip's lengths agree"
_ONE_PER_SET = "the estimator gives one margin per set (per node dropped): zip's lengths agree"
EQUIVALENT += [
    *[
        entry
        for new in ("strict=None", "", "strict=False")
        for line, reason in (
            ("recipe = base.with_nodes(dict(zip(nodes, assignment, strict=True)))", _ONE_PER_NODE),
            ("precisions = dict(zip(nodes, assignment, strict=True))", _ONE_PER_NODE),
            (
                'for size, found in zip(sizes, estimator.margins([order[:k] for k in sizes], "short prefixes"), '
                "strict=True):",
                _ONE_PER_SET,
            ),
            ("missed.update(n for n, m in zip(costly, margins, strict=True) if m < 0)", _ONE_PER_SET),
            ("drops = [n for n, m in zip(costly, margins, strict=True) if m >= 0]", _ONE_PER_SET),
        )
        for entry in _each(line, "strict=True", new, reason)
    ],
    *_each(
        "slow = sorted((m for m in self.methods if method_rank(m)[0]), key=method_rank)",
        "method_rank(m)[0]",
        "method_rank(m)[1]",
        "method_rank is (0, 0.0) or (1, a histogram's passes > 0): either item is true for the same methods",
    ),
    *[
        entry
        for new in ("None", "")
        for entry in _each(
            "graph = QdqGraph(load_model(path), None, path.name)",
            "path.name",
            new,
            "QdqGraph's name is read only by the error of a node lookup, which _candidates never makes",
        )
    ],
    *_each(
        "space.insert(0, base.with_nodes({}))",
        "insert(0,",
        "insert(1,",
        "the sort puts the base first; the others keep their order either way",
    ),
    (r"^improved = False$", "improved = None", "improved is read only for its truth"),
    *_each(
        'dimension = change.partition("=")[0]',
        "partition(",
        "rpartition(",
        "a global move's change has one '=' (choice=value)",
    ),
    *_each(
        "value = (dimension, getattr(recipe, dimension, None))",
        "getattr(recipe, dimension, None)",
        "getattr(recipe, dimension, )",
        "every global move's dimension is a Recipe field: the default is never read",
    ),
    *_each(
        "if first.skipped is not None or first.margin is None:",
        " or ",
        " and ",
        "an estimate is skipped exactly when it has no margin",
    ),
    *_each(
        "before = known.margin if known.skipped is None and known.margin is not None else -math.inf",
        " and ",
        " or ",
        "a step is skipped exactly when it has no margin",
    ),
    *_each(
        "refused = refusal(base.with_move(kind, flippable[0]))",
        "flippable[0]",
        "None",
        "refusal reads whether the moved nodes' sets are empty, not which nodes they hold",
    ),
    *[
        entry
        for new in ("None", '"XXint8XX"', '"INT8"')
        for entry in _each(
            'recipe = recipe.with_precision(node, "int8")',
            '"int8"',
            new,
            "with_precision puts a node at any precision but int16 and float in int8",
        )
    ],
    (r"^tmp = None$", 'tmp = ""', "a workdir given: shutil.rmtree('', ignore_errors=True) removes nothing"),
]

MUTMUT = [sys.executable, "-c", "import sys; from mutmut.__main__ import cli; sys.exit(cli())"]


def status(exit_code: int | None) -> str:
    """mutmut's verdict for a worker's exit code."""
    return STATUS.get(exit_code, "suspicious")


def copy_tree(dest: Path, rev: str | None) -> None:
    """Copy the package, the tests and pyproject.toml into dest: from commit ``rev``, or else from
    the work tree (tracked and new files, not ignored ones)."""
    paths = [PACKAGE, "tests", "example_suites", "pyproject.toml"]
    if rev is not None:
        archive = subprocess.run(["git", "archive", rev, "--", *paths], cwd=ROOT, check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
        return
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *paths],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in (n.decode() for n in listed if n):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def undecorated(source: str) -> str:
    """``source`` with every decorated module-level function written as the function, then its name
    bound to the decorated one (``f = d1(d2(f))``): the same module, and one mutmut 3 mutates (it
    leaves decorated functions alone, so a registry's kernels and metrics would go untested)."""
    lines = source.splitlines(keepends=True)
    functions = [
        node
        for node in ast.parse(source).body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.decorator_list
    ]
    for node in reversed(functions):  # from the end, so earlier line numbers stay valid
        calls = node.name
        for decorator in reversed(node.decorator_list):
            calls = f"({ast.get_source_segment(source, decorator)})({calls})"
        first, start, end = node.decorator_list[0].lineno - 1, node.lineno - 1, node.end_lineno
        lines[first:end] = [*lines[start:end], f"{node.name} = {calls}\n"]
    return "".join(lines)


def undecorate(dest: Path, group: Group) -> None:
    """Rewrite the group's modules in the copy ``dest`` with :func:`undecorated`."""
    for path in sorted((dest / PACKAGE).rglob("*.py")):
        module = str(path.relative_to(dest / PACKAGE))
        if any(fnmatch(module, pattern) for pattern in group.modules):
            path.write_text(undecorated(path.read_text()))


def toml_list(items: list[str]) -> str:
    """A TOML array of strings."""
    return "[" + ", ".join(json.dumps(item) for item in items) + "]"


def plugin_options(tests: tuple[str, ...]) -> list[str]:
    """The ``-p NAME`` options among a group's test arguments. mutmut passes the test arguments only to
    its stats, collection and forced-fail runs; a mutant's run gets its test ids and
    ``pytest_add_cli_args``. So a plugin a group keeps out (``-p no:qaccuracy``: the plugin's own hooks,
    mutated, must not run in the session that runs the tests) goes into both."""
    return [x for i in range(len(tests) - 1) if tests[i] == "-p" for x in tests[i : i + 2]]


def write_config(dest: Path, group: Group) -> None:
    """Append the group's [tool.mutmut] table to the copy's pyproject.toml."""
    run_args = ["-p", "no:cacheprovider", "-p", "no:xdist", "-W", "ignore", *plugin_options(group.tests)]
    config = {
        "source_paths": toml_list([PACKAGE]),
        "only_mutate": toml_list([f"{PACKAGE}/{module}" for module in group.modules]),
        "pytest_add_cli_args_test_selection": toml_list(list(group.tests)),
        "also_copy": toml_list(["example_suites"]),  # the tests read its models and data
        "pytest_add_cli_args": toml_list(run_args),
        "use_git_change_detection": "false",
        "use_setproctitle": "false",
    }
    pyproject = dest / "pyproject.toml"
    text = re.sub(r"(?ms)^\[tool\.mutmut\].*?(?=^\[|\Z)", "", pyproject.read_text())
    lines = "\n".join(f"{key} = {value}" for key, value in config.items())
    pyproject.write_text(f"{text}\n[tool.mutmut]\n{lines}\n")


@dataclass(frozen=True)
class Mutant:
    """One mutant: its name, the file it changes, mutmut's verdict and, unless killed, its diff."""

    name: str
    module: str
    verdict: str
    diff: str = ""


def run_group(name: str, group: Group, workdir: Path, jobs: int, rev: str | None) -> list[Mutant]:
    """Run mutmut on one group in a fresh copy; return every mutant with its verdict."""
    dest = workdir / name
    dest.mkdir(parents=True)
    copy_tree(dest, rev)
    undecorate(dest, group)
    write_config(dest, group)
    # made now: a sys.path entry that does not exist at start-up is never looked at again
    (dest / "mutants").mkdir()
    # subprocesses started by the tests (CLI runs, pytester) import the mutated copy too
    env = {**os.environ, "PYTHONPATH": str(dest / "mutants"), "PYTHONDONTWRITEBYTECODE": "1"}
    log = dest / "mutmut.log"
    with log.open("w") as out:
        done = subprocess.run([*MUTMUT, "run", "--max-children", str(jobs)], cwd=dest, env=env, stdout=out, stderr=out)
    if done.returncode != 0:
        sys.exit(f"mutmut failed on group {name}; see {log}:\n" + log.read_text()[-3000:])
    return read_results(dest)


def read_results(dest: Path) -> list[Mutant]:
    """The verdicts mutmut left in ``dest/mutants/**.meta``, with the diff of every mutant not killed."""
    from mutmut.configuration import reset_config
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    mutants = []
    cwd = Path.cwd()
    os.chdir(dest)  # mutmut reads its config and the mutated files from the current folder
    try:
        reset_config()
        for meta in sorted(Path("mutants").rglob("*.py.meta")):
            module = str(meta.relative_to("mutants"))[: -len(".meta")]
            for mutant, code in json.loads(meta.read_text())["exit_code_by_key"].items():
                verdict = status(code)
                diff = "" if verdict in KILLED else get_diff_for_mutant(mutant, path=module)
                mutants.append(Mutant(mutant, module.removeprefix(PACKAGE + "/"), verdict, diff))
    finally:
        os.chdir(cwd)
    return mutants


# metrics/pair.py: the per-record sums' work arrays are a saving of page faults, not of values: a fresh
# array (out=None, or no out=), or an unused slot (None) gives the same sums, and d (f - q) may take
# slot 1 once |f| has been summed. Slot 2 (the dequantized q) and a float32 array for float64 values
# are not equivalent: tests/test_metric_edges.py kills both.
EQUIVALENT += [
    (r"out=scratch\(([01]), f\.shape, f\.dtype\)", new, "a work array only saves allocations (metrics/pair.py)")
    for new in ("out=None", "", r"out=scratch(None, f.shape, f.dtype)")
]
EQUIVALENT += [
    (
        r"d = np\.subtract\(f, q, out=scratch\(0, f\.shape, f\.dtype\)\)",
        "d = np.subtract(f, q, out=scratch(1, f.shape, f.dtype))",
        "slot 1 holds |f| only until its sum is taken, before d is made",
    )
]

EQUIVALENT += [
    (
        r'version\("pytest-qaccuracy"\)',
        'version("PYTEST-QACCURACY")',
        "importlib.metadata normalizes a distribution's name (PEP 503): any case finds the package",
    )
]
# metrics/detection.py's box areas: a box with no area (x2 < x1 or y2 < y1) meets no other box, so its
# IoU is 0 whatever its area is taken to be (0 / union, or 0 where the union is not positive); the
# areas are of (n, 2) arrays, whose last axis is axis 1
EQUIVALENT += [
    (
        r"np\.clip\(([ab])\[:, 2:\] - ([ab])\[:, :2\], 0, None\)",
        r"np.clip(\1[:, 2:] - \2[:, :2], None, None)",
        "a box without area meets no box: its IoU is 0 with any area (metrics/detection.py)",
    ),
    (
        r"(np\.clip\([ab]\[:, 2:\] - [ab]\[:, :2\], 0, None\)), axis=-1\)",
        r"\1, axis=+1)",
        "the widths and heights are an (n, 2) array: axis -1 is axis 1",
    ),
]


def changed_lines(diff: str) -> tuple[str, str]:
    """The removed and the added lines of a mutant's diff, each joined and stripped."""
    lines = diff.splitlines()[2:]  # past the --- / +++ header
    old = " ".join(x[1:].strip() for x in lines if x.startswith("-"))
    new = " ".join(x[1:].strip() for x in lines if x.startswith("+"))
    return old, new


EQUIVALENT += [
    (r"_lines\(values\.get\(([^()]*), \[\]\)\)", new, "_lines reads a missing key's None as no lines, as []")
    for new in (r"_lines(values.get(\1, None))", r"_lines(values.get(\1, ))")
]


def equivalent(mutant: Mutant) -> str | None:
    """The reason a surviving mutant cannot change behaviour, or None (see EQUIVALENT)."""
    if mutant.verdict in KILLED or not mutant.diff:
        return None
    old, new = changed_lines(mutant.diff)
    for pattern, replacement, reason in EQUIVALENT:
        for match in re.finditer(pattern, old):  # mutmut changes one place at a time
            if old[: match.start()] + match.expand(replacement) + old[match.end() :] == new:
                return reason
    return None


def _score_line(label: str, counts: Counter[str]) -> float:
    """Print one row of the table; return its score in percent."""
    total = sum(n for verdict, n in counts.items() if verdict not in ("skipped", "equivalent"))
    killed = sum(counts[verdict] for verdict in KILLED)
    score = 100.0 * killed / total if total else 100.0
    others = ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items()) if verdict not in KILLED)
    print(f"{label:30} {killed:>7} {total:>6} {score:>6.1f}%  {others}")
    return score


def print_scores(mutants: list[Mutant], elapsed: dict[str, float]) -> list[tuple[str, float]]:
    """Print killed/total per file, then per listed module (a group's files together); return the
    listed modules' scores in percent. Equivalent mutants are counted apart."""
    by_file: dict[str, Counter[str]] = {}
    for mutant in mutants:
        verdict = "equivalent" if equivalent(mutant) else mutant.verdict
        by_file.setdefault(mutant.module, Counter())[verdict] += 1
    print(f"{'file':30} {'killed':>7} {'total':>6} {'score':>7}  not killed")
    for module in sorted(by_file):
        _score_line(module, by_file[module])
    print(f"\n{'listed module':30} {'killed':>7} {'total':>6} {'score':>7}  not killed")
    scores = []
    for group in GROUPS.values():
        files = [f for f in by_file if any(fnmatch(f, pattern) for pattern in group.modules)]
        if files:
            label = " ".join(m.removesuffix("*") for m in group.modules)
            scores.append((label, _score_line(label, sum((by_file[f] for f in files), Counter()))))
    _score_line("all", sum(by_file.values(), Counter()))
    print("time: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in elapsed.items()))
    return scores


def print_survivors(mutants: list[Mutant]) -> None:
    """Print the diff of every mutant not killed (equivalent ones with their reason)."""
    for mutant in mutants:
        if mutant.verdict not in KILLED | {"skipped"}:
            reason = equivalent(mutant)
            label = f"equivalent ({reason})" if reason else mutant.verdict
            print(f"--- {label}: {mutant.name}\n{mutant.diff}\n")


def print_coverage() -> None:
    """Print the share of the library's files and lines (``wc -l``) that some group mutates, and
    every package's files that none does."""
    files = sorted((ROOT / PACKAGE).rglob("*.py"))
    lines = {f: len(f.read_text().splitlines()) for f in files}
    modules = {f: str(f.relative_to(ROOT / PACKAGE)) for f in files}
    covered = {f for f in files if any(fnmatch(modules[f], p) for g in GROUPS.values() for p in g.modules)}
    share = sum(lines[f] for f in covered)
    total = sum(lines.values())
    print(f"groups mutate {len(covered)} of {len(files)} files, {share} of {total} lines ({100 * share / total:.0f} %)")
    left: dict[str, list[str]] = {}
    for f in files:
        if f not in covered and lines[f] > 0:
            package = modules[f].rpartition("/")[0] or "."
            left.setdefault(package, []).append(f"{Path(modules[f]).name} ({lines[f]})")
    for package, names in sorted(left.items()):
        print(f"not mutated in {package}/: {', '.join(names)}")


def main(argv: list[str] | None = None) -> int:
    """Run the chosen groups and print the score per module."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", nargs="+", choices=sorted(GROUPS), default=list(GROUPS), help="groups to run")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="mutants run at once")
    parser.add_argument("--fail-under", type=float, default=0.0, help="fail if a module's score is lower (percent)")
    parser.add_argument("--survivors", action="store_true", help="print the diff of each mutant not killed")
    parser.add_argument("--rev", help="mutate this commit (e.g. HEAD) instead of the work tree")
    parser.add_argument("--keep", action="store_true", help="keep the copies (their path is printed)")
    parser.add_argument("--coverage", action="store_true", help="print what the groups mutate and stop")
    args = parser.parse_args(argv)
    if args.coverage:
        print_coverage()
        return 0

    if args.rev is not None:  # one commit for every group, even if the branch moves meanwhile
        args.rev = subprocess.run(
            ["git", "rev-parse", "--verify", f"{args.rev}^{{commit}}"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    workdir = Path(tempfile.mkdtemp(prefix="qaccuracy-mutation-"))
    mutants: list[Mutant] = []
    elapsed: dict[str, float] = {}
    try:
        for name in args.group:
            start = time.monotonic()
            mutants += run_group(name, GROUPS[name], workdir, args.jobs, args.rev)
            elapsed[name] = time.monotonic() - start
            print(f"{name}: {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
        elapsed["total"] = sum(elapsed.values())
        if args.survivors:
            print_survivors(mutants)
        scores = print_scores(mutants, elapsed)
    finally:
        if args.keep:
            print(f"copies kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    low = [f"{module} {score:.1f}%" for module, score in scores if score < args.fail_under]
    if low:
        print(f"below {args.fail_under:g}%: {', '.join(low)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
