"""cleanrl_q_utils.training_run: the Run a script trains inside, driven directly. Signals and the checkpointed stop,
where checkpoints fall, atomic saves, the resume hint, the run folder and its lock, the NaN stop read from the device
flag, the TensorBoard purge on resume, the saved plain values handed back by `restoring` and the fast-forward of the
environments.

These tests call Run's methods (checkpoint_due, save, stopped, restoring, check_finite, fast_forward) and
command_line.parse as the scripts do; what the scripts do with them is tested through their `main` in test_resume.py
and test_signals.py."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
import torch.nn as nn
from toy_run import FORMAT, SCRIPT, Args, start

from cleanrl_q_utils.checkpoint_files import read_checkpoint
from cleanrl_q_utils.command_line import resume
from cleanrl_q_utils.episode_scores import EpisodeStats
from cleanrl_q_utils.training_run import Run

from helpers import end_iteration, run_dir_of


@pytest.fixture(autouse=True)
def in_tmp(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)


def test_first_signal_asks_for_a_checkpointed_stop_and_handlers_are_restored_on_every_exit():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stop:  # the stopped run leaves its block with 128 + the signal's number
        with start() as run:
            assert signal.getsignal(signal.SIGINT) != before[0]
            assert not end_iteration(run, 10, 10, False, lambda: {"x": 1})
            assert not os.path.exists(run.checkpoint_path)  # --checkpoint-every 0: none without a signal
            signal.raise_signal(signal.SIGTERM)
            assert end_iteration(run, 20, 10, False, lambda: {"x": 2}) and run.stopped
            assert read_checkpoint(run.checkpoint_path)["global_step"] == 20
    assert stop.value.code == 128 + signal.SIGTERM
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before

    with pytest.raises(SystemExit) as stop:  # a second Ctrl-C exits at once, with 128 + its number
        with start():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
    assert stop.value.code == 128 + signal.SIGINT
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before

    with pytest.raises(SystemExit) as stop:  # so does Ctrl-C after a SIGTERM: a person wants out
        with start():
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGINT)
    assert stop.value.code == 128 + signal.SIGINT

    with pytest.raises(SystemExit) as stop:  # SIGTERM and SIGHUP again do not: the stop goes on, with its checkpoint
        with start() as run:
            for signum in (signal.SIGTERM, signal.SIGTERM, signal.SIGHUP):
                signal.raise_signal(signum)
            assert end_iteration(run, 30, 10, False, lambda: {"x": 3}) and run.stopped
    assert read_checkpoint(run.checkpoint_path)["global_step"] == 30

    with pytest.raises(SystemExit):  # an error leaving the block restores them too
        with start():
            raise SystemExit("error")
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_signal_arriving_while_a_checkpoint_is_written_is_answered_by_the_next_checkpoint():
    """The stop flag is read once: a signal between the checkpoint test and the stop test must not end the run
    with an older checkpoint than its last step."""

    def state_with_signal():
        signal.raise_signal(signal.SIGINT)
        return {"x": 1}

    with pytest.raises(SystemExit), start(Args(checkpoint_every=10)) as run:
        assert not end_iteration(run, 10, 10, False, state_with_signal)  # due, and the signal comes meanwhile
        assert end_iteration(run, 15, 5, False, lambda: {"x": 2})
    assert read_checkpoint(run.checkpoint_path)["global_step"] == 15


@pytest.mark.parametrize(
    "every, steps, expected",
    [(100, [50, 100, 150, 250, 260], [100, 250, 260]), (0, [50, 100], []), (1000, [400, 800], [800])],
)
def test_checkpoints_fall_where_global_step_crosses_a_multiple_of_checkpoint_every_and_at_the_end(every, steps, expected):
    written = []
    with start(Args(checkpoint_every=every)) as run:
        run.save = lambda global_step, state, learned: written.append(global_step)
        for previous, step in zip([0] + steps, steps):
            end_iteration(run, step, step - previous, step == steps[-1], dict)
    assert written == expected


def run_child(code, tmp_path):
    child = textwrap.dedent(
        f"""
        import sys, signal, time, torch
        sys.path.insert(0, {os.getcwd()!r})
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from cleanrl_q_utils import command_line, episode_scores, training_run
        from toy_run import Args, SCRIPT
        from helpers import end_iteration
        """
    )
    return subprocess.Popen(
        [sys.executable, "-c", child + textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        text=True,
    )


def test_a_run_stopped_by_a_signal_exits_with_128_plus_its_number(tmp_path):
    process = run_child(
        """
        def main(args):
            with training_run.Run(args, None, SCRIPT, 7) as run:
                signal.raise_signal(signal.SIGTERM)
                assert end_iteration(run, 1, 1, False, lambda: {"x": 1})
        sys.argv = ["toy"]
        main(command_line.parse(Args))
        """,
        tmp_path,
    )
    assert process.wait() == 128 + signal.SIGTERM
    assert "continue the run" in process.stdout.read()


def test_a_second_ctrl_c_during_a_large_write_exits_cleanly_and_leaves_the_last_checkpoint(tmp_path):
    process = run_child(
        """
        with training_run.Run(Args(), None, SCRIPT, 7) as run:
            run.save(1, {"big": torch.ones(10)}, learned=())
            big = torch.ones(300_000_000)  # 1.2 GB: seconds to check and write
            print("saving", flush=True)
            run.save(2, {"big": big}, learned=())
        """,
        tmp_path,
    )
    process.stdout.readline()
    time.sleep(0.3)  # inside the large save
    process.send_signal(signal.SIGINT)
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 128 + signal.SIGINT
    assert "terminate called" not in process.stderr.read()  # no abort of the writing thread
    run_dir = run_dir_of(tmp_path)
    assert [path.name for path in run_dir.iterdir() if path.suffix == ".tmp"] == []  # the partial file is removed
    assert read_checkpoint(run_dir / "checkpoint.pt")["global_step"] == 1


def test_a_killed_save_leaves_the_previous_checkpoint_whole(tmp_path):
    """A child process keeps rewriting a large checkpoint and is killed with SIGKILL mid-write: the file left behind
    always loads, whole, as one of the states written."""
    child = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {os.getcwd()!r})
        from cleanrl_q_utils.training_run import Run
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from toy_run import Args, SCRIPT
        run = Run(Args(), None, SCRIPT, 7)
        big = torch.zeros(20_000_000)
        for i in range(1000):
            big.fill_(i)
            run.save(i, {{"big": big}}, learned=())
            print(i, flush=True)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, cwd=tmp_path, text=True)
    saves = 0
    while saves < 3:  # killed after a few whole saves, in the middle of a later one (other lines: the start-up block)
        saves += process.stdout.readline().strip().isdigit()
    process.kill()
    process.wait()
    run_dir = run_dir_of(tmp_path)
    saved = read_checkpoint(run_dir / "checkpoint.pt")
    big = saved["state"]["big"]
    assert big.numel() == 20_000_000 and bool((big == saved["global_step"]).all())


def test_the_resume_hint_works_from_any_directory(capsys, tmp_path, monkeypatch):
    with pytest.raises(SystemExit), start() as run:
        signal.raise_signal(signal.SIGINT)
        end_iteration(run, 10, 10, False, lambda: {"x": 1})
    hint = capsys.readouterr().out.splitlines()[-1].split()
    assert hint[:2] == ["python", SCRIPT] and os.path.isabs(hint[3]) and os.path.isfile(hint[3])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    args, checkpoint = resume(Args(resume=hint[3]), SCRIPT, FORMAT)
    with Run(args, checkpoint, SCRIPT, FORMAT) as resumed:  # goes on in the checkpoint's directory, the run's own
        assert end_iteration(resumed, 20, 10, True, lambda: {"x": 2}) is False
    assert os.path.samefile(resumed.checkpoint_path, hint[3]) and not (elsewhere / "runs").exists()


def test_a_checkpoint_outside_its_run_folder_resumes_into_the_run_folder_and_never_over_a_newer_step(tmp_path):
    with start(Args(checkpoint_every=1)) as run:
        backup = str(tmp_path / "somewhere" / "backup_step10.pt")
        os.makedirs(os.path.dirname(backup))
        os.link(run.save(10, {"x": 1}, learned=()), backup)
        run.save(20, {"x": 2}, learned=())
    other = tmp_path / "somewhere" / "checkpoint.pt"
    other.write_bytes(b"another run's file")
    args, checkpoint = resume(Args(resume=backup), SCRIPT, FORMAT)
    with pytest.raises(SystemExit, match=r"holds the run's checkpoint at step 20, newer than step 10: resume from it"):
        Run(args, checkpoint, SCRIPT, FORMAT)
    assert read_checkpoint(run.checkpoint_path)["global_step"] == 20  # untouched
    os.replace(run.checkpoint_path, other.with_name("newer.pt"))
    with open(run.checkpoint_path, "wb") as file:
        file.write(b"something else")
    with pytest.raises(SystemExit, match=r"checkpoint.pt is not a checkpoint of this run; move it away to resume$"):
        Run(args, checkpoint, SCRIPT, FORMAT)
    os.remove(run.checkpoint_path)  # moved away: the backup resumes into the run's folder, not beside the backup
    with Run(args, checkpoint, SCRIPT, FORMAT) as resumed:
        resumed.save(11, {"x": 3}, learned=())
    assert resumed.dir == run.dir and read_checkpoint(run.checkpoint_path)["global_step"] == 11
    assert other.read_bytes() == b"another run's file"
    assert sorted(os.listdir(other.parent)) == ["backup_step10.pt", "checkpoint.pt", "newer.pt"]


def test_a_second_process_cannot_run_a_run_that_is_running():
    with start(Args(checkpoint_every=1)) as run:
        path = run.save(10, {"x": 1}, learned=())
        args, checkpoint = resume(Args(resume=path), SCRIPT, FORMAT)
        with pytest.raises(SystemExit, match=r"is running in another process"):
            Run(args, checkpoint, SCRIPT, FORMAT)
    child = (
        f"import fcntl, os, time; fd = os.open({run.dir!r}, os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); "
        "print(1, flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "1"
    with pytest.raises(SystemExit, match=r"is running in another process"):
        Run(args, checkpoint, SCRIPT, FORMAT)
    holder.kill()  # a process that dies does not leave the lock behind
    holder.wait()
    with Run(args, checkpoint, SCRIPT, FORMAT) as resumed:
        assert resumed.dir == run.dir


def test_a_state_with_nan_is_not_written_and_the_previous_checkpoint_stays():
    with start() as run:
        layer = nn.Linear(2, 2)
        path = run.save(
            5, {"layer": layer.state_dict(), "tree": np.full(4, np.inf)}, learned=("layer",)
        )  # inf outside the weights is fine
        with torch.no_grad():
            layer.weight[0, 1] = float("nan")
        with pytest.raises(SystemExit, match=f"non-finite values in the state at step 9.*last good checkpoint: {path}"):
            run.save(9, {"layer": layer.state_dict(), "tree": np.full(4, np.inf)}, learned=("layer",))
    assert read_checkpoint(path)["global_step"] == 5


def test_a_full_disk_says_so_names_the_last_good_checkpoint_and_leaves_no_partial_file(monkeypatch, capsys):
    def full_disk(obj, file):
        file.write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc] basic_ios::clear: iostream error")

    with start() as run:
        path = run.save(5, {"w": torch.ones(3)}, learned=())
        with monkeypatch.context() as patch:
            patch.setattr(torch, "save", full_disk)
            with pytest.raises(SystemExit) as stop:
                run.save(9, {"w": torch.ones(3)}, learned=())
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: writing the checkpoint failed at step 9") and f"last good checkpoint: {path}" in line
    assert [name for name in os.listdir(os.path.dirname(path)) if name.endswith(".tmp")] == []
    assert read_checkpoint(path)["global_step"] == 5


def test_nan_stop_reads_the_device_flag_and_names_the_last_good_checkpoint():
    """The scripts keep `updates_finite`, the AND of every update's finite gradient norm, on the device: the check reads
    it (one synchronisation) and stops in one line naming the last checkpoint written, which never holds NaN."""
    layer = nn.Linear(3, 2)
    with start() as run:
        (layer(torch.ones(1, 3)).sum() * 2).backward()
        updates_finite = torch.isfinite(torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0))
        run.check_finite(updates_finite, 5)  # finite: nothing happens
        path = run.save(5, {"layer": layer.state_dict()}, learned=("layer",))
        layer.zero_grad()
        (layer(torch.full((1, 3), float("nan"))).sum()).backward()
        updates_finite &= torch.isfinite(torch.nn.utils.clip_grad_norm_(layer.parameters(), float("inf")))
        with pytest.raises(SystemExit, match=f"non-finite loss or Q-values by step 9; last good checkpoint: {path}"):
            run.check_finite(updates_finite, 9)


def scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir))
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars("x")]


def test_a_resumed_run_keeps_the_checkpoints_step_and_drops_what_the_killed_run_logged_after_it():
    with start() as run:
        for step in range(1, 11):
            run.writer.add_scalar("x", step, step)
            if step == 5:
                path = run.save(step, {}, learned=())
    # A resumed run is a later process: its event file sorts after the first one's (names hold the second and a
    # per-process counter, which in this long-lived test process could sort the other way within one second).
    time.sleep(1.1)
    args, checkpoint = resume(Args(resume=path), SCRIPT, FORMAT)
    with Run(args, checkpoint, SCRIPT, FORMAT) as run:
        for step in range(6, 9):
            run.writer.add_scalar("x", 100 + step, step)
    assert scalars(run.dir) == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 106), (7, 107), (8, 108)]


def test_restoring_hands_back_the_saved_plain_values_and_restores_the_random_generators_on_leaving():
    torch.manual_seed(0)
    network = nn.Linear(4, 2)
    optimizer = torch.optim.Adam(network.parameters())
    network(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    rng = np.random.default_rng(0)
    rng.random(5)
    state = dict(
        network=network.state_dict(),
        optimizer=optimizer.state_dict(),
        rng=rng.bit_generator.state,
        action_log=np.full((4, 2), 3, dtype=np.uint8),
        hidden=torch.full((3,), 2.0),
        losses=[0.5],
        updates=17,
    )
    with start() as run:
        run.save(4, state, learned=("network", "optimizer"))
        expected_random = torch.rand(3)
    args, checkpoint = resume(Args(resume=run.checkpoint_path), SCRIPT, FORMAT)
    torch.rand(10)  # the generators move on before the restore
    fresh = nn.Linear(4, 2)
    with Run(args, checkpoint, SCRIPT, FORMAT) as resumed:
        with resumed.restoring() as saved:
            fresh.load_state_dict(saved["network"])
            torch.rand(5)  # building and filling draws: the generators are restored on leaving, last
    assert saved["updates"] == 17 and saved["losses"] == [0.5] and torch.equal(saved["hidden"], torch.full((3,), 2.0))
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), network.parameters()))
    assert saved["optimizer"]["state"][0]["step"] == 1
    assert np.array_equal(saved["action_log"], np.full((4, 2), 3)) and saved["action_log"].dtype == np.uint8
    restored = np.random.default_rng()
    restored.bit_generator.state = saved["rng"]
    assert restored.random() == rng.random()
    assert torch.equal(torch.rand(3), expected_random)  # the global generators continue where the checkpoint was


def test_a_state_that_does_not_fit_the_run_stops_in_one_line():
    with start() as run:
        path = run.save(4, {"a": 1}, learned=())
    args, checkpoint = resume(Args(resume=path), SCRIPT, FORMAT)
    with Run(args, checkpoint, SCRIPT, FORMAT) as resumed, pytest.raises(SystemExit, match="does not fit this run"):
        with resumed.restoring() as saved:
            nn.Linear(2, 2).load_state_dict(saved["b"])


def test_a_learning_rate_given_on_resume_is_the_one_the_restored_optimizer_steps_with(monkeypatch):
    from cleanrl_q_utils.flat_radam import RAdam

    def make():
        network = nn.Linear(4, 2)
        return torch.optim.Adam(network.parameters(), lr=0.5), RAdam(torch.zeros(3), lr=0.5)

    optimizer, flat = make()
    with start(Args(learning_rate=0.5)) as run:
        path = run.save(4, {"optimizer": optimizer.state_dict(), "flat": flat.state_dict()}, learned=("optimizer", "flat"))
    for given, expected in ((["--learning-rate", "0.01"], 0.01), ([], 0.5)):  # not given: the checkpoint's step size
        monkeypatch.setattr(sys, "argv", ["toy.py", "--resume", path, *given])
        args, checkpoint = resume(Args(resume=path, learning_rate=0.01 if given else 0.5), SCRIPT, FORMAT)
        optimizer, flat = make()  # built with args.learning_rate, as a script does, then restored
        with Run(args, checkpoint, SCRIPT, FORMAT) as resumed, resumed.restoring() as saved:
            optimizer.load_state_dict(saved["optimizer"])
            flat.load_state_dict(saved["flat"])
        assert optimizer.param_groups[0]["lr"] == expected and flat.lr == expected


class CountingEnvs:
    """envpool stand-in: the observation is the running sum of each env's actions, restarted by `reset`."""

    def __init__(self):
        self.position, self.steps, self.resets = np.zeros(2, dtype=np.int64), 0, 0

    def reset(self):
        self.position[:], self.resets = 100, self.resets + 1
        return self.position.copy(), {"lives": np.ones(2)}

    def step(self, actions):
        self.position += actions
        self.steps += 1
        return (self.position.copy(), np.ones(2, dtype=np.float32), np.zeros(2, bool), np.zeros(2, bool), {})


