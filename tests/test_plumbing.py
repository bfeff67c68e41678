"""The shared run plumbing (cleanrl_q_utils: training_run, stop_signals, checkpoint_files, command_line): signals,
atomic checkpoints, resume flags, the NaN stop, the TensorBoard purge step, and in-place restore of a script's
checkpoint state."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest
import torch
import torch.nn as nn

from cleanrl_q_utils.checkpoint_files import read_checkpoint
from cleanrl_q_utils.command_line import resume
from cleanrl_q_utils.episode_scores import EpisodeStats
from cleanrl_q_utils.flag_errors import check_flags
from cleanrl_q_utils.training_run import Run

from helpers import end_iteration, run_dir_of

FORMAT = 7


@dataclass
class Args:
    exp_name: str = "toy"
    seed: int = 1
    cuda: bool = False
    track: bool = False
    wandb_project_name: str = "cleanrl-q"
    wandb_entity: Optional[str] = None
    env_id: str = "Toy-v0"
    total_timesteps: int = 100
    learning_rate: float = 1e-3
    checkpoint_every: int = 0
    resume: Optional[str] = None
    resume_fresh_envs: bool = False


SCRIPT = "/somewhere/cleanrl/toy.py"


def start(args=None, checkpoint=None):
    return Run(args or Args(), checkpoint, SCRIPT, FORMAT)


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
        from test_plumbing import Args, SCRIPT
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
        from test_plumbing import Args, SCRIPT
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


def test_resume_keeps_the_checkpoints_flags_unless_given_and_a_given_flag_wins_whatever_its_value(capsys, monkeypatch):
    with start(Args(seed=3, learning_rate=0.5, checkpoint_every=1000, cuda=True)) as run:
        path = run.save(40, {"x": 1}, learned=())
    args, checkpoint = resume(Args(resume=path), SCRIPT, FORMAT)  # as the printed hint runs it
    assert (args.seed, args.learning_rate, args.checkpoint_every, args.resume) == (3, 0.5, 1000, path)
    assert checkpoint["global_step"] == 40 and checkpoint["changed"] == []
    # Given on the command line with the default's value: still given, so it wins over the checkpoint's.
    monkeypatch.setattr(
        sys, "argv", ["toy.py", "--resume", path, "--learning-rate=0.001", "--checkpoint_every", "0", "--no-cuda"]
    )
    args, checkpoint = resume(Args(resume=path), SCRIPT, FORMAT)
    assert (args.learning_rate, args.checkpoint_every, args.cuda) == (1e-3, 0, False)
    assert checkpoint["changed"] == ["--checkpoint-every 1000 -> 0", "--cuda True -> False", "--learning-rate 0.5 -> 0.001"]
    with Run(args, checkpoint, SCRIPT, FORMAT):
        pass
    assert "flags changed on resume: --checkpoint-every 1000 -> 0, --cuda True -> False" in capsys.readouterr().out
    # A flag that cannot change is refused by name, unless given with the checkpoint's own value (as a launcher does).
    monkeypatch.setattr(sys, "argv", ["toy.py", "--resume", path, "--seed", "9"])
    with pytest.raises(SystemExit, match=r"^error: --seed=9: cannot change on resume \(the checkpoint has 3\)"):
        resume(Args(resume=path, seed=9), SCRIPT, FORMAT)
    monkeypatch.setattr(sys, "argv", ["toy.py", "--resume", path, "--seed", "3", "--total-timesteps", "100"])
    assert resume(Args(resume=path, seed=3), SCRIPT, FORMAT)[0].seed == 3
    assert resume(Args(), SCRIPT, FORMAT) == (Args(), None)


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


class RunsCode:
    """Unpickling this object creates the file `marker`: what a crafted checkpoint could do with any code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("where", ["top", "state", "model", "bare pickle"])
