"""Steady-state steps per second from the console logs of the scripts.

Every script prints `step S/TOTAL (P%) | SPS R | ...` about every 10 seconds (logs of older versions lack the
`(P%)`), where R is the average since the run started. The time at a line is S / R, so two lines give the speed
between them, free of start-up and of any acting-only warm-up before them:  python benchmark/steady_sps.py speed-logs/*.log
"""

import re
import sys

# The percentage is optional: logs written before it was added are read the same way.
PROGRESS = re.compile(r"step\s+(\d+)/\d+\s+(?:\(\s*[\d.]+%\)\s+)?\|\s+SPS\s+(\d+)")


def progress_points(lines):
    """-> [(step, average SPS since the start)] of the progress lines, in order; lines of SPS 0 are left out."""
    return [(int(m[1]), int(m[2])) for m in map(PROGRESS.search, lines) if m and int(m[2]) > 0]


def steady_sps(lines):
    """-> agent steps per second between the last two progress lines, or None with fewer than two."""
    points = progress_points(lines)
    if len(points) < 2:
        return None
    (s1, r1), (s2, r2) = points[-2:]
    return (s2 - s1) / (s2 / r2 - s1 / r1)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path, errors="replace") as f:
            lines = f.readlines()
        sps = steady_sps(lines)
        found = len(progress_points(lines))
        print(f"{path}: {f'{sps:,.0f} agent steps/s' if sps is not None else f'{found} progress line(s), need two'}")
