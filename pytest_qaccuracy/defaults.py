"""Defaults that the plugin, the command line and the library share: one value each. Pure: no imports."""

#: records per run (``qaccuracy_batch_size``, ``--batch-size``, ``RuntimeOptions.batch_size``)
BATCH_SIZE = 8
#: rows of a ranking printed (``qaccuracy_sensitivity_top``, ``--top``, the ``top`` of ``report/``'s tables)
TOP = 10
