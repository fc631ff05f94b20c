"""The report layer is library core: importing it must not import pytest (STYLE 1)."""

from __future__ import annotations

import subprocess
import sys


def test_report_modules_do_not_import_pytest():
    code = (
        "import sys\n"
        "import pytest_qaccuracy.report.tables, pytest_qaccuracy.report.visq, pytest_qaccuracy.report.dot\n"
        "import pytest_qaccuracy.report.html, pytest_qaccuracy.commands.report\n"
        "assert 'pytest' not in sys.modules, 'pytest was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
