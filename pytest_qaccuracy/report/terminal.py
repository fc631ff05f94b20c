"""Text bound for a terminal: names from model files must not carry escape sequences to it.

A tensor named ``"\\x1b[2J"`` would clear the screen if printed raw. Tables, the pytest summary and
``error:`` lines pass their text through :func:`escape_control`; JSON keeps names exact.
:func:`match_warning` flags a pair whose quantized model does not look derived from the fp32 one.
"""

from __future__ import annotations

import re

#: C0 and C1 control characters (but newline), DEL, and the Unicode line separators and bidi controls.
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def escape_control(text: str) -> str:
    """``text`` with every control character written as its Python escape (``\\x1b``, ``\\t``)."""
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], text)


def match_warning(matched: int, unmatched: int) -> str | None:
    """A warning when fewer than half of the fp32 model's layers have a quantized counterpart.

    ``matched`` counts the compared layers, ``unmatched`` the fp32 tensors left without a match. A
    result without layers (``--outputs-only``) gets no warning.
    """
    total = matched + unmatched
    if matched == 0 or 2 * matched >= total:
        return None
    return f"warning: only {matched} of {total} layers matched: are these the same model?"
