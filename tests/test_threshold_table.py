"""benchmark/threshold_table.py: the first step at which the trailing mean reaches a threshold, against a plain loop."""

import importlib.util
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("benchmark_threshold_table", REPO / "benchmark" / "threshold_table.py")
threshold_table = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = threshold_table
spec.loader.exec_module(threshold_table)


def first_step_by_loop(steps, returns, threshold, window):
    for end in range(window, len(returns) + 1):
        if sum(returns[end - window : end]) / window >= threshold:
            return int(steps[end - 1])
    return None


def test_first_step_at_matches_a_plain_loop():
    rng = np.random.default_rng(0)
    for _ in range(50):
        returns = np.cumsum(rng.integers(-3, 6, size=rng.integers(1, 40))).astype(float)
        steps = np.cumsum(rng.integers(1, 30, size=len(returns)))
        for threshold in (-5.0, 0.0, 10.0, 40.0):
            for window in (1, 5, 10):
                expected = first_step_by_loop(steps, returns, threshold, window)
                assert threshold_table.first_step_at(steps, returns, threshold, window) == expected


def test_first_step_at_needs_a_full_window():
    steps, returns = np.array([10, 20, 30]), np.array([500.0, 500.0, 500.0])
    assert threshold_table.first_step_at(steps, returns, 475, window=4) is None
    assert threshold_table.first_step_at(steps, returns, 475, window=3) == 30
    assert threshold_table.first_step_at(steps, np.array([400.0, 500, 500]), 475, window=2) == 30