def fast_forward(run, envs, log, obs, stats=None):
    return run.fast_forward(envs, log, obs, stats or EpisodeStats(2))


def test_fast_forward_steps_through_the_logged_actions_and_detects_divergence():
    log = np.array([[1, 2], [3, 4]], dtype=np.uint8)
    with start() as run:
        envs = CountingEnvs()
        assert fast_forward(run, envs, log, np.array([4, 6]))[0] is envs and envs.steps == 2
        with pytest.raises(SystemExit, match="diverged"):
            fast_forward(run, CountingEnvs(), log, np.array([4, 7]))


def test_a_fresh_resume_steps_nothing_counts_the_dropped_games_and_leaves_the_scripts_state_to_the_script(capsys):
    with start(Args(checkpoint_every=1)) as run:
        path = run.save(40, {"x": 1}, learned=())
    args, checkpoint = resume(Args(resume=path, resume_fresh_envs=True), SCRIPT, FORMAT)
    assert args.resume_fresh_envs
    with Run(args, checkpoint, SCRIPT, FORMAT) as resumed:
        assert resumed.env_seed == args.seed + 40  # new games, not the run's first ones again
        stats = EpisodeStats(2)
        stats.returns[:], stats.lengths[:] = [5.0, 0.0], [5, 0]  # env 0 is in a game, env 1 at its reset step
        inner = CountingEnvs()
        envs, obs = fast_forward(resumed, inner, np.ones((20, 2), np.uint8), np.array([7, 7]), stats)
        assert inner.steps == 0 and list(obs) == [7, 7]  # nothing replayed; the loop acts once more from the old obs
        assert list(stats.returns) == [5.0, 0.0] and list(stats.lengths) == [5, 0]  # read, not changed: the script drops
        stats.drop_games_in_progress()
        assert not stats.returns.any() and not stats.lengths.any() and stats.scores == []
        assert (
            "fresh environments (no fast-forward through the 40 logged agent steps); 1 games in progress dropped"
            in capsys.readouterr().out
        )
        first = envs.step(np.array([3, 3]))  # envpool's reset step: actions ignored, a new game's first observation
        assert list(first[0]) == [100, 100] and not first[1].any() and not (first[2] | first[3]).any() and "lives" in first[4]
        assert list(envs.step(np.array([3, 3]))[0]) == [103, 103] and inner.steps == 1  # then the real envs
        resumed.save(60, {"x": 2}, learned=())
    # An exact resume later replays only the actions since the fresh start, from its reset step on.
    args, checkpoint = resume(Args(resume=path), SCRIPT, FORMAT)
    assert not args.resume_fresh_envs and checkpoint["envs_start"] == 40
    with Run(args, checkpoint, SCRIPT, FORMAT) as again:
        assert again.env_seed == args.seed + 40
        log = np.zeros((30, 2), np.uint8)
        log[20:] = 1  # rows 0-19: before the cut (not replayed); row 20: the reset step; rows 21-29: nine real steps
        envs, obs = fast_forward(again, CountingEnvs(), log, np.array([109, 109]))
        assert envs.envs.steps == 9 and envs.envs.resets == 1
    assert "through 20 logged agent steps (10 steps of 2 envs)" in capsys.readouterr().out


