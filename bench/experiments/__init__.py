"""One-off experiments beside the benchmark tool: one file per question (README.md lists them)."""
