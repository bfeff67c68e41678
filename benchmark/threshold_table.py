"""Per-run table of a side-by-side benchmark: final return, greedy evaluation, first step at a threshold, wall time.

    python benchmark/threshold_table.py --runs-dir runs --env-ids CartPole-v1 Acrobot-v1 \
        --exp-names dqn_dueling_per iqn sb3_dqn sb3_qrdqn --thresholds 475 -100

Reads the runs as benchmark/report.py does (same run names; final return = mean of the last 100 training episodes;
wall time = first to last event of the run) and adds, per run, the first agent step at which the mean of the last 100
training episodes reached the env's threshold ("never" if it did not), and the mean of its `eval/episodic_return`
episodes where it logged some. Prints markdown: one table per env, per seed and then mean ± std over seeds, and then
the runs found under --runs-dir that are not of the sweep asked for (`--seeds`, `--total-timesteps` as in report.py).
Damaged or hostile runs are left out as report.py leaves them out, each named in one `warning:` line on stderr, as are
env ids and exp_names without runs (no table, no row) and seeds with fewer episodes than the window.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

BENCHMARK = str(Path(__file__).resolve().parent)
if BENCHMARK not in sys.path:  # report.py and run_reading.py beside this file, where it is imported by its path
    sys.path.append(BENCHMARK)
import report  # noqa: E402
import run_reading  # noqa: E402


def first_step_at(steps: np.ndarray, returns: np.ndarray, threshold: float, window: int = 100) -> int | None:
    """The step of the first episode at which the mean of the last `window` episodes is >= threshold (None: never).
    The mean needs `window` episodes: fewer do not count."""
    if len(returns) < window:
        return None
    cumulative = np.concatenate([[0.0], np.cumsum(returns)])
    means = (cumulative[window:] - cumulative[:-window]) / window  # means[i]: episodes i .. i + window - 1
    reached = np.flatnonzero(means >= threshold)
    return None if len(reached) == 0 else int(steps[reached[0] + window - 1])


def env_table(runs: list, exp_names: list[str], threshold: float, window: int) -> str:
    header = ["Algorithm", "Seed", f"Return (last {window})", "Greedy eval", f"First {threshold:g}", "Wall time (min)"]
    rows = []
    for exp_name in exp_names:
        members = sorted((run for run in runs if run.exp_name == exp_name), key=lambda run: run.seed)
        if not members:
            continue
        short = [run.seed for run in members if len(run.returns) < window]
        if short:
            run_reading.warn(
                f"{exp_name} on {members[0].env_id}: seeds {short} logged fewer than {window} episodes: their return is "
                "the mean of all they logged, and they reach no threshold"
            )
        finals = np.array([run_reading.final_score(run.returns, window) for run in members])
        evals = [float(np.mean(run.eval_returns)) if len(run.eval_returns) else None for run in members]
        firsts = [first_step_at(run.steps, run.returns, threshold, window) for run in members]
        minutes = np.array([run.runtime_s / 60 for run in members])
        for run, final, score, first, minute in zip(members, finals, evals, firsts, minutes):
            shown = "-" if score is None else f"{score:.1f}"
            rows.append(
                [exp_name, str(run.seed), f"{final:.1f}", shown, "never" if first is None else f"{first:,}", f"{minute:.1f}"]
            )
        known = [score for score in evals if score is not None]
        reached = [first for first in firsts if first is not None]
        rows.append(
            [
                f"**{exp_name}**",
                f"**{len(members)} seeds**",
                f"**{finals.mean():.1f} ± {finals.std():.1f}**",
                f"{np.mean(known):.1f} ± {np.std(known):.1f}" if known else "-",
                f"{len(reached)}/{len(members)}" + (f", median {int(np.median(reached)):,}" if reached else ""),
                f"{minutes.mean():.1f} ± {minutes.std():.1f}",
            ]
        )
    return report.markdown_table(header, rows)


def main(argv: list[str] | None = None) -> int:
    parser = report.Parser(prog="threshold_table.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", nargs="+", type=Path, default=[Path("runs")], help="searched recursively")
    parser.add_argument("--env-ids", nargs="+", required=True, help="env ids, one table each")
    parser.add_argument("--thresholds", nargs="+", type=float, required=True, help="one return threshold per env id")
    parser.add_argument("--exp-names", nargs="+", required=True, help="exp_names, in row order")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="seeds to report (default: all)")
    parser.add_argument("--total-timesteps", type=int, default=None, help="only runs of this --total-timesteps")
    parser.add_argument("--last-episodes", type=int, default=100, help="episodes of the final return and of the mean")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if len(args.thresholds) != len(args.env_ids):
        parser.error(f"--thresholds: {len(args.thresholds)} given for {len(args.env_ids)} --env-ids; give one per env id")
    for threshold in args.thresholds:
        if not math.isfinite(threshold):
            parser.error(f"--thresholds={threshold}: must be finite numbers (a return the trailing mean can reach)")
    report.check_counts(args, {"last_episodes": report.MOST_COUNT, "total_timesteps": None})
    runs, left_out = run_reading.select_runs(args.runs_dir, args.exp_names, args.env_ids, args.seeds, args.total_timesteps)
    where = " ".join(map(str, args.runs_dir))
    if not runs:
        print(f"error: no run of {' '.join(args.exp_names)} under {where}", file=sys.stderr)
        return 1
    for exp_name in args.exp_names:
        if not any(run.exp_name == exp_name for run in runs):
            run_reading.warn(f"requested exp_name {exp_name} has no runs under {where}; left out")
    for env_id, threshold in zip(args.env_ids, args.thresholds):
        members = [run for run in runs if run.env_id == env_id]
        if not members:
            run_reading.warn(f"requested env id {env_id} has no runs under {where}; no table")
            continue
        report.print_output(f"### {env_id}\n\n{env_table(members, args.exp_names, threshold, args.last_episodes)}\n")
    if left_out:
        report.print_output(report.left_out_markdown(left_out) + "\n")
    return 0


if __name__ == "__main__":
    from cleanrl_q_utils.stop_signals import quiet_when_gone

    # Output piped into `head`, which exits once it has its lines, ends the program quietly with its own status.
    quiet_when_gone()
    sys.exit(main())
