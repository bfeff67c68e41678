"""Steady-state steps per second from the console logs of the scripts.

Every script prints `step S/TOTAL (P%) | SPS R | ...` about every 10 seconds (logs of older versions lack the
`(P%)`), where R is the average since the run started. The time at a line is S / R, so two lines give the speed
between them, free of start-up and of any acting-only warm-up before them:  python benchmark/steady_sps.py speed-logs/*.log

Prints one line per log. A log that cannot be read (missing, a directory) is named in one `error:` line on stderr and
the exit status is 1; the other logs are still read. Two lines at the same time (S / R equal: the SPS is rounded) give
no rate: the earlier line of the last two different times is taken. Lines that go back (a log of two runs) give no
rate either, and say so. A log is read a line at a time, each at most LINE_MAX bytes, so that its size costs no memory.
"""

import os
import re
import sys

# The percentage is optional: logs written before it was added are read the same way.
PROGRESS = re.compile(r"step\s+(\d+)/\d+\s+(?:\(\s*[\d.]+%\)\s+)?\|\s+SPS\s+(\d+)")
LINE_MAX = 65536
"""bytes of a log line read at once; a longer line is read in parts (a progress line is about 100)"""


def progress_points(lines):
    """-> [(step, average SPS since the start)] of the progress lines, in order; lines of SPS 0 are left out."""
    return list(each_progress_point(lines))


def each_progress_point(lines):
    """(step, average SPS since the start) of each progress line, one at a time; lines of SPS 0 are left out."""
    return ((int(m[1]), int(m[2])) for m in map(PROGRESS.search, lines) if m and int(m[2]) > 0)


def last_two_times(lines):
    """-> (number of progress lines, [(step, seconds)] of the last line and of the latest line before it at another
    time), keeping only those two while reading, however long the log."""
    found, last, before = 0, None, None
    for step, sps in each_progress_point(lines):
        found += 1
        point = (step, step / sps)
        if last is not None and point[1] != last[1]:
            before = last
        last = point
    return found, [point for point in (before, last) if point is not None]


def steady_rate(lines):
    """-> (agent steps per second between the last two progress lines at different times, None, number of progress
    lines) or (None, why there is no rate, number of progress lines)."""
    found, points = last_two_times(lines)
    if len(points) < 2:
        return None, f"{found} progress line(s), need two at different times", found
    (s1, t1), (s2, t2) = points
    if s2 <= s1 or t2 <= t1:
        return None, f"the progress lines go back (step {s1:,} at {t1:,.0f} s, then {s2:,} at {t2:,.0f} s): two runs?", found
    return (s2 - s1) / (t2 - t1), None, found


def steady_sps(lines):
    """-> agent steps per second between the last two progress lines at different times, or None without such a rate."""
    return steady_rate(lines)[0]


def log_lines(file):
    """The lines of an open log, each at most LINE_MAX characters (a longer one comes in parts)."""
    while line := file.readline(LINE_MAX):
        yield line


def main(argv=None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths or any(path.startswith("-") for path in paths):
        print("error: give the log files to read: python benchmark/steady_sps.py speed-logs/*.log", file=sys.stderr)
        return 2
    status = 0
    for path in paths:
        try:
            with open(path, errors="replace") as file:
                sps, why, _ = steady_rate(log_lines(file))
        except OSError as error:
            print(f"error: {path}: cannot read it ({error.strerror or error})", file=sys.stderr)
            status = 1
            continue
        try:
            print(f"{path}: {f'{sps:,.0f} agent steps/s' if sps is not None else why}", flush=True)
        except BrokenPipeError:  # a reader that stopped reading (`| head`): the rest goes nowhere, not to a traceback
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return status


if __name__ == "__main__":
    sys.exit(main())
