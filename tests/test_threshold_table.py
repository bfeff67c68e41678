"""benchmark/threshold_table.py: the first step at which the trailing mean reaches a threshold, against a plain loop, and
its table of the runs of a real short sweep of cleanrl/pqn.py."""

import benchmark_runs
import numpy as np
import pytest
from benchmark_runs import load_benchmark_module

pqn_sweep = benchmark_runs.pqn_sweep  # the fixture, made once per test session
threshold_table = load_benchmark_module("threshold_table")
run_reading = threshold_table.run_reading


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


def test_table_of_a_real_sweep(pqn_sweep, capsys):
    runs_dir, finished, folders, left_out = pqn_sweep
    threshold = 100.0  # seed 1 of this sweep reaches it, seed 2 does not (checked both ways below)
    argv = ["--runs-dir", str(runs_dir), "--env-ids", "CartPole-v1", "--thresholds", str(threshold)]
    argv += ["--exp-names", "pqn", "--seeds", "1", "2", "3", "--total-timesteps", "8192", "--last-episodes", "10"]
    assert threshold_table.main(argv) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[2].strip(): line for line in out.splitlines() if line.startswith("| pqn | ")}
    assert sorted(rows) == ["1", "2"]  # seed 2's folder ends in _2; seed 3 ran 4096 steps
    for seed, folder in ((1, folders["newer"]), (2, folders["suffixed"])):
        run = run_reading.read_run(folder)
        first = first_step_by_loop(run.steps, run.returns, threshold, 10)
        cells = [cell.strip() for cell in rows[str(seed)].split("|")[1:-1]]
        assert cells[2] == f"{np.mean(run.returns[-10:]):.1f}"
        assert cells[4] == ("never" if first is None else f"{first:,}")
    assert "Left out: 3 runs found under --runs-dir but not of this report." in out
    for path, why in left_out.items():
        assert f"- `{path}`: {why}" in out


def test_table_refuses_a_non_positive_last_episodes(pqn_sweep, capsys):
    argv = ["--runs-dir", str(pqn_sweep[0]), "--env-ids", "CartPole-v1", "--thresholds", "1", "--exp-names", "pqn"]
    with pytest.raises(SystemExit) as stop:
        threshold_table.main([*argv, "--last-episodes", "0"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == "error: --last-episodes=0: must be between 1 and 1,000,000,000\n"
