"""benchmark/steady_sps.py on the progress lines the scripts print."""

import time

import pytest
from benchmark_runs import SHORT_PQN, load_benchmark_module, run_pqn

from cleanrl_q_utils import episode_scores

steady_sps = load_benchmark_module("steady_sps")


@pytest.fixture(scope="module")
def pqn_output(tmp_path_factory):
    return run_pqn(tmp_path_factory.mktemp("speed"), *SHORT_PQN).splitlines(keepends=True)


def test_reads_the_progress_line_of_a_real_run(pqn_output):
    progress = [line for line in pqn_output if line.startswith("step ")]
    assert progress, pqn_output
    (step, sps), *_ = steady_sps.progress_points(progress[-1:])
    # the line's own fields, read without the module's pattern: "step S/T (P%) | SPS R | ..."
    fields = progress[-1].split("|")
    assert step == int(fields[0].split()[1].split("/")[0]) == 8192
    assert sps == int(fields[1].split()[1]) > 0
    assert steady_sps.steady_sps(pqn_output) is None  # one progress line: no rate between two


def progress_lines(monkeypatch, capsys, points):
    """The lines episode_scores.Progress (what every script prints) writes at the given (second, step) points."""
    clock = {"now": 1000.0}
    monkeypatch.setattr(time, "time", lambda: clock["now"])
    progress = episode_scores.Progress(total_timesteps=100_000, start_step=0)
    capsys.readouterr()
    for seconds, step in points:
        clock["now"] = 1000.0 + seconds
        progress.print(step, [1.0], force=True)
    return capsys.readouterr().out.splitlines(keepends=True)


def test_steady_sps_is_the_rate_between_the_last_two_progress_lines(monkeypatch, capsys):
    # a fast acting-only warm-up (2000 steps in 5 s), then 1000 steps in 15 s and 2000 steps in 20 s
    lines = progress_lines(monkeypatch, capsys, [(5, 2000), (20, 3000), (40, 5000)])
    assert len(lines) == 3 and all("%) | SPS" in line for line in lines)
    # (5000 - 3000) steps in (40 - 20) s; the average since the start (125) would include the warm-up.
    assert steady_sps.steady_sps(["warming up\n", *lines]) == pytest.approx(100.0)


def test_lines_of_older_logs_without_the_percentage_are_still_read(monkeypatch, capsys):
    lines = progress_lines(monkeypatch, capsys, [(20, 3000), (40, 5000)])
    old = [line.replace(line[line.index("(") : line.index(")") + 1], "").replace("  |", " |", 1) for line in lines]
    assert "%" not in "".join(old) and old[0].startswith("step      3000/100000 | SPS")
    assert steady_sps.progress_points(old) == steady_sps.progress_points(lines) == [(3000, 150), (5000, 125)]
    assert steady_sps.steady_sps(old) == pytest.approx(100.0)


def test_two_progress_lines_at_the_same_time_take_the_rate_from_the_line_before(monkeypatch, capsys):
    """Two lines at one time (the same step and SPS) give no rate between them, and no division by zero."""
    lines = progress_lines(monkeypatch, capsys, [(20, 3000), (40, 5000), (40, 5000)])
    assert lines[-1] == lines[-2]
    assert steady_sps.steady_sps(lines) == pytest.approx((5000 - 3000) / (40 - 20))
    assert steady_sps.steady_rate(lines[1:]) == (None, "2 progress line(s), need two at different times", 2)


def test_progress_lines_that_go_back_give_no_rate(monkeypatch, capsys):
    first_run = progress_lines(monkeypatch, capsys, [(20, 3000), (40, 5000)])
    second_run = progress_lines(monkeypatch, capsys, [(10, 1000)])
    sps, why, found = steady_sps.steady_rate(first_run + second_run)
    assert sps is None and found == 3
    assert why == "the progress lines go back (step 5,000 at 40 s, then 1,000 at 10 s): two runs?"


def test_missing_files_and_folders_are_one_line_each_and_the_other_logs_are_read(monkeypatch, capsys, tmp_path):
    lines = progress_lines(monkeypatch, capsys, [(20, 3000), (40, 5000)])
    log = tmp_path / "run.log"
    log.write_text("x" * 200_000 + "\n" + "".join(lines))  # a long line of other output does not hide the progress
    missing = tmp_path / "missing.log"
    assert steady_sps.main([str(missing), str(tmp_path), str(log)]) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"error: {missing}: cannot read it (No such file or directory)",
        f"error: {tmp_path}: cannot read it (Is a directory)",
    ]
    assert captured.out == f"{log}: 100 agent steps/s\n"


def test_without_a_log_the_tool_says_what_it_needs(capsys):
    assert steady_sps.main([]) == 2
    assert capsys.readouterr().err == "error: give the log files to read: python benchmark/steady_sps.py speed-logs/*.log\n"
