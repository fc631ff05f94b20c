"""Exceptions raised by pytest-qaccuracy.

Everything derives from :class:`QAccuracyError`. Input errors (bad files, shapes, options) derive
from :class:`InputError`; the CLI maps them to exit code 2 with a one-line ``error:`` message.
"""

from __future__ import annotations


class QAccuracyError(Exception):
    """Base class of every error pytest-qaccuracy raises on purpose."""


class InputError(QAccuracyError):
    """Bad input from the user: a file, a tensor, a record or an option is not what was expected."""


class DataError(InputError):
    """A dataset cannot be read, or does not fit the model it is fed to."""


class ModelError(InputError):
    """A model cannot be loaded, or the two models of a pair do not agree."""


class MetricError(InputError):
    """An unknown metric, or a metric registered twice."""


class CheckError(QAccuracyError):
    """An unexpected exception while checking a pair, as one line that names the pair (when known),
    the output or layer and the cause; the original exception is chained (``__cause__``)."""


class UnsupportedOpError(QAccuracyError):
    """An op that the emulated integer backend cannot run; the message names node, op and domain."""
