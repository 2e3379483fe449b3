"""Fixtures of the inference tests; the data they come from is in inference_refdata.py."""

from inference_refdata import checkpoint, example_vars, hardware, services  # noqa: F401  (pytest fixtures)
