"""pytest plugin entry point (``pytest11`` = ``pytest_qaccuracy.plugin``)."""
