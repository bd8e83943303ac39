"""Benchmarks: every step measured side by side (``python -m bench --help``)."""
