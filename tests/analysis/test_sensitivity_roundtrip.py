"""Sensitivity results round-trip through plain JSON (what a pytest-xdist worker sends the controller)."""

from __future__ import annotations

import json

import pytest

from pytest_qaccuracy.analysis.cumulative import CumulativeResult
from pytest_qaccuracy.analysis.sensitivity_report import SensitivityReport, analyse_pair
from pytest_qaccuracy.analysis.sweep import SweepResult
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.report.sensitivity_tables import report_lines, write_report


def _through_json(data: dict) -> dict:
    return json.loads(json.dumps(data, allow_nan=False))


def test_report_round_trips_through_json(zoo, damaged, tmp_path):
    report = analyse_pair(ModelPair(zoo["fp32"], damaged), zoo["data"], "cosine,mse", target="cosine>=0.999")
    sweep = SweepResult.from_dict(_through_json(report.sweep.to_dict()))
    assert sweep == report.sweep and sweep.nodes_to_exclude() == "nodes_to_exclude=['conv3']"
    curves = CumulativeResult.from_dict(_through_json(report.cumulative.to_dict()))
    assert curves.to_dict() == report.cumulative.to_dict() and curves.chart_data() == report.cumulative.chart_data()
    again = SensitivityReport.from_dict(_through_json(report.to_dict()))
    assert again.to_dict() == report.to_dict() and report_lines(again, 3) == report_lines(report, 3)
    written = write_report(again, tmp_path, stem="other")
    names = sorted(f"other.{k}.json" for k in ("cumulative", "cumulative.chart", "sensitivity", "sweep"))
    assert sorted(p.name for p in written) == names


def test_round_trip_without_target_and_unsupported(zoo):
    report = analyse_pair(ModelPair(zoo["fp32"], zoo["qdq_u8"]), zoo["data"], cumulative=False)
    again = SensitivityReport.from_dict(_through_json(report.to_dict()))
    assert again.sweep is None and again.cumulative is None and again.to_dict() == report.to_dict()
    qop = analyse_pair(ModelPair(zoo["fp32"], zoo["qop_u8"]), zoo["data"])
    assert SensitivityReport.from_dict(_through_json(qop.to_dict())) == qop


def test_from_dict_refuses_other_documents(zoo, damaged):
    report = analyse_pair(ModelPair(zoo["fp32"], damaged), zoo["data"], target="cosine>=0.999")
    with pytest.raises(ValueError, match="not a sweep result"):
        SweepResult.from_dict(report.cumulative.to_dict())
    with pytest.raises(ValueError, match="not a cumulative result"):
        CumulativeResult.from_dict(report.sweep.to_dict())
    with pytest.raises(ValueError, match="not a sensitivity report"):
        SensitivityReport.from_dict(report.sweep.to_dict())
