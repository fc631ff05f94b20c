"""``qaccuracy sensitivity``: tables, JSON, exit codes."""

from __future__ import annotations

import json

from pytest_qaccuracy.cli import main


def test_single_mode_prints_a_ranked_table_and_writes_json(zoo, damaged, tmp_path, capsys):
    out = tmp_path / "sens.json"
    code = main(["sensitivity", str(zoo["fp32"]), str(damaged), "--data", str(zoo["data"]), "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert printed.splitlines()[3].split()[:3] == ["1", "conv3", "Conv"]
    data = json.loads(out.read_text())["sensitivity"]
    assert data["mode"] == "single" and data["nodes"][0]["node"] == "conv3"
    assert {"node", "op_type", "metrics"} <= set(data["nodes"][0]) and "cosine" in data["nodes"][0]["metrics"]


def test_target_exit_codes_and_suggestion(zoo, damaged, tmp_path, capsys):
    args = ["sensitivity", str(zoo["fp32"]), str(damaged), "--data", str(zoo["data"]), "--mode", "leave-one-out"]
    assert main([*args, "--target", "cosine>=0.999", "--out-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "nodes_to_exclude=['conv3']" in printed
    assert json.loads((tmp_path / "net.damaged.sweep.json").read_text())["suggestion"] == ["conv3"]
    assert main([*args, "--target", "cosine>=0.999", "--sweep", "0"]) == 1  # excluding nothing is not enough
    assert "no exclusion list up to 0 node(s)" in capsys.readouterr().out


def test_cumulative_mode_writes_the_curve_as_chart_data(zoo, tmp_path, capsys):
    code = main(
        [
            "sensitivity",
            str(zoo["fp32"]),
            str(zoo["qdq_u8"]),
            "--data",
            str(zoo["data"]),
            "--mode",
            "cumulative",
            "--average-mode",
            "--exclude-nodes",
            "conv1,conv2",
            "--out-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    chart = json.loads((tmp_path / "net.qdq_u8.cumulative.chart.json").read_text())
    assert chart["series"][0]["name"] == "all but conv1,conv2" and len(chart["x"]) == 11
    assert "average mode" in capsys.readouterr().out


def test_bad_input_is_one_error_line_and_exit_2(zoo, capsys):
    base = ["sensitivity", str(zoo["fp32"])]
    assert main([*base, str(zoo["qop_u8"]), "--data", str(zoo["data"])]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "needs a QDQ model" in err and len(err.strip().splitlines()) == 1
    assert main([*base, str(zoo["qdq_u8"]), "--data", str(zoo["data"]), "--nodes", "nope"]) == 2
    assert "no quantized node 'nope'" in capsys.readouterr().err
    assert main([*base, str(zoo["qdq_u8"]), "--data", str(zoo["data"]), "--metrics", "bogus"]) == 2
    assert "unknown metric 'bogus'" in capsys.readouterr().err


def test_options_of_another_mode_are_refused(zoo, capsys):
    base = ["sensitivity", str(zoo["fp32"]), str(zoo["qdq_u8"]), "--data", str(zoo["data"])]
    assert main([*base, "--mode", "cumulative", "--target", "cosine>=0.99"]) == 2
    assert "apply to --mode single or leave-one-out" in capsys.readouterr().err
    assert main([*base, "--average-mode"]) == 2
    assert "apply to --mode cumulative" in capsys.readouterr().err


def test_records_limits_the_analysis_to_the_first_records(zoo, damaged, tmp_path, capsys):
    base = ["sensitivity", str(zoo["fp32"]), str(damaged), "--data", str(zoo["data"])]
    assert main([*base, "--records", "5", "--json", str(tmp_path / "five.json")]) == 0
    assert "(5 records)" in capsys.readouterr().out.splitlines()[0]
    assert json.loads((tmp_path / "five.json").read_text())["sensitivity"]["records"] == 5
    assert main([*base, "--records", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --records must be >= 1, got 0"
