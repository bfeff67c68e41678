"""The training score of kept runs at given agent steps: the mean of the last 100 training episodes that ended by each
step, read from episode records (`report.py --export-episodes`) or run folders, one row per run.

    python benchmark/score_at_steps.py benchmark/episodes/minatar --env-ids MinAtar/Asterix-v0 \
        --exp-names riqn_lr_1e-3 r2d2 iqn --steps 500000 1000000 2000000

Shows when a run starts to learn, which a table of final scores hides.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_reading  # noqa: E402  (a sibling module of benchmark/)


def score_by(steps: np.ndarray, returns: np.ndarray, step: int, last: int = 100) -> float:
    """Mean of the last `last` episodes that ended at or before `step` (NaN when none had)."""
    ended = returns[steps <= step]
    return run_reading.final_score(ended, last) if len(ended) else float("nan")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs_dirs", nargs="+", help="folders of episode records or run folders (searched recursively)")
    parser.add_argument("--env-ids", nargs="*", default=None)
    parser.add_argument("--exp-names", nargs="*", default=None)
    parser.add_argument("--steps", nargs="+", type=int, required=True)
    args = parser.parse_args(argv)
    print("| run | " + " | ".join(f"{step:,}" for step in args.steps) + " |")
    print("|---|" + "---|" * len(args.steps))
    for path in run_reading.find_run_dirs([Path(folder) for folder in args.runs_dirs]):
        run = run_reading.read_run(path, quiet=True)
        if run is None or (args.env_ids and run.env_id not in args.env_ids):
            continue
        if args.exp_names and run.exp_name not in args.exp_names:
            continue
        steps, returns = np.asarray(run.steps), np.asarray(run.returns)
        cells = " | ".join(f"{score_by(steps, returns, step):.2f}" for step in args.steps)
        print(f"| {run.env_id} {run.exp_name} seed {run.seed} | {cells} |")


if __name__ == "__main__":
    main()
