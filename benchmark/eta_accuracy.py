"""How good a script's time-left estimate is: runs one script in this process with its progress line every second,
and compares the estimate printed at 5%, 25% and 50% of the run with the time the run really took from there.

    python benchmark/eta_accuracy.py pqn --total-timesteps 2000000
    python benchmark/eta_accuracy.py r2d2_atari --env-id Breakout-v5 --total-timesteps 4000 --learning-starts 80 \
        --buffer-size 4000 --num-envs 4 --burn-in 10 --seq-len 20 --sequence-period 10 --batch-size 8 --lstm-size 64

Prints one markdown row: script and flags, steps, wall time of the training loop, the warm-up's time left said by the
first progress line against the time learning really started, the first line's estimate of the whole run (from the
update the script timed at start-up: "start-up") against the time the run really took from there, and at each point
the estimate against the truth (positive: the estimate was too long); a point before the rate measured since learning
started shows the start-up estimate, or without one the lower bound the line gave instead ("at least", which leaves
out the updates), and a first estimate later than the point says at which percent of the run it came.
docs/get-started/basic-usage.md shows the table.
"""

import importlib
import sys
import time

from cleanrl_q_utils import episode_scores

POINTS = (0.05, 0.25, 0.5)


def measure(script: str, flags: list[str]) -> dict:
    """What the progress lines of one run said and what happened: (time, step, estimated seconds left, lower bound
    of them, estimate from the start-up timing) of every line, the time the run ended and its total steps, the
    warm-up's time left said by the first line that said it (with that line's time) and the time the run reached the
    step learning starts at."""
    import tyro

    run = dict(lines=[], warm_up_said=None, learning_started=None)
    print_line, init = episode_scores.Progress.print, episode_scores.Progress.__init__

    def every_second(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.interval = 1.0

    def recorded(self, global_step, recent_scores, force=False, updates=None):
        before = self.last_print
        print_line(self, global_step, recent_scores, force, updates)
        now = time.time()
        if run["learning_started"] is None and global_step >= self.learning_starts:
            run["learning_started"] = now
        if self.last_print != before:
            left, bound, start_up = self.time_left(global_step), self.at_least(global_step), None
            if left is None:
                start_up = self.start_up_estimate(global_step)
            run["lines"].append((now, global_step, left, bound, start_up))
            run["total"] = self.total
            warm_up = self.warm_up_left(global_step)
            if run["warm_up_said"] is None and warm_up is not None and global_step < self.learning_starts:
                run["warm_up_said"] = (now, warm_up)

    episode_scores.Progress.__init__, episode_scores.Progress.print = every_second, recorded
    module = importlib.import_module(f"cleanrl.{script}")
    sys.argv = [f"{script}.py", *flags]
    module.main(tyro.cli(module.Args))
    run["end"] = time.time()
    return run


def against_truth(said: float, truth: float) -> str:
    return f"{said:.0f} s / {truth:.0f} s ({100 * (said - truth) / truth:+.0f}%)"


def said_by(line: tuple, end: float) -> str:
    """What one progress line said of the time left against the truth: the estimate from the rates measured since
    learning started, else the start-up estimate ("start-up"), else the lower bound ("at least")."""
    when, step, left, bound, start_up = line
    if left is not None:
        return against_truth(left, end - when)
    if start_up is not None:
        return "start-up " + against_truth(start_up, end - when)
    return "at least " + against_truth(bound, end - when) if bound is not None else "no estimate"


def row(script: str, flags: list[str]) -> str:
    """The markdown row of one run: its warm-up's length as the first line said it against the truth, the first line's
    whole-run estimate, then at each point of POINTS the first line's estimate (before the measured one: the start-up
    estimate, or without it the lower bound, "at least") against the time left."""
    run = measure(script, flags)
    lines, end, total = run["lines"], run["end"], run["total"]
    if run["warm_up_said"] and run["learning_started"]:
        when, said = run["warm_up_said"]
        cells = [against_truth(said, run["learning_started"] - when)]
    else:
        cells = ["no warm-up line"]
    cells.append(said_by(lines[0], end))
    for point in POINTS:
        first = next((line for line in lines if line[1] >= point * total and any(x is not None for x in line[2:])), None)
        if first is None:
            cells.append("no estimate")
            continue
        late = f" at {100 * first[1] / total:.0f}%" if first[1] > (point + 0.02) * total else ""  # the estimate came later
        cells.append(said_by(first, end) + late)
    return f"| `{script}.py {' '.join(flags)}` | {total:,} | {end - lines[0][0]:.0f} s | " + " | ".join(cells) + " |"


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: python benchmark/eta_accuracy.py SCRIPT [flags of the script ...]")
    result = row(sys.argv[1], sys.argv[2:])
    print(result)
