"""The plugin's settings as a test needs them: every field given, the ones a test names changed."""

from __future__ import annotations

from typing import Any

from pytest_qaccuracy.plugin.settings import QAccuracySettings

#: what ``load_settings`` gives with no option set, but onnxruntime's CPU provider named
DEFAULTS: dict[str, Any] = {
    "tolerances": {},
    "metrics": None,
    "rules": (),
    "max_drift": (),
    "artifacts_dir": None,
    "providers": ("CPUExecutionProvider",),
    "batch_size": 64,
    "baseline_dir": None,
    "save_baseline_dir": None,
    "junit_properties": False,
    "sensitivity": "off",
}


def plugin_settings(**changes: Any) -> QAccuracySettings:
    """:class:`QAccuracySettings` of :data:`DEFAULTS` with ``changes``."""
    return QAccuracySettings(**{**DEFAULTS, **changes})
