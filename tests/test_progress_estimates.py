"""What a run says from its first lines on about the time and the memory it will take (cleanrl_q_utils:
episode_scores.Progress, run_folder.memory_line, flag_checks.check_run_memory): the warm-up's end and the whole run's
estimate from the update timed at start-up (or, without a timing, a lower bound) in the first progress line, the
timing of every replay script, which leaves the run's random generators and networks as they were, and the memory
line of the start-up block of every script."""

import copy

import numpy as np
import pytest
import torch

from cleanrl_q_utils import checkpoint_files, episode_scores, flag_checks, run_folder, training_run

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


def test_the_first_progress_line_of_a_warm_up_estimates_the_whole_run_from_the_update_timed_at_start_up(clock, capsys):
    progress = episode_scores.Progress(1_000_000, 0, learning_starts=50_000, updates_per_step=0.25, seconds_per_update=0.004)
    clock[0] += 1
    progress.print(100, [])  # the warm-up's first point, too early for a line
    clock[0] += 10
    progress.print(1_100, [])  # 1,000 steps in 10 s since the first point: 0.01 s a step
    (line,) = capsys.readouterr().out.splitlines()
    # 998,900 steps left x 0.01 s acting = 9,989 s, and the 950,000 steps from step 50,000 on also make 0.25 updates
    # each at 0.004 s: 950 s; 10,939 s in all
    assert line.endswith("| warming up (learning starts at step 50000 in 00:08:09); ETA 03:02:19 (updates timed at start-up)")
    assert progress.start_up_estimate(1_100) == pytest.approx(998_900 * 0.01 + 950_000 * 0.25 * 0.004)


def test_the_start_up_estimate_stays_until_the_rate_measured_since_learning_started_replaces_it(clock, capsys):
    """Steps at 0.01 s while warming up, an update timed at 0.02 s every other step: the start-up estimate, 0.02 s a
    step once learning, is marked as such, also in the line at learning_starts; then the measured rate takes over."""
    progress = episode_scores.Progress(100_000, 0, 2_000, interval=0.0, updates_per_step=0.5, seconds_per_update=0.02)
    for step in range(100, 2_100, 100):
        clock[0] += 1.0
        progress.print(step, [])
    clock[0] += 10.0
    progress.print(2_100, [])
    lines = capsys.readouterr().out.splitlines()
    # step 200: 99,800 steps x 0.01 s + 98,000 steps x 0.5 x 0.02 s = 998 s + 980 s
    assert lines[1].endswith(
        "| warming up (learning starts at step 2000 in 00:00:18); ETA 00:32:58 (updates timed at start-up)"
    )
    assert lines[-2].endswith("| ETA 00:32:40 (updates timed at start-up)")  # step 2,000: 98,000 steps x 0.02 s
    assert lines[-1].endswith("| ETA 02:43:10")  # 97,900 steps x 0.1 s, the rate since step 2,000: 9,790 s


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


def test_a_script_that_updates_at_every_step_gets_the_rate_measured_since_learning_started(clock, capsys):
    """No step without an update, so acting and updating cannot be timed apart: the estimate is the whole rate since
    learning started, not the start-up timing forever."""
    progress = episode_scores.Progress(100_000, 0, learning_starts=1_000, interval=0.0, updates_per_step=1 / 100)
    for step in range(100, 3_100, 100):
        clock[0] += 0.1 if step <= 1_000 else 2.0
        progress.print(step, [], updates=max(step - 1_000, 0) // 100)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].endswith("| ETA 00:32:20")  # 97,000 steps at 2 s per 100 steps, the rate since step 1,000: 1,940 s


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


def test_a_start_up_estimate_over_a_day_warns_at_once(clock, capsys):
    slow = episode_scores.Progress(
        2_000_000, 0, learning_starts=50_000, slow_hint="try the twin", updates_per_step=0.25, seconds_per_update=0.2
    )
    clock[0] += 1
    slow.print(100, [])
    clock[0] += 10
    slow.print(1_100, [])  # 0.01 s a step acting; 1,950,000 steps x 0.25 x 0.2 s updating: over a day
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("warning: at the speed measured so far and the update timed at start-up this run takes about")


REPLAY_SCRIPTS = ("dqn_dueling_per", "iqn", "iqn_atari", "r2d2", "r2d2_atari", "recurrent_iqn", "recurrent_iqn_atari")


@pytest.mark.parametrize("script", REPLAY_SCRIPTS)
def test_the_start_up_timing_of_every_replay_script_leaves_its_generators_and_networks_as_they_were(
    script, monkeypatch, tmp_path
):
    """The tiny run stops when it builds its progress line: the update timing before it returned a positive time,
    which the progress line gets with the script's updates per step, and every random generator (torch's, numpy's,
    python's and the replay's own), every network and the optimizer are as they were before the timing."""
    monkeypatch.chdir(tmp_path)
    module = import_script(script)
    timed, given = [], []

    def states(arguments) -> list:
        found = [checkpoint_files.rng_states()]
        for value in arguments:
            if isinstance(getattr(value, "rng", None), np.random.Generator):
                found.append(copy.deepcopy(value.rng.bit_generator.state))
            if isinstance(value, (torch.nn.Module, torch.optim.Optimizer)):
                found.append(copy.deepcopy(value.state_dict()))
        return found

    def checked(*arguments):
        before = states(arguments)
        seconds = seconds_per_update(*arguments)
        assert equal(states(arguments), before)
        timed.append(seconds)
        return seconds

    class Started(Exception):
        pass

    def progress(run, start_step, updates_per_step=0.0, seconds_per_update=None):
        given.append((updates_per_step, seconds_per_update))
        raise Started

    seconds_per_update = module.seconds_per_update
    monkeypatch.setattr(module, "seconds_per_update", checked)
    monkeypatch.setattr(training_run.Run, "progress", progress)
    with pytest.raises(Started):
        module.main(module.Args(**tiny(script)))
    ((updates_per_step, seconds),) = given
    assert timed == [seconds] and seconds > 0 and 0 < updates_per_step <= 1


def equal(a, b) -> bool:
    """Deep equality of generator states and state dicts (tensors, arrays, tuples, dicts, numbers)."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return a == b


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
