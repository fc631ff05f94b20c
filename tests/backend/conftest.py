"""Integer-backend tests import their model builders from ``backend_models`` (next to this file)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
logging.getLogger("root").setLevel(logging.ERROR)  # ORT's quantizer warns about pre-processing
