"""Helpers the tests share: imports of a script of cleanrl/ by its name and of a file that is not part of a package
(the tools in benchmark/, the docs hooks, launch.py), and the run folder and checkpoint a script wrote under runs/."""

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def import_script(name: str) -> ModuleType:
    """The module of cleanrl/<name>.py; `name` may end in .py."""
    return importlib.import_module(f"cleanrl.{name.removesuffix('.py')}")


def import_file(path: Path, module_name: str) -> ModuleType:
    """Imports the file at `path` as the module `module_name`, registered in sys.modules (dataclasses look their
    module up there)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def run_dir_of(root: str | Path = ".") -> Path:
    """The run folder under root/runs, relative when `root` is (the default: the working directory); fails, naming
    what is there, unless runs/ holds exactly that one folder."""
    runs = Path(root, "runs")
    found = sorted(runs.iterdir()) if runs.is_dir() else []
    assert len(found) == 1 and found[0].is_dir(), f"expected one run folder in {runs}, found {[p.name for p in found]}"
    return found[0]


def checkpoint_of(root: str | Path = ".") -> Path:
    """The checkpoint.pt of the one run under root/runs (see run_dir_of); fails unless it was written."""
    path = run_dir_of(root) / "checkpoint.pt"
    assert path.is_file(), f"no checkpoint written: {path}"
    return path


def end_iteration(run, global_step: int, steps: int, last: bool, state) -> bool:
    """The end of a script's iteration, as the scripts write it: a checkpoint of `state()` (plain values, nothing
    learned) when `run.checkpoint_due` says so, then True if a signal asked the run to stop."""
    if run.checkpoint_due(global_step, steps, last):
        run.save(global_step, state(), learned=())
    return run.stopped


def episodic_returns(log_dir: str | Path) -> list[tuple[int, float]]:
    """The (step, value) pairs of charts/episodic_return in the TensorBoard log at `log_dir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars("charts/episodic_return")]


def assert_synced_to_offline_wandb(wandb_dir: Path, root: str | Path = ".") -> None:
    """Fails unless the one run under root/runs went to one offline W&B run in `wandb_dir`: its TensorBoard log synced
    whole (the same episodic returns) under the run's name, and its flags in the run's record."""
    (offline,) = wandb_dir.glob("offline-run-*")
    run_dir = run_dir_of(root)
    synced = offline / "files" / "runs" / run_dir.name
    assert synced.is_dir(), sorted(p.name for p in (offline / "files").rglob("*"))
    assert episodic_returns(synced) == episodic_returns(run_dir) != []
    (record,) = offline.glob("run-*.wandb")
    assert b"total_timesteps" in record.read_bytes() and b"wandb_project_name" in record.read_bytes()
