"""How good a script's time-left estimate is: runs one script in this process with its progress line every second,
and compares the estimate printed at 5%, 25% and 50% of the run with the time the run really took from there.

    python benchmark/eta_accuracy.py pqn --total-timesteps 2000000
    python benchmark/eta_accuracy.py r2d2_atari --env-id Breakout-v5 --total-timesteps 4000 --learning-starts 80 \
        --buffer-size 4000 --num-envs 4 --burn-in 10 --seq-len 20 --sequence-period 10 --batch-size 8 --lstm-size 64

Prints one markdown row: script and flags, steps, wall time of the training loop, and at each point the estimate
against the truth (positive: the estimate was too long), with the percent of the run it was printed at when the
first estimate came later than the point (a recurrent script estimates from its first update on).
docs/get-started/basic-usage.md shows the table.
"""

import importlib
import sys
import time

from cleanrl_q_utils import episode_scores

POINTS = (0.05, 0.25, 0.5)


def measure(script: str, flags: list[str]) -> tuple[list[tuple[float, int, float | None]], float, int]:
    """(time, step, estimated seconds left) of every progress line, the time the run ended, its total steps."""
    import tyro

    lines, print_line, init = [], episode_scores.Progress.print, episode_scores.Progress.__init__

    def every_second(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.interval = 1.0

    def recorded(self, global_step, recent_scores, force=False, updates=None):
        before = self.last_print
        print_line(self, global_step, recent_scores, force, updates)
        if self.last_print != before:
            lines.append((time.time(), global_step, self.time_left(global_step), self.total))

    episode_scores.Progress.__init__, episode_scores.Progress.print = every_second, recorded
    module = importlib.import_module(f"cleanrl.{script}")
    sys.argv = [f"{script}.py", *flags]
    module.main(tyro.cli(module.Args))
    return [(when, step, left) for when, step, left, _ in lines], time.time(), lines[-1][3]


def row(script: str, flags: list[str]) -> str:
    lines, end, total = measure(script, flags)
    cells = []
    for point in POINTS:
        first = next(((when, left, step) for when, step, left in lines if step >= point * total and left is not None), None)
        if first is None:
            cells.append("no estimate")
            continue
        truth = end - first[0]
        late = f" at {100 * first[2] / total:.0f}%" if first[2] > (point + 0.02) * total else ""  # first estimate later
        cells.append(f"{first[1]:.0f} s / {truth:.0f} s ({100 * (first[1] - truth) / truth:+.0f}%){late}")
    return f"| `{script}.py {' '.join(flags)}` | {total:,} | {end - lines[0][0]:.0f} s | " + " | ".join(cells) + " |"


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: python benchmark/eta_accuracy.py SCRIPT [flags of the script ...]")
    result = row(sys.argv[1], sys.argv[2:])
    print(result)