def test_a_file_whose_unpickling_would_run_code_is_refused_without_running_it(tmp_path, where):
    import pickle
    import warnings

    from cleanrl_q_utils.model_files import read_model_file

    marker, path = tmp_path / "ran", str(tmp_path / "evil.pt")
    with start(Args(checkpoint_every=1)) as run:
        good = read_checkpoint(run.save(1, {"x": 1}, learned=()))
    content = {"top": RunsCode(str(marker)), "state": dict(good, state={"x": RunsCode(str(marker))})}.get(where)
    if where == "bare pickle":  # not torch's zip format, and a pickle protocol torch warns about
        with open(path, "wb") as file:
            pickle.dump(RunsCode(str(marker)), file, protocol=4)
    else:
        torch.save(content if where != "model" else {"kind": "cleanrl-q model", "model": RunsCode(str(marker))}, path)
    with (
        warnings.catch_warnings(record=True) as warned,
        pytest.raises(
            SystemExit,
            # a bare pickle is not even read: it is not the zip archive torch.save writes
            match=r"^error: --(resume|model-path)=.*evil.pt: not a readable (checkpoint|model file) "
            r"\((it holds Python |not a zip archive as torch.save writes it)",
        ),
    ):
        warnings.simplefilter("always")
        if where == "model":
            read_model_file(path)
        else:
            resume(Args(resume=path), SCRIPT, FORMAT)
    assert not marker.exists() and [str(warning.message) for warning in warned] == []  # the one line only
    with open(path, "rb") as file:  # the file is not harmless: read unsafely, it runs code
        pickle.load(file) if where == "bare pickle" else torch.load(file, weights_only=False)
    assert marker.exists()


def test_weights_of_another_network_are_refused_in_one_line(tmp_path):
    from cleanrl_q_utils.model_files import put_weights, read_model_file

    path = str(tmp_path / "other.cleanrl_model")
    torch.save(nn.Linear(3, 2).state_dict(), path)  # bare weights, as an older or another script wrote them
    with pytest.raises(SystemExit, match=r"^error: --model-path=.*other.cleanrl_model: its weights do not fit this script"):
        put_weights(nn.Sequential(nn.Linear(4, 2)), read_model_file(path)["model"], path)


def test_fresh_environments_far_into_a_run_get_a_seed_envpool_takes(tmp_path):
    seed = 2**31 - 2**16 - 1  # the largest seed the flags allow
    with start(Args(seed=seed, checkpoint_every=1)) as run:
        path = run.save(10**10, {"x": 1}, learned=())
    args, checkpoint = resume(Args(resume=path, resume_fresh_envs=True), SCRIPT, FORMAT)
    with Run(args, checkpoint, SCRIPT, FORMAT) as resumed:
        assert resumed.env_seed == (seed + 10**10) % 2**31 and 0 <= resumed.env_seed < 2**31


def test_runs_started_in_the_same_second_get_directories_of_their_own():
    with start() as first, start() as second:
        assert first.dir != second.dir and os.path.isdir(first.dir) and os.path.isdir(second.dir)


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


def test_a_checkpoint_with_bytes_flipped_inside_a_tensor_is_refused():
    with start() as run:
        path = run.save(5, {"w": torch.full((64,), 1234.5)}, learned=())
    data = bytearray(open(path, "rb").read())
    at = data.index(np.float32(1234.5).tobytes() * 4)  # inside the tensor's stored values
    data[at + 1] ^= 0xFF
    data[at + 6] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(SystemExit, match="checksum"):
        resume(Args(resume=path), SCRIPT, FORMAT)


@pytest.mark.parametrize(
    "script, fmt, content, message",
    [
        ("/x/cleanrl/other.py", FORMAT, None, "written by toy.py, not other.py"),
        (SCRIPT, FORMAT + 1, None, "format 7, expected 8"),
        (SCRIPT, FORMAT, b"not a checkpoint", "not a readable checkpoint"),
    ],
)
def test_resume_stops_with_one_clear_line_on_a_foreign_or_broken_checkpoint(script, fmt, content, message):
    with start() as run:
        path = run.save(40, {"x": 1}, learned=())
    if content is not None:
        with open(path, "wb") as file:
            file.write(content)
    with pytest.raises(SystemExit, match=message):
        resume(Args(resume=path), script, fmt)
    with pytest.raises(SystemExit, match="--resume=nowhere.pt: no such file"):
        resume(Args(resume="nowhere.pt"), SCRIPT, FORMAT)
    os.makedirs("a_folder")
    with pytest.raises(SystemExit, match="--resume=a_folder: not a file"):
        resume(Args(resume="a_folder"), SCRIPT, FORMAT)


def test_check_flags_names_the_first_bad_flag():
    with pytest.raises(SystemExit, match=r"^error: --num-envs=0: at least 1$"):
        check_flags([("seed", 1, True, "any"), ("num_envs", 0, False, "at least 1"), ("gamma", 2, False, "in [0, 1]")])


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