def test_fresh_environments_far_into_a_run_get_a_seed_envpool_takes(tmp_path):
    seed = 2**31 - 2**16 - 1  # the largest seed the flags allow
    with start(Args(seed=seed, checkpoint_every=1)) as run:
        path = run.save(10**10, {"x": 1}, learned=())
    args, checkpoint = resume(Args(resume=path, resume_fresh_envs=True), SCRIPT, FORMAT)
    with Run(args, checkpoint, SCRIPT, FORMAT) as resumed:
        assert resumed.env_seed == (seed + 10**10) % 2**31 and 0 <= resumed.env_seed < 2**31


def test_a_signal_during_the_fast_forward_exits_at_once():
    class SignalledEnvs(CountingEnvs):
        def step(self, actions):
            signal.raise_signal(signal.SIGTERM)
            return super().step(actions)

    with pytest.raises(SystemExit) as stop, start() as run:
        fast_forward(run, SignalledEnvs(), np.ones((100, 2), dtype=np.uint8), np.zeros(2))
    assert stop.value.code == 128 + signal.SIGTERM


def test_a_long_fast_forward_says_how_long_it_takes_and_shows_its_progress(monkeypatch, capsys):
    from cleanrl_q_utils import environments

    log = np.ones((200, 2), dtype=np.uint8)
    with start() as run:
        clock = [0.0]

        def tick():  # every call a quarter second later: one env step takes about that long
            clock[0] += 0.25
            return clock[0]

        monkeypatch.setattr(environments.time, "time", tick)
        fast_forward(run, CountingEnvs(), log, np.array([200, 200]))
        monkeypatch.undo()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resume: fast-forward")]
    assert lines[0] == (
        "resume: fast-forwarding the environments through 400 logged agent steps (200 steps of 2 envs) to rebuild "
        "their games (a checkpoint holds no game state; --resume-fresh-envs skips this)"
    )
    assert re.fullmatch(r"resume: fast-forwarded \d+/400 agent steps \(\d+%\), 00:0\d:\d\d left", lines[1]) and len(lines) > 4
    assert lines[-1].startswith("resume: fast-forward done in 00:0")
