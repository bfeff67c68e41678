"""Steady-state steps per second from the console logs of the scripts.

Every script prints `step S/TOTAL | SPS R | ...` about every 10 seconds, where R is the average since the run
started. The time at a line is S / R, so two lines give the speed between them, free of start-up and of any
acting-only warm-up before them:  python benchmark/steady_sps.py speed-logs/*.log
"""

import re
import sys

PROGRESS = re.compile(r"step\s+(\d+)/\d+ \| SPS\s+(\d+)")


def steady_sps(lines):
    """-> agent steps per second between the last two progress lines, or None with fewer than two."""
    points = [(int(m[1]), int(m[2])) for m in map(PROGRESS.search, lines) if m and int(m[2]) > 0]
    if len(points) < 2:
        return None
    (s1, r1), (s2, r2) = points[-2:]
    return (s2 - s1) / (s2 / r2 - s1 / r1)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path) as f:
            sps = steady_sps(f.readlines())
        print(f"{path}: {'no two progress lines' if sps is None else f'{sps:,.0f} agent steps/s'}")