def test_a_signal_during_the_fast_forward_exits_at_once():
    class SignalledEnvs(CountingEnvs):
        def step(self, actions):
            signal.raise_signal(signal.SIGTERM)
            return super().step(actions)

    with pytest.raises(SystemExit) as stop, start() as run:
        fast_forward(run, SignalledEnvs(), np.ones((100, 2), dtype=np.uint8), np.zeros(2))
    assert stop.value.code == 128 + signal.SIGTERM


def test_episode_stats_counts_whole_episodes_without_the_reset_step():
    stats = EpisodeStats(2)
    steps = [  # reward, is_reset_step, episode_over
        ([1.0, 1.0], [False, False], [False, False]),
        ([2.0, 1.0], [False, False], [True, False]),
        ([0.0, 5.0], [True, False], [False, True]),
        ([1.0, 0.0], [False, True], [False, False]),
    ]
    finished = [stats.update(np.array(r), np.array(reset), np.array(over)) for r, reset, over in steps]
    assert finished == [[], [(3.0, 2)], [(7.0, 3)], []]
    assert stats.scores == [3.0, 7.0] and list(stats.returns) == [1.0, 0.0] and list(stats.lengths) == [1, 0]


def test_a_model_file_and_a_checkpoint_are_not_taken_for_each_other(tmp_path):
    from cleanrl_q_utils.checkpoint_files import content_digest, to_safe
    from cleanrl_q_utils.model_files import read_model_file, save_weights

    model = str(tmp_path / "toy.cleanrl_model")
    save_weights(model, SCRIPT, Args(), nn.Linear(2, 2).state_dict())
    with pytest.raises(SystemExit, match=r"^error: --resume=.*toy.cleanrl_model: a model file \(--save-model\), not a"):
        resume(Args(resume=model), SCRIPT, FORMAT)
    with start(Args(checkpoint_every=1)) as run:
        path = run.save(3, {"x": 1}, learned=())
    with pytest.raises(SystemExit, match=r"^error: --model-path=.*checkpoint.pt: a checkpoint, not a model file"):
        read_model_file(path)
    # A file crafted with a valid checksum but a flag of the wrong type is refused before anything uses the flag.
    crafted = read_checkpoint(path)
    crafted["args"]["learning_rate"] = "0.1; rm -rf /"
    crafted["digest"] = content_digest({key: value for key, value in crafted.items() if key != "digest"})
    torch.save(to_safe(crafted), path)
    with pytest.raises(
        SystemExit, match=r"^error: --resume=.*: not a readable checkpoint \(ValueError: its flag learning_rate"
    ):
        resume(Args(resume=path), SCRIPT, FORMAT)


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


def test_gymnasium_saying_a_stopped_recording_was_not_saved_is_silenced():
    # In a child process: pytest's own warning filters (pyproject.toml) would hide the warning anyway.
    code = (
        "import warnings, cleanrl_q_utils.environments\n"  # what gymnasium's RecordVideo warns when collected unclosed
        "warnings.warn('\\x1b[33mWARN: Unable to save last video! Did you call close()?\\x1b[0m', UserWarning)\n"
        "warnings.warn('another warning', UserWarning)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
    assert done.returncode == 0 and "another warning" in done.stderr and "video" not in done.stderr, done.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_cpu_runs_reuse_the_memory_of_freed_tensors_instead_of_faulting_it_in_again():
    # IQN's target pass in miniature: tensors of 32 x 40 x 1024 floats made and freed at every call, counted in a child
    # process whose allocator starts untouched. Without the setting pick_device makes on the CPU, glibc's default
    # faults in 26k to 53k pages over these 20 calls (measured); one 5 MiB tensor faulted in again is 1,280.
    code = (
        "import resource, torch\n"
        "from cleanrl_q_utils import run_folder\n"
        "run_folder.pick_device(cuda=False, cpu_threads=1)\n"
        "embed, head = torch.nn.Linear(64, 1024), torch.nn.Linear(1024, 128)\n"
        "def forward():\n"
        "    with torch.no_grad():\n"
        "        return head(torch.rand(32, 1, 1024) * embed(torch.rand(32, 40, 64)).relu())\n"
        "for _ in range(3): forward()\n"  # the heap grows to its working size
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for _ in range(20): forward()\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < 1280
