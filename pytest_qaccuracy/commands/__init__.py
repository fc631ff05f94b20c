"""Sub-commands of the ``qaccuracy`` command line; see :mod:`pytest_qaccuracy.cli`."""
