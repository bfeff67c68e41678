"""What a run says from its first lines on about the time and the memory it will take (cleanrl_q_utils:
episode_scores.Progress, run_folder.memory_line, flag_checks.check_run_memory): the warm-up's end and a lower bound of
the run in the first progress line, and the memory line of the start-up block of every script."""

import pytest

from cleanrl_q_utils import episode_scores, flag_checks, run_folder

from helpers import import_script
from tiny import TINY, tiny


@pytest.fixture
def clock(monkeypatch):
    """A fake time.time for episode_scores: tests move it on by hand, nothing sleeps."""
    now = [1000.0]
    monkeypatch.setattr(episode_scores.time, "time", lambda: now[0])
    return now


def test_the_first_progress_line_of_a_warm_up_says_when_learning_starts_and_how_long_the_run_takes_at_least(clock, capsys):
    progress = episode_scores.Progress(1_000_000, 0, learning_starts=50_000)
    clock[0] += 1
    progress.print(100, [])  # the warm-up's first point, too early for a line
    clock[0] += 10
    progress.print(1_100, [])  # 1,000 steps in 10 s since the first point: 0.01 s a step
    (line,) = capsys.readouterr().out.splitlines()
    # 48,900 warm-up steps left x 0.01 s = 489 s; 998,900 steps left x 0.01 s = 9,989 s, no update counted
    assert line.endswith(
        "| warming up (learning starts at step 50000 in 00:08:09); ETA at least 02:46:29, updates not yet timed"
    )
    assert progress.warm_up_left(1_100) == pytest.approx(48_900 * 0.01)
    assert progress.at_least(1_100) == pytest.approx(998_900 * 0.01)


def test_the_lower_bound_stays_until_the_estimate_and_the_estimate_replaces_it(clock, capsys):
    """Steps at 0.01 s while warming up, 0.1 s once learning: the bound (acting alone) is ten times too short, and is
    said as a bound only; the first estimate, from the rate since learning started, takes over."""
    progress = episode_scores.Progress(100_000, 0, learning_starts=2_000, interval=0.0)
    for step in range(100, 2_100, 100):
        clock[0] += 1.0
        progress.print(step, [])
    clock[0] += 10.0
    progress.print(2_100, [])
    lines = capsys.readouterr().out.splitlines()
    # step 200: 1,800 warm-up steps x 0.01 s = 18 s; 99,800 steps x 0.01 s = 998 s at least
    assert lines[1].endswith(
        "| warming up (learning starts at step 2000 in 00:00:18); ETA at least 00:16:38, updates not yet timed"
    )
    assert lines[-2].endswith("| ETA measuring (at least 00:16:20)")  # step 2,000: learning starts; 98,000 x 0.01 s
    assert lines[-1].endswith("| ETA 02:43:10")  # 97,900 steps x 0.1 s, the rate since step 2,000: 9,790 s


def test_a_recurrent_script_keeps_the_bound_until_its_first_update_is_timed(clock, capsys):
    """Updates counted apart (updates_per_step): between learning_starts and the first update the line still says
    the bound, then the estimate: remaining steps x (acting time + updates per step x time per update)."""
    progress = episode_scores.Progress(100_000, 0, learning_starts=1_000, interval=0.0, updates_per_step=1 / 1_000)
    for step in range(100, 2_100, 100):
        clock[0] += 0.1 + (8.0 if step == 2_000 else 0.0)
        progress.print(step, [], updates=1 if step >= 2_000 else 0)
    lines = capsys.readouterr().out.splitlines()
    # 0.1 s per 100 steps while warming up: 0.001 s a step; at step 1,100, 98,900 steps left: 98.9 s at least
    assert lines[10].endswith("| ETA after the first update (at least 00:01:38)")
    assert lines[-1].endswith("| ETA 00:14:42")  # 98,000 steps x (1 ms acting + 8 s / 1,000 steps updating): 882 s


def test_a_bound_over_a_day_warns_at_once_and_a_bound_under_a_day_waits_for_the_estimate(clock, capsys):
    slow = episode_scores.Progress(50_000_000, 0, learning_starts=50_000, slow_hint="try the twin")
    clock[0] += 1
    slow.print(130, [])
    clock[0] += 10
    slow.print(1_430, [])  # 130 steps/s: 49,998,570 steps take at least 384,604 s
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == (
        "warning: at the speed measured so far, acting alone (no update counted) this run takes at least "
        "4 days 10:50:04 more; try the twin"
    )
    quick = episode_scores.Progress(1_000_000, 0, learning_starts=1_000, interval=0.0, slow_hint="try the twin")
    for step, seconds in ((100, 0.1), (900, 0.8), (1_000, 0.1)):  # 1 ms a step acting: under a day at least
        clock[0] += seconds
        quick.print(step, [])
    assert "warning" not in capsys.readouterr().out
    clock[0] += 100.0
    quick.print(2_000, [])  # 0.1 s a step since learning started: 998,000 steps, 99,800 s, over a day
    assert capsys.readouterr().out.splitlines()[-1].startswith("warning: at the speed measured since learning began")


def test_the_memory_line_gives_the_total_and_its_largest_shares_against_what_is_available():
    needs = [("the network and its copies", 100_000_000), ("the replay", 7_300_000_000), ("the action log", 60_000_000)]
    line = run_folder.memory_line([("", needs, 20_100_000_000)])
    # 7.46 GB in all; the action log is under a hundredth of it and left out of the shares
    assert line == "about 7.5 GB (the replay 7.3 GB, the network and its copies 100 MB) of 20.1 GB available"
    gpu = [("an update's activations", 2_000_000)]
    line = run_folder.memory_line([("", needs[1:], 20e9), (" on the GPU", gpu, 80e9)])
    assert line.endswith("; about 2 MB on the GPU (an update's activations 2 MB) of 80.0 GB free")


@pytest.mark.parametrize("script", sorted(TINY))
def test_the_start_up_block_of_every_script_says_the_memory_its_pre_flight_counted(script, monkeypatch, tmp_path, capsys):
    """The start-up block of a tiny run (stopped when it builds its environments) says the total the memory
    pre-flight counted, and what was available then."""
    monkeypatch.chdir(tmp_path)
    module = import_script(script)
    counted = []

    def recorded(args, needs):
        counted.append(needs)
        return check_run_memory(args, needs)

    class Started(Exception):
        pass

    def stop(*args, **kwargs):
        raise Started

    check_run_memory = flag_checks.check_run_memory
    monkeypatch.setattr(flag_checks, "check_run_memory", recorded)
    monkeypatch.setattr(flag_checks, "available_memory_bytes", lambda: 12_300_000_000)
    monkeypatch.setattr(module, "make_env", stop)
    with pytest.raises(Started):
        module.main(module.Args(**tiny(script)))
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  memory: ")]
    (needs,) = counted
    total = sum(size for _, size, _ in needs)
    said, unit = line.split("memory: about ")[1].split(" (")[0].split()
    step = {"GB": 1e9, "MB": 1e6, "kB": 1e3}[unit]  # the line's unit, rounded to the last digit it shows
    assert abs(float(said.replace(",", "")) * step - total) <= step * (0.05 if unit == "GB" else 0.5)
    assert line.endswith(") of 12.3 GB available")
    largest = max(needs, key=lambda need: need[1])
    assert f"({largest[0]} " in line  # the largest share comes first
