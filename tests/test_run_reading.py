"""benchmark/run_reading.py as the tools reach it: a script run from another folder finds it beside itself, and the
launcher's final return is read where neither benchmark/ nor the repository is on the path (a Ray or Slurm worker runs
the launcher's function without running launch.py's top). The reading itself is tested in test_benchmark_report.py and
test_report_faults.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from torch.utils.tensorboard import SummaryWriter

from helpers import REPO, import_file


def write_event_run(runs: Path, seed: int, returns: list[float]) -> Path:
    """A run folder of `returns` as training episodes, every 100 steps."""
    run_dir = runs / f"CartPole-v1__pqn__{seed}__{1700000000 + seed}"
    writer = SummaryWriter(str(run_dir))
    for i, value in enumerate(returns):
        writer.add_scalar("charts/episodic_return", value, 100 * (i + 1))
    writer.close()
    return run_dir


def environment() -> dict:
    """The environment of a user's shell: no PYTHONPATH pointing into the checkout, one thread."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "OMP_NUM_THREADS": "1"}


def test_threshold_table_run_from_another_folder_reads_the_runs(tmp_path):
    write_event_run(tmp_path / "runs", 1, [100.0] * 5 + [500.0] * 10)
    write_event_run(tmp_path / "runs", 2, [100.0] * 15)
    command = [sys.executable, str(REPO / "benchmark" / "threshold_table.py"), "--env-ids", "CartPole-v1"]
    command += ["--thresholds", "300", "--exp-names", "pqn", "--last-episodes", "10"]
    result = subprocess.run(command, cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| pqn |")]
    # seed 1's last 10 episodes are all 500; its 10-episode mean first reaches 300 at episode 10 (5 x 100, 5 x 500)
    assert rows == ["| pqn | 1 | 500.0 | - | 1,000 | 0.0 |", "| pqn | 2 | 100.0 | - | never | 0.0 |"]


def test_the_launcher_reads_a_final_return_where_neither_benchmark_nor_the_repository_is_on_the_path(tmp_path):
    run_dir = write_event_run(tmp_path / "runs", 1, [float(i) for i in range(150)])
    files = [str(path) for path in (REPO / "benchmark").glob("*.py")]
    # -I: no script folder, working directory or PYTHONPATH on sys.path, as in a worker that unpickled the function
    code = f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("launch", {str(REPO / "benchmark" / "launch.py")!r})
launch = sys.modules["launch"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launch)
final_return = launch.run_final_return({str(run_dir)!r})
loaded = sorted(name for name, module in sys.modules.items() if getattr(module, "__file__", None) in {files!r})
print(json.dumps([final_return, loaded]))
"""
    result = subprocess.run(
        [sys.executable, "-I", "-c", code], cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    final_return, loaded = json.loads(result.stdout.splitlines()[-1])
    assert final_return == sum(range(50, 150)) / 100  # the last 100 of the 150 episodes
    assert loaded == ["launch", "run_reading"]  # a worker reads its run without the report's tables and plots


def test_the_score_at_a_step_is_the_mean_of_the_last_episodes_that_ended_by_it():
    score_at_steps = import_file(REPO / "benchmark" / "score_at_steps.py", "score_at_steps")
    steps, returns = np.arange(1, 301) * 10, np.arange(300, dtype=float)  # episode i ends at step 10 (i + 1)
    assert score_at_steps.score_by(steps, returns, 1_000) == np.mean(np.arange(100))  # exactly the first 100 episodes
    assert score_at_steps.score_by(steps, returns, 2_005) == np.mean(np.arange(100, 200))  # the 100 before step 2,005
    assert score_at_steps.score_by(steps, returns, 55, last=3) == np.mean([2.0, 3.0, 4.0])
    assert np.isnan(score_at_steps.score_by(steps, returns, 5))  # no episode had ended
