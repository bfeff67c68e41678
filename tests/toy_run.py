"""A toy script's flags and its Run, for the tests of the run plumbing (cleanrl_q_utils) without a real script."""

from dataclasses import dataclass
from typing import Optional

from cleanrl_q_utils.training_run import Run

FORMAT = 7
SCRIPT = "/somewhere/cleanrl/toy.py"


@dataclass
class Args:
    exp_name: str = "toy"
    seed: int = 1
    cuda: bool = False
    track: bool = False
    wandb_project_name: str = "cleanrl-q"
    wandb_entity: Optional[str] = None
    env_id: str = "Toy-v0"
    total_timesteps: int = 100
    learning_rate: float = 1e-3
    checkpoint_every: int = 0
    resume: Optional[str] = None
    resume_fresh_envs: bool = False


def start(args=None, checkpoint=None):
    """The toy script's Run (a run folder under runs/ in the working directory), with `args` or the defaults."""
    return Run(args or Args(), checkpoint, SCRIPT, FORMAT)
