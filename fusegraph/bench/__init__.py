"""Benchmark commands (``python -m fusegraph bench <subject>``): one module per subject, each printing a
table of medians over warm runs, with ratios against the alternatives measured side by side in the same run."""
