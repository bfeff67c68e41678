"""Short real training runs of cleanrl/pqn.py, for the tests of the benchmark tools: their console output and run
folders are what the tools read in use, so a change of either shows up in these tests."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# A few seconds per run on one CPU core: 8192 steps in 64 updates of 8 envs x 16 steps.
SHORT_PQN = [
    "--total-timesteps", "8192", "--num-envs", "8", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1",
]  # fmt: skip


def load_benchmark_module(name: str):
    """Imports benchmark/<name>.py (a directory of scripts, not a package) as `benchmark_<name>`."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", REPO / "benchmark" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


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
