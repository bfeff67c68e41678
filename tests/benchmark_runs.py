"""Short real training runs of cleanrl/pqn.py, for the tests of the benchmark tools: their console output and run
folders are what the tools read in use, so a change of either shows up in these tests."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, import_file

# A few seconds per run on one CPU core: 8192 steps in 64 updates of 8 envs x 16 steps.
SHORT_PQN = [
    "--total-timesteps", "8192", "--num-envs", "8", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1",
]  # fmt: skip


def load_benchmark_module(name: str):
    """Imports benchmark/<name>.py (a directory of scripts, not a package) as `benchmark_<name>`."""
    return import_file(REPO / "benchmark" / f"{name}.py", f"benchmark_{name}")


def script_env() -> dict:
    """The environment of a script run from a test: this checkout's code, one thread, no W&B."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}


def run_pqn(workdir: Path, *args: str) -> str:
    """Runs cleanrl/pqn.py in `workdir` (its run folder goes to workdir/runs/) and returns its console output."""
    workdir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(REPO / "cleanrl" / "pqn.py"), "--no-track", *args]
    result = subprocess.run(command, cwd=workdir, env=script_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def finished_return(output: str) -> float:
    """The return(100) of the script's closing `finished step ... | return(100) R (N episodes) | ...` line."""
    (line,) = [line for line in output.splitlines() if line.startswith("finished step ")]
    return float(line.split("return(100)")[1].split()[0])


@pytest.fixture(scope="session")
def pqn_sweep(tmp_path_factory):
    """A runs/ folder as a user's is after a sweep of seeds 1 and 2 (8192 steps) of pqn on CartPole-v1, next to what
    an earlier sweep left there: an older run of seed 1, seed 3 at 4096 steps and a run of another exp_name.

    Seed 2's folder gets the suffix `_2` that a run started in the same second as another of its name is given
    (run_folder.new_run_name): the renaming stands in for that race, which a test cannot start reliably.
    Returns (runs folder, {seed: the return(100) its run printed when it finished}, {"newer": seed 1's folder,
    "suffixed": seed 2's}, {left-out folder: why})."""
    workdir = tmp_path_factory.mktemp("sweep")
    runs = workdir / "runs"

    def newest_run() -> Path:
        return max(runs.iterdir(), key=lambda path: path.stat().st_mtime_ns)

    run_pqn(workdir, *SHORT_PQN, "--seed", "1")
    older = newest_run()
    run_pqn(workdir, *SHORT_PQN, "--seed", "3", "--total-timesteps", "4096")
    shorter = newest_run()
    run_pqn(workdir, *SHORT_PQN, "--seed", "1", "--exp-name", "pqn_lr_sweep")
    other_name = newest_run()
    finished = {1: finished_return(run_pqn(workdir, *SHORT_PQN, "--seed", "1"))}
    newer = newest_run()
    finished[2] = finished_return(run_pqn(workdir, *SHORT_PQN, "--seed", "2"))
    suffixed = newest_run().rename(newest_run().with_name(newest_run().name + "_2"))
    left_out = {
        older: f"an earlier run of this exp_name, env id and seed than {newer.name}",
        shorter: "4,096 steps, not 8,192",
        other_name: "exp_name pqn_lr_sweep not asked for",
    }
    return runs, finished, {"newer": newer, "suffixed": suffixed}, left_out
