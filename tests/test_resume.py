"""Checkpoint and resume of every script that writes checkpoints, tested through each script's `main` and the files it
writes: a signal stops a run with a checkpoint; an interrupted and resumed run ends bitwise equal to the uninterrupted
one; a resume without the saved replay refills it; damaged, foreign, older or NaN-holding checkpoints and changed flags
are refused in one line; a non-finite loss, read from the device at the next logging interval or checkpoint, stops a run
naming its last good checkpoint; --resume-fresh-envs starts new games; a tracked run continues its W&B run.

Scenarios that hold for every script are parametrized over the scripts; those that hold for some (a replay, Atari
frames) over those. The uninterrupted reference run of each script, and the early checkpoint the refusal tests damage,
are made once per module and only read by the tests (each test works on its own copy in its own folder)."""

import os
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from cleanrl import (
    dqn_dueling_per,
    iqn,
    iqn_atari,
    pqn,
    pqn_atari_envpool,
    pqn_atari_envpool_lstm,
    r2d2,
    r2d2_atari,
    recurrent_iqn,
    recurrent_iqn_atari,
)
from cleanrl_q_utils.checkpoint_files import content_digest, read_checkpoint, to_safe

from helpers import checkpoint_of, run_dir_of
from interrupts import interrupt_at_step, run_until_stopped
from tiny import tiny

VECTOR = {module.__name__.rsplit(".", 1)[-1]: module for module in (pqn, dqn_dueling_per, iqn, r2d2, recurrent_iqn)}


def logged_scalars(root) -> dict:
    """Every scalar (but the wall-clock SPS) of the one run under root/runs, as {tag: [(step, value)]}; TensorBoard
    applies the purge of what an interrupted run logged after its checkpoint."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir_of(root)), size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = [tag for tag in accumulator.Tags()["scalars"] if tag != "charts/SPS"]
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)] for tag in tags}


def assert_same(a, b, where="state"):
    """Fails, naming the entry, unless `a` and `b` (nested dicts, lists, tensors, arrays, plain values) are equal
    bitwise and of the same type."""
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, dict):
        assert a.keys() == b.keys(), (where, set(a) ^ set(b))
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), where
    else:
        assert a == b, where


def wait_for_a_later_second_than_the_log(root=".") -> None:
    """Waits, if need be, until a wall-clock second later than the one the newest TensorBoard event file of the run under
    root/runs was started in: TensorBoard reads event files in name order, that second, then a per-process counter
    that sorts "10" before "9". A real resume is a later process; a resume in the test's process must start its log in
    a later second than the run it resumes."""
    newest = max(int(path.name.split(".")[3]) for path in run_dir_of(root).glob("events.out.tfevents.*"))
    time.sleep(max(0.0, newest + 1 - time.time()))


def stop_and_resume(module, flags: dict, stop_at: int, **resume_flags):
    """Runs `flags` in the working directory until a SIGINT at the `stop_at`-th envs.step, then resumes it to the end;
    returns (the checkpoint at the stop, the resumed run's scores, its final checkpoint)."""
    with pytest.MonkeyPatch.context() as patch:
        interrupt_at_step(patch, module, stop_at)
        run_until_stopped(module.main, module.Args(**flags))
    path = checkpoint_of()
    stopped = read_checkpoint(path)
    wait_for_a_later_second_than_the_log()
    scores = module.main(module.Args(resume=str(path), cuda=False, **resume_flags))
    return stopped, scores, read_checkpoint(path)


# --- a signal stops a run with a checkpoint ------------------------------------------------------------------------

# The envs.step call the signal arrives at, and the step of the checkpoint written: PQN finishes its rollout of 16
# steps, the others stop after the step that got the signal.
SIGNALLED = {
    "pqn": (40, 3 * 64),
    "dqn_dueling_per": (50, 200),
    "iqn": (50, 200),
    "r2d2": (100, 400),
    "recurrent_iqn": (50, 200),
}


def replay_left_out(state: dict) -> bool:
    """Whether a checkpoint's state holds no replay arrays (without --checkpoint-replay): none at all, or r2d2's
    counters alone."""
    rb = state.get("rb")
    return rb is None or isinstance(rb, dict) and set(rb) == {"pos", "episode_start"}


@pytest.mark.parametrize("name", SIGNALLED)
def test_a_signal_stops_the_run_with_a_checkpoint_of_its_last_step_and_restores_the_handlers(name, monkeypatch, tmp_path):
    module, (stop_at, step) = VECTOR[name], SIGNALLED[name]
    monkeypatch.chdir(tmp_path)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    interrupt_at_step(monkeypatch, module, stop_at)
    run_until_stopped(module.main, module.Args(**tiny(module), save_model=True))
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    path = checkpoint_of(tmp_path)
    checkpoint = read_checkpoint(path)
    assert checkpoint["global_step"] == step
    action_log = checkpoint["state"]["action_log"]  # one row of actions per envs.step, for the resume's fast-forward
    assert action_log.shape == (step // 4, 4) and action_log.dtype == np.uint8
    if name != "pqn":
        assert replay_left_out(checkpoint["state"])  # no --checkpoint-replay
    # An interrupted run is neither saved as a model nor evaluated, and leaves no partial file.
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.startswith("events.")) == ["checkpoint.pt"]


# --- an interrupted and resumed run equals the uninterrupted one ---------------------------------------------------

# name: (module, flags, the envs.step call of the interruption, the step of its checkpoint). Every run learns before
# and after the interruption, and the interruption falls between two periodic checkpoints.
EXACT = {
    "pqn": (pqn, tiny("pqn", checkpoint_every=1024), 250, 1024),
    "dqn_dueling_per": (dqn_dueling_per, tiny("dqn_dueling_per", checkpoint_replay=True, checkpoint_every=1000), 240, 960),
    "iqn": (iqn, tiny("iqn", checkpoint_replay=True, checkpoint_every=1000), 240, 960),
    "r2d2": (r2d2, tiny("r2d2", checkpoint_replay=True, checkpoint_every=1000), 237, 948),  # with open windows
    "recurrent_iqn": (
        recurrent_iqn,
        tiny("recurrent_iqn", total_timesteps=1200, checkpoint_replay=True, checkpoint_every=500),
        150,
        600,
    ),
    "recurrent_iqn-prioritized": (
        recurrent_iqn,
        tiny("recurrent_iqn", total_timesteps=1200, checkpoint_replay=True, checkpoint_every=500, prioritized_replay=True),
        150,
        600,
    ),
    "pqn_atari_envpool": (
        pqn_atari_envpool,
        tiny("pqn_atari_envpool", total_timesteps=128, num_steps=16, checkpoint_every=128),
        5,
        64,
    ),
    "pqn_atari_envpool_lstm": (
        pqn_atari_envpool_lstm,
        tiny("pqn_atari_envpool_lstm", total_timesteps=128, num_steps=16, checkpoint_every=128),
        5,
        64,
    ),
    "dqn_dueling_per-atari": (  # the frame rings of 32 wrap after the stop
        dqn_dueling_per,
        tiny("dqn_dueling_per", atari=True, checkpoint_replay=True, checkpoint_every=96),
        20,
        40,
    ),
    "iqn_atari": (  # stopped between updates, after learning started at step 160
        iqn_atari,
        tiny("iqn_atari", total_timesteps=200, checkpoint_replay=True, checkpoint_every=10_000),
        85,
        170,
    ),
    "r2d2_atari": (r2d2_atari, tiny("r2d2_atari", checkpoint_replay=True, checkpoint_every=10_000), 80, 160),
    "recurrent_iqn_atari": (
        recurrent_iqn_atari,
        tiny("recurrent_iqn_atari", env_id="Breakout-v5", checkpoint_replay=True, checkpoint_every=400),
        45,
        180,
    ),
}


@dataclass
class Finished:
    scores: list
    checkpoint: dict
    scalars: dict


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """The uninterrupted run of an EXACT entry, made once per module: `reference_run(name)` is a `Finished` that
    tests read and never change."""
    done = {}

    def run(name: str) -> Finished:
        if name not in done:
            module, flags, _, _ = EXACT[name]
            folder = tmp_path_factory.mktemp(name)
            with pytest.MonkeyPatch.context() as patch:
                patch.chdir(folder)
                scores = module.main(module.Args(**flags))
            done[name] = Finished(scores, read_checkpoint(checkpoint_of(folder)), logged_scalars(folder))
        return done[name]

    return run


@pytest.mark.parametrize("name", EXACT)
def test_an_interrupted_and_resumed_run_ends_bitwise_equal_to_the_uninterrupted_run(
    name, reference_run, monkeypatch, tmp_path
):
    module, flags, stop_at, stopped_step = EXACT[name]
    reference = reference_run(name)
    monkeypatch.chdir(tmp_path)
    stopped, scores, final = stop_and_resume(module, flags, stop_at, checkpoint_every=flags["checkpoint_every"])
    assert stopped["global_step"] == stopped_step < final["global_step"] == reference.checkpoint["global_step"]
    if "updates" in stopped["state"]:  # learning went on on both sides of the stop
        assert 0 < stopped["state"]["updates"] < final["state"]["updates"]
    assert scores == reference.scores
    # Everything a resume needs: networks, optimizers, replay (with its trees), random generators, counters, scores.
    assert_same(final["state"], reference.checkpoint["state"])
    assert final["rng"].keys() == reference.checkpoint["rng"].keys()
    assert_same(final["rng"], reference.checkpoint["rng"], "rng")
    # The resumed run appends to the interrupted run's TensorBoard log: together they log what the reference logged.
    assert logged_scalars(tmp_path) == reference.scalars
    if module in VECTOR.values() and "atari" not in name:  # CartPole games end within these runs
        assert len(scores) > 5


@pytest.mark.parametrize("name", VECTOR)
def test_a_seeded_run_repeats_the_reference_run_exactly(name, reference_run, monkeypatch, tmp_path):
    module, flags, _, _ = EXACT[name]
    reference = reference_run(name)
    monkeypatch.chdir(tmp_path)
    scores = module.main(module.Args(**flags))
    assert scores == reference.scores and len(scores) > 5
    assert_same(read_checkpoint(checkpoint_of(tmp_path))["state"], reference.checkpoint["state"])


# --- a resume without the saved replay ------------------------------------------------------------------------------

# name: (flags over tiny(name), the envs.step call of the stop, whether it updates once per iteration of 4 envs);
# learning has begun at the stop
REFILLED = {
    "dqn_dueling_per": (dict(), 100, True),
    "iqn": (dict(total_timesteps=1000), 100, True),
    "r2d2": (dict(), 150, False),
    "recurrent_iqn": (dict(), 100, False),
}


@pytest.mark.parametrize("name", REFILLED)
def test_a_resume_without_the_replay_refills_it_for_learning_starts_steps_before_learning_again(
    name, monkeypatch, tmp_path, capsys
):
    module = VECTOR[name]
    options, stop_at, once_per_iteration = REFILLED[name]
    flags = tiny(module, **options)
    stop = stop_at * flags["num_envs"]
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, module, stop_at)
        run_until_stopped(module.main, module.Args(**flags))
    path = checkpoint_of(tmp_path)
    before = read_checkpoint(path)
    assert before["state"]["updates"] > 0 and replay_left_out(before["state"])
    capsys.readouterr()
    wait_for_a_later_second_than_the_log()
    scores = module.main(module.Args(resume=str(path), checkpoint_every=10_000, cuda=False))
    out = capsys.readouterr().out
    assert f"through {stop} logged agent steps ({stop_at} steps of {flags['num_envs']} envs)" in out
    learning_resumes_at = stop + flags["learning_starts"]
    assert f"it refills from empty, and learning resumes at step {learning_resumes_at}" in out
    final = read_checkpoint(path)
    assert final["global_step"] == flags["total_timesteps"] and final["state"]["updates"] > before["state"]["updates"]
    assert scores == final["state"]["stats"]["scores"] and len(scores) > 0
    # No loss was logged between the stop and the step learning resumes at, and some after it.
    losses = [step for tag, values in logged_scalars(tmp_path).items() if tag.startswith("losses/") for step, _ in values]
    assert not [step for step in losses if stop < step < learning_resumes_at]
    assert [step for step in losses if step >= learning_resumes_at]
    if once_per_iteration:  # then one update per iteration from the step learning resumes at to the end
        updates = final["state"]["updates"] - before["state"]["updates"]
        assert updates == (flags["total_timesteps"] - learning_resumes_at) // flags["num_envs"]


# --- refused checkpoints and flags ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def early_run(tmp_path_factory):
    """`early_run(name)`: the runs/ folder of a vector script's tiny run stopped by a signal after a few steps, made
    once per module; tests copy it (`copy_run`) and never change it."""
    done = {}

    def run(name: str) -> Path:
        if name not in done:
            module = VECTOR[name]
            folder = tmp_path_factory.mktemp(f"early_{name}")
            with pytest.MonkeyPatch.context() as patch:
                patch.chdir(folder)
                interrupt_at_step(patch, module, 10)
                run_until_stopped(module.main, module.Args(**tiny(module)))
            done[name] = folder / "runs"
        return done[name]

    return run


def copy_run(runs: Path, to: Path) -> Path:
    """Copies a runs/ folder into `to`; returns the copy's checkpoint, inside its own run folder."""
    shutil.copytree(runs, to / "runs")
    return checkpoint_of(to)


def rewrite(path: Path, change) -> None:
    """Rewrites the checkpoint at `path` with `change(checkpoint)` applied and a checksum that fits the new contents, as
    a file of another format or a run whose weights went bad would be written."""
    checkpoint = read_checkpoint(path)
    change(checkpoint)
    checkpoint["digest"] = content_digest({key: value for key, value in checkpoint.items() if key != "digest"})
    torch.save(to_safe(checkpoint), path)


def set_first_weight_to_nan(checkpoint: dict) -> None:
    weights = checkpoint["state"]["q_network"]
    first = next(iter(weights))
    weights[first] = weights[first].clone()
    weights[first].view(-1)[0] = float("nan")


DAMAGES = {  # how a file at --resume is made, and what the one line says about it
    "missing": (lambda path, good: None, "no such file"),
    "a folder": (lambda path, good: path.mkdir(), "not a file"),
    "truncated": (lambda path, good: path.write_bytes(good.read_bytes()[: good.stat().st_size // 2]), "not a readable"),
    "garbage": (lambda path, good: path.write_bytes(np.random.default_rng(0).bytes(5000)), "not a readable checkpoint"),
    "another file of torch.save": (lambda path, good: torch.save({"weights": torch.zeros(3)}, path), "not a readable"),
    "a byte flipped": (
        lambda path, good: path.write_bytes(flip_a_weight_byte(good)),
        r"not a readable checkpoint \(ValueError: its contents do not match their checksum",
    ),
    "an older format": (
        lambda path, good: (shutil.copy(good, path), rewrite(path, lambda c: c.update(format=c["format"] - 1))),
        r"not a readable checkpoint \(ValueError: format (\d+), expected (?!\1)",
    ),
    "NaN weights": (
        lambda path, good: (shutil.copy(good, path), rewrite(path, set_first_weight_to_nan)),
        "its networks or optimizers hold NaN or inf",
    ),
}


def flip_a_weight_byte(path: Path) -> bytes:
    """The bytes of the checkpoint at `path` with one byte changed inside the stored values of a network weight (a disk
    error): the file still loads, and only its checksum tells."""
    weights = read_checkpoint(path)["state"]["q_network"]
    stored = max(weights.values(), key=torch.numel).numpy().tobytes()
    data = bytearray(path.read_bytes())
    at = data.index(stored[:64]) + 9
    data[at] ^= 0xFF
    return bytes(data)


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("name", VECTOR)
def test_a_damaged_missing_older_or_nan_checkpoint_is_refused_in_one_line_before_anything_is_made(
    name, damage, early_run, monkeypatch, tmp_path
):
    module, (make, says) = VECTOR[name], DAMAGES[damage]
    good = checkpoint_of(early_run(name).parent)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "checkpoint.pt"
    make(path, good)
    present = sorted(os.listdir(tmp_path))
    with pytest.raises(SystemExit) as refused:
        module.main(module.Args(resume=str(path)))
    message = str(refused.value)
    assert message.startswith(f"error: --resume={path}: ") and "\n" not in message
    assert re.search(says, message), message
    assert sorted(os.listdir(tmp_path)) == present  # no run folder, no log


@pytest.mark.parametrize("name", VECTOR)
def test_another_scripts_checkpoint_is_refused_by_the_scripts_names(name, early_run, monkeypatch, tmp_path):
    names = list(VECTOR)
    other = names[(names.index(name) + 1) % len(names)]
    path = copy_run(early_run(other), tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=rf"^error: --resume={path}: .*written by {other}\.py, not {name}\.py\)$"):
        VECTOR[name].main(VECTOR[name].Args(resume=str(path)))


# A flag each script may not change on resume (what its saved state or replay was built for), and a new value
FIXED_FLAGS = {
    "pqn": ("gamma", 0.5),
    "dqn_dueling_per": ("gamma", 0.5),
    "iqn": ("buffer_size", 123),
    "r2d2": ("buffer_size", 123),
    "recurrent_iqn": ("seq_len", 5),
}


@pytest.mark.parametrize("name", VECTOR)
def test_a_flag_that_cannot_change_is_refused_on_resume_and_the_checkpoint_is_left_as_it_was(
    name, early_run, monkeypatch, tmp_path
):
    module, (flag, value) = VECTOR[name], FIXED_FLAGS[name]
    path = copy_run(early_run(name), tmp_path)
    saved, written = read_checkpoint(path)["args"][flag], path.read_bytes()
    monkeypatch.chdir(tmp_path)
    cli_flag = "--" + flag.replace("_", "-")
    with pytest.raises(
        SystemExit, match=rf"^error: {cli_flag}={value}: cannot change on resume \(the checkpoint has {saved}\)"
    ):
        module.main(module.Args(resume=str(path), **{flag: value}))
    assert path.read_bytes() == written
    # The same value, as a launcher repeating the whole command gives it, is no change: the run resumes (and is stopped
    # by a signal at the first step of its fast-forward, which exits at once and leaves the checkpoint as it was).
    interrupt_at_step(monkeypatch, module, 1)
    run_until_stopped(module.main, module.Args(resume=str(path), cuda=False, **{flag: saved}))
    assert path.read_bytes() == written


@pytest.mark.parametrize("name", VECTOR)
def test_a_negative_checkpoint_every_is_refused_before_anything_is_made(name, monkeypatch, tmp_path):
    module = VECTOR[name]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"^error: --checkpoint-every=-1: "):
        module.main(module.Args(checkpoint_every=-1))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", VECTOR)
def test_a_resume_whose_logged_actions_lead_elsewhere_is_refused(name, early_run, monkeypatch, tmp_path):
    """The fast-forward checks that the replayed actions reach the stored observations: a checkpoint whose action log
    holds another past stops the run instead of resuming games that are not the run's."""
    module = VECTOR[name]
    path = copy_run(early_run(name), tmp_path)
    rewrite(path, lambda c: c["state"]["action_log"].__setitem__(5, 1 - c["state"]["action_log"][5]))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="fast-forward through the logged actions diverged"):
        module.main(module.Args(resume=str(path), cuda=False))


# --- a non-finite loss ----------------------------------------------------------------------------------------------


def nan_on_third_call(function):
    """`function`, whose third call returns its result (the first tensor of a tuple) times NaN."""
    calls = []

    def poisoned(*args, **kwargs):
        calls.append(1)
        out = function(*args, **kwargs)
        if len(calls) != 3:
            return out
        return (out[0] * float("nan"), *out[1:]) if isinstance(out, tuple) else out * float("nan")

    return poisoned


# name: (the function poisoned, the checkpoint_every of the run with checkpoints, the step of the NaN stop without and
# with checkpoints where the flags fix it). The scripts keep the NaN on the device and read it at logging intervals and
# before a checkpoint: PQN's third rollout ends at step 192 and it logs every 10 rollouts of 64 steps (step 704); its
# checkpoint at step 192 holds the NaN and is refused. The replay scripts' third update is at step 212 (every 4 steps
# from step 200 on): they log every 100 updates (step 600) and read the flag before the checkpoint of step 300. The
# sequence-replay scripts' steps follow their replay ratio and are not fixed here; r2d2, like PQN, checkpoints before it
# reads the flag, and its checkpoint of the NaN is refused.
POISONED = {
    "pqn": ("q_lambda_returns", 64, (704, 192)),
    "dqn_dueling_per": ("weighted_huber_loss", 100, (600, 300)),
    "iqn": ("quantile_huber_loss", 100, (600, 300)),
    "r2d2": ("sequence_td_errors", 100, (None, None)),
    "recurrent_iqn": ("quantile_huber_loss", 100, (None, None)),
}
STOP_MESSAGE = (
    r"error: non-finite (?:loss or Q-values by step (?P<read>\d+)|values in the state at step (?P<saved>\d+); no "
    r"checkpoint written); last good checkpoint: (?P<last_good>.*?)(\s.*)?"
)


@pytest.mark.parametrize("checkpoints", [False, True], ids=["no checkpoints", "periodic checkpoints"])
@pytest.mark.parametrize("name", POISONED)
def test_a_non_finite_loss_stops_the_run_naming_its_step_and_the_last_good_checkpoint(
    name, checkpoints, monkeypatch, tmp_path
):
    module, (function, every, stops) = VECTOR[name], POISONED[name]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(module, function, nan_on_third_call(getattr(module, function)))
    if hasattr(module, "seconds_per_update"):  # the start-up timing's updates are not the run's
        monkeypatch.setattr(module, "seconds_per_update", lambda *a: 0.001)
    handler = signal.getsignal(signal.SIGINT)
    flags = tiny(module, total_timesteps=400 if name == "recurrent_iqn" else tiny(module)["total_timesteps"])
    with pytest.raises(SystemExit) as stop:
        module.main(module.Args(**flags, checkpoint_every=every if checkpoints else 0))
    message = str(stop.value)
    match = re.fullmatch(STOP_MESSAGE, message)
    # Without checkpoints only the device flag can stop the run; with them, a checkpoint of the NaN is refused too.
    assert match and (checkpoints or match["read"]), message
    step, last_good = int(match["read"] or match["saved"]), match["last_good"]
    assert stops[checkpoints] is None or step == stops[checkpoints]
    assert signal.getsignal(signal.SIGINT) == handler
    written = sorted(tmp_path.glob("runs/*/checkpoint.pt"))
    if not checkpoints:
        assert last_good == "none" and not written
        return
    # The broken network is never written: the checkpoint named is the last one before the NaN, and it is finite.
    assert [str(path.relative_to(tmp_path)) for path in written] == [last_good]
    checkpoint = read_checkpoint(written[0])
    assert checkpoint["global_step"] == (step - 1) // every * every
    assert all(torch.isfinite(weight).all() for weight in checkpoint["state"]["q_network"].values())


# --- tracked runs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pqn", "dqn_dueling_per", "iqn", "r2d2"])  # W&B's start-up takes seconds a run
def test_a_tracked_run_resumed_continues_the_same_wandb_run(name, offline_wandb, monkeypatch):
    import wandb

    module = VECTOR[name]
    init, ids = wandb.init, []

    def recording_init(*args, **kwargs):
        run = init(*args, **kwargs)
        ids.append((kwargs.get("id"), run.id))
        return run

    monkeypatch.setattr(wandb, "init", recording_init)
    flags = tiny(module, total_timesteps=256, update_epochs=1) if name == "pqn" else tiny(module, total_timesteps=400)
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, module, 5 if name == "pqn" else 20)
        run_until_stopped(module.main, module.Args(**flags, track=True))
    path = checkpoint_of(offline_wandb.parent)
    saved_id = read_checkpoint(path)["wandb_id"]
    module.main(module.Args(resume=str(path), track=True, checkpoint_every=10_000, cuda=False))
    final = read_checkpoint(path)
    assert final["global_step"] == flags["total_timesteps"] and final["wandb_id"] == saved_id
    assert ids == [(None, saved_id), (saved_id, saved_id)]  # started once, then resumed by its id
    assert len(list(offline_wandb.glob(f"offline-run-*-{saved_id}"))) == 2


# --- Atari runs resumed without their replay ------------------------------------------------------------------------

ATARI_WITHOUT_REPLAY = {  # (module, flags, the envs.step call of the stop, its step)
    "dqn_dueling_per-atari": (dqn_dueling_per, tiny("dqn_dueling_per", atari=True), 20, 40),
    "iqn_atari": (iqn_atari, tiny("iqn_atari"), 90, 180),  # after learning started
}


@pytest.mark.parametrize("name", ATARI_WITHOUT_REPLAY)
def test_an_atari_run_resumed_without_its_replay_replays_the_logged_steps_and_finishes(name, monkeypatch, tmp_path, capsys):
    module, flags, stop_at, step = ATARI_WITHOUT_REPLAY[name]
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, module, stop_at)
        run_until_stopped(module.main, module.Args(**flags))
    path = checkpoint_of(tmp_path)
    checkpoint = read_checkpoint(path)
    assert checkpoint["global_step"] == step and replay_left_out(checkpoint["state"])
    assert checkpoint["state"]["obs"].shape == (2, 4, 84, 84) and checkpoint["state"]["obs"].dtype == np.uint8
    capsys.readouterr()
    # The resume steps the logged actions of real Atari envs and checks that it reaches the stored frames.
    module.main(module.Args(resume=str(path), checkpoint_every=10_000, cuda=False))
    assert f"through {step} logged agent steps ({stop_at} steps of 2 envs)" in capsys.readouterr().out
    assert read_checkpoint(path)["global_step"] == flags["total_timesteps"]


def test_dqn_dueling_per_atari_checkpoint_stores_each_frame_once(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, dqn_dueling_per, 20)
        run_until_stopped(
            dqn_dueling_per.main, dqn_dueling_per.Args(**tiny("dqn_dueling_per", atari=True), checkpoint_replay=True)
        )
    rb = read_checkpoint(checkpoint_of(tmp_path))["state"]["rb"]
    # the first stack's 4 frames, then one a step: no stacked observations
    assert rb["frames"].shape == (2, 24, 84, 84) and rb["frames"].dtype == torch.uint8
    assert rb["num_added"] == 24 and "obs" not in rb


# --- a launcher that repeats the command ----------------------------------------------------------------------------


def test_a_launcher_repeating_the_command_resumes_a_pqn_run_whose_total_was_rounded_up(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    flags = tiny("pqn", total_timesteps=2000, checkpoint_every=1024)  # 31.25 rollouts of 64 agent steps: 32 are run
    command = ["pqn.py", "--total-timesteps", "2000", "--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2"]
    command += ["--update-epochs", "2", "--checkpoint-every", "1024"]
    interrupt_at_step(monkeypatch, pqn, k=40)
    monkeypatch.setattr("sys.argv", command)
    run_until_stopped(pqn.main, pqn.Args(**flags))
    assert "--total-timesteps=2000 rounded up to 2048" in capsys.readouterr().out
    path = str(checkpoint_of(tmp_path))
    assert read_checkpoint(path)["args"]["total_timesteps"] == 2048
    monkeypatch.setattr("sys.argv", [*command, "--resume", path])
    pqn.main(pqn.Args(**flags, resume=path))  # the same command and --resume, as launch.py retries a run
    assert read_checkpoint(path)["global_step"] == 2048
    monkeypatch.setattr("sys.argv", [*command[:1], "--total-timesteps", "4096", "--resume", path])
    with pytest.raises(
        SystemExit, match=r"^error: --total-timesteps=4096: cannot change on resume \(the checkpoint has 2048\)"
    ):
        pqn.main(pqn.Args(**dict(flags, total_timesteps=4096), resume=path))


# --- --resume-fresh-envs ------------------------------------------------------------------------------------------
# A resume that starts new games instead of stepping the logged actions again: the resumed run steps no logged action,
# keeps the replay written before the cut, and nothing a script keeps across steps (a rollout, an n-step window, a
# training sequence, a frame stack, a recurrent state) joins a dropped game to a new one.


def interrupt_then_resume_fresh(module, monkeypatch, capsys, flags: dict, k: int, full: bool = False) -> tuple[dict, dict]:
    """Runs `module` with `flags` up to a SIGINT at its k-th envs.step, then resumes it with fresh envs to the end.
    Returns the saved state of the interrupted run and that of the finished one (with `full`, both whole checkpoints).
    """
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, module, k)
        run_until_stopped(module.main, module.Args(**{**flags, "cuda": False}))
    path = checkpoint_of()
    before, make_env, steps = read_checkpoint(path), module.make_env, []

    class Counting:  # counts the steps the resumed run's envs really take
        def __init__(self, envs):
            self.envs = envs

        def __getattr__(self, name):
            return getattr(self.envs, name)

        def step(self, actions):
            steps.append(1)
            return self.envs.step(actions)

    monkeypatch.setattr(module, "make_env", lambda *a, **kw: Counting(make_env(*a, **kw)))
    capsys.readouterr()
    module.main(module.Args(resume=str(path), resume_fresh_envs=True, checkpoint_every=10**6, cuda=False))
    after, out = read_checkpoint(path), capsys.readouterr().out
    assert after["global_step"] == flags["total_timesteps"]
    assert after["args"]["resume_fresh_envs"] and after["envs_start"] == before["global_step"]  # where the new games began
    assert "resume: fresh environments" in out and "fast-forwarding" not in out
    # No logged action was stepped again: the envs took the resumed run's steps, less the first (an emulated reset).
    assert len(steps) == (flags["total_timesteps"] - before["global_step"]) // flags["num_envs"] - 1
    return (before, after) if full else (before["state"], after["state"])


@pytest.mark.parametrize(
    "module, flags, k",
    [
        (pqn, tiny("pqn", total_timesteps=1024), 100),  # cut after 7 of 16 iterations
        (pqn_atari_envpool, tiny("pqn_atari_envpool", total_timesteps=128, num_steps=16), 5),  # cut after 1 of 2 iterations
        (pqn_atari_envpool_lstm, tiny("pqn_atari_envpool_lstm", total_timesteps=128, num_steps=16), 5),
    ],
    ids=["mlp", "cnn", "lstm"],
)
def test_pqn_fresh_resume_starts_with_a_reset_step(module, flags, k, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    train, rollouts = module.train_on_rollout, []

    def recording(q_network, optimizer, rollout, *rest):  # copies: the tensors share the script's rollout storage
        rollouts.append([x.clone() if torch.is_tensor(x) else x for x in rollout])
        return train(q_network, optimizer, rollout, *rest)

    monkeypatch.setattr(module, "train_on_rollout", recording)
    before, _ = interrupt_then_resume_fresh(module, monkeypatch, capsys, flags, k)
    # The first rollout after the cut (the interrupted run's rollouts come first) starts from the dropped game's last
    # observation with a reset step: out of the loss, and its Q(lambda) return reads nothing of the new game.
    first = rollouts[before["iteration"]]
    num_envs = flags["num_envs"]
    if module is pqn_atari_envpool_lstm:
        obs, _, is_first, _, valid, _ = first
        assert is_first[1].all()  # the recurrent state is zeroed at the new games' first observations
    else:
        obs, _, _, valid = (x.reshape(flags["num_steps"], num_envs, *x.shape[1:]) for x in first)
    assert torch.equal(obs[0].cpu(), torch.as_tensor(before["next_obs"]).to(obs.dtype))
    assert (valid[0] == 0).all() and (valid[1:] == 1).any()


def test_dqn_dueling_per_fresh_resume_drops_the_pending_n_step_transitions(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    flags = tiny("dqn_dueling_per", total_timesteps=1000, checkpoint_replay=True)
    pushes = []  # (obs entered, obs of the transitions that left) of every NStepWindow.push, both runs

    class Recording(dqn_dueling_per.NStepWindow):
        def push(self, obs, *rest):
            transitions = super().push(obs, *rest)
            pushes.append((obs.copy(), transitions[0]))
            return transitions

    monkeypatch.setattr(dqn_dueling_per, "NStepWindow", Recording)
    before, after = interrupt_then_resume_fresh(dqn_dueling_per, monkeypatch, capsys, flags, 120)  # cut at step 480
    # The replay written before the cut stays as it was (1000 slots: nothing is overwritten).
    size = before["rb"]["size"]
    for name in dqn_dueling_per.PrioritizedReplayBuffer.ARRAYS:
        assert torch.equal(after["rb"][name][:size], before["rb"][name][:size]), name
    # The dropped games' pending transitions left with them: n = 3 pushes pass (the emulated reset step enters nothing,
    # then the new games fill the window) before the first transitions leave, and those start from the new games' first
    # observations. A pending one would leave earlier, with a return summing rewards of both games.
    cut = before["iteration"]
    assert all(len(left) == 0 for _, left in pushes[cut : cut + 3])
    assert np.array_equal(pushes[cut + 3][1], pushes[cut + 1][0])


def test_iqn_fresh_resume_ends_n_step_samples_at_the_cut(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    flags = tiny("iqn", exploration_fraction=iqn.Args.exploration_fraction, checkpoint_replay=True)
    before, after = interrupt_then_resume_fresh(iqn, monkeypatch, capsys, flags, 240)  # cut at step 960
    cut, rb = before["iteration"], after["rb"]
    for name in iqn.ReplayBuffer.ARRAYS:  # rings of 500 slots: nothing before the cut is overwritten
        assert torch.equal(rb[name][:, :cut], before["rb"][name][:, :cut]), name
    # The slot of each env's last observation before the cut is that of an episode's last observation: an n-step
    # sample stops there and bootstraps from it (a time-out), never reading the new game's rewards.
    assert torch.equal(rb["obs"][:, cut], torch.as_tensor(before["obs"])) and not rb["valid"][:, cut].any()
    assert rb["valid"][:, cut + 1 :].any()


def test_iqn_atari_fresh_resume_starts_new_frame_stacks(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    flags = tiny("iqn_atari", checkpoint_replay=True)
    before, after = interrupt_then_resume_fresh(iqn_atari, monkeypatch, capsys, flags, 85)  # cut at step 170
    cut = before["iteration"]
    for name in iqn_atari.ReplayBuffer.ARRAYS:  # rings of 200 slots: nothing before the cut is overwritten
        assert torch.equal(after["rb"][name][:, :cut], before["rb"][name][:, :cut]), name
    rb = iqn_atari.ReplayBuffer(400, 2, (84, 84), 4, "cpu", np.random.default_rng(0))
    rb.load_state_dict(after["rb"])
    assert np.array_equal(rb.frames[:, cut], before["obs"][:, -1]) and not rb.valid[:, cut].any()
    # The first stack after the cut holds the new game's first frame four times, as envpool's reset gives it: no frame
    # of the dropped game.
    first_stack = rb.stacks(np.arange(2), np.full(2, cut + 1))
    assert rb.game_start[:, cut + 1].all() and (first_stack == rb.frames[:, cut + 1, None]).all()


def test_an_exact_resume_after_a_fresh_one_replays_only_the_steps_since_the_cut(monkeypatch, capsys, tmp_path):
    """Interrupted, resumed fresh, interrupted again, resumed exactly: the same weights as the run resumed fresh once
    and left to finish. The exact resume steps the actions since the fresh start only (from its reset step)."""
    flags = tiny("pqn", total_timesteps=1024, update_epochs=1)
    weights = []
    for second_stop in (None, 30):
        run_dir = tmp_path / ("twice" if second_stop else "once")
        run_dir.mkdir()
        monkeypatch.chdir(run_dir)
        with monkeypatch.context() as patch:
            interrupt_at_step(patch, pqn, 40)  # in the 3rd of 16 iterations
            run_until_stopped(pqn.main, pqn.Args(**flags, cuda=False))
        path = checkpoint_of()
        fresh = pqn.Args(resume=str(path), resume_fresh_envs=True, checkpoint_every=10**6, cuda=False)
        with monkeypatch.context() as patch:
            if second_stop:
                interrupt_at_step(patch, pqn, second_stop)  # within the fresh run, after 4 more iterations
                run_until_stopped(pqn.main, fresh)
            else:
                pqn.main(fresh)
        if second_stop:
            cut, stop = read_checkpoint(path)["envs_start"], read_checkpoint(path)["global_step"]
            assert 0 < cut < stop < 1024
            capsys.readouterr()
            pqn.main(pqn.Args(resume=str(path), cuda=False))
            assert f"through {stop - cut} logged agent steps" in capsys.readouterr().out
        assert read_checkpoint(path)["global_step"] == 1024
        weights.append(read_checkpoint(path)["state"]["q_network"])
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])


# flags (checkpoint_replay, a ring that does not wrap), the envs.step call of the interruption (learning has begun)
R2D2_RUNS = {
    "r2d2": (r2d2, tiny("r2d2", total_timesteps=1200), 135),  # at the cut, envs 1 and 3 are at a game's first step
    "r2d2_atari": (r2d2_atari, tiny("r2d2_atari"), 82),  # the cut falls inside a window's trained steps
}


@pytest.mark.parametrize("name", R2D2_RUNS)
def test_r2d2_fresh_resume_trains_no_sequence_across_the_cut(name, tmp_path, monkeypatch, capsys):
    module, flags, k = R2D2_RUNS[name]
    flags = dict(flags, checkpoint_replay=True, checkpoint_every=10**6)
    monkeypatch.chdir(tmp_path)
    cut, final = interrupt_then_resume_fresh(module, monkeypatch, capsys, flags, k, full=True)
    assert cut["state"]["rb"]["pos"] == k and cut["state"]["updates"] > 0
    if module is r2d2:  # both cases at the cut: a game's first observation, and a game in progress
        assert cut["state"]["is_first"].any() and not cut["state"]["is_first"].all()
    before, after = cut["state"]["rb"], final["state"]["rb"]
    for key in ("obs", "actions", "rewards", "terminated", "truncated"):
        assert torch.equal(before[key][:, : k - 1], after[key][:, : k - 1]), key  # the replay before the cut is kept
        if key != "truncated":
            assert torch.equal(before[key][:, k - 1], after[key][:, k - 1]), key
    assert after["truncated"][:, k - 1].all()  # the last stored step ends like a time-out

    args = module.Args(**flags)
    rb = module.SequenceReplay(args, before["obs"].shape[2:], before["obs"].numpy().dtype)
    rb.load_state_dict(final["state"]["rb"])
    ids = np.flatnonzero(rb.tree.leaves(np.arange(rb.num_windows)) > 0)  # every complete window
    first_valid = rb.window_start[ids] + np.maximum(rb.window_lo[ids], -rb.history)
    last_valid = rb.window_start[ids] + rb.window_hi[ids] - 1
    assert not ((first_valid <= k) & (last_valid > k)).any()  # no window holds steps of both sides
    ending, starting = ids[last_valid == k], ids[first_valid == k + 1]
    assert len(np.unique(rb.window_env[ending])) == (~cut["state"]["is_first"]).sum()  # each game in progress ends there
    assert len(np.unique(rb.window_env[starting])) == args.num_envs  # and every env starts a new episode after it

    slot = rb.window_start[ending][None] + np.arange(rb.window)[:, None]  # the stream step of each position
    batch = rb.gather(ending, "cpu")
    assert (batch["done"] & ~batch["terminated"])[torch.as_tensor(slot == k - 1)].all()  # targets stop and bootstrap
    weights = final["state"]["q_network"]
    network = module.QNetwork((2,) if module is r2d2 else args.frame_stack, len(weights["advantage.2.bias"]), args.lstm_size)
    network.load_state_dict(weights)
    _, mask, _ = module.sequence_td_errors(network, network, batch, args.burn_in, args.seq_len, args.n_step, args.gamma)
    trained_slot = slot[args.burn_in : args.burn_in + args.seq_len]
    assert (trained_slot == k).any() and not mask[torch.as_tensor(trained_slot == k)].any()  # the reset step: no loss

    batch = rb.gather(starting, "cpu")
    position = torch.as_tensor(rb.window_lo[starting])  # the first post-cut step of each window
    columns = torch.arange(len(starting))
    assert batch["is_first"][position, columns].all()
    assert (batch["last_action"][position, columns] == -1).all() and (batch["last_reward"][position, columns] == 0).all()
    assert not rb.window_h[starting].any() and not rb.window_c[starting].any()  # the windows start from the zero state
    if module is r2d2_atari:  # its frame stack holds no frame of the dropped game
        assert not batch["obs"][position, columns, :-1].any() and batch["obs"][position, columns, -1].any()


# flags over tiny(module) (a ring that does not wrap), the envs.step call of the interruption (learning has begun)
RIQN_RUNS = {
    "recurrent_iqn": (recurrent_iqn, dict(total_timesteps=1200, buffer_size=1200), 150),
    "recurrent_iqn_atari": (recurrent_iqn_atari, dict(env_id="Breakout-v5", buffer_size=480), 45),
}


@pytest.mark.parametrize("name", RIQN_RUNS)
def test_recurrent_iqn_fresh_resume_trains_no_sequence_across_the_cut(name, tmp_path, monkeypatch, capsys):
    module, options, k = RIQN_RUNS[name]
    flags = tiny(module, checkpoint_replay=True, checkpoint_every=10**6, **options)
    monkeypatch.chdir(tmp_path)
    cut, final = interrupt_then_resume_fresh(module, monkeypatch, capsys, flags, k, full=True)
    assert cut["state"]["rb"]["pos"] == k and cut["state"]["updates"] > 0
    assert cut["state"]["agent"]["game_steps"].any()  # games in progress at the cut
    before, after = cut["state"]["rb"], final["state"]["rb"]
    for key in module.SequenceReplay.ARRAYS:  # the replay before the cut is kept
        assert torch.equal(before[key][:, : k - 1], after[key][:, : k - 1]), key
        if key != "truncated":
            assert torch.equal(before[key][:, k - 1], after[key][:, k - 1]), key
    assert after["truncated"][:, k - 1].all()  # the last stored step ends like a time-out
    assert after["is_reset_step"][:, k].all()  # the step at the cut is a reset step: never trained
    new = {key: after[key][:, k + 1] for key in ("is_first", "last_action", "last_reward", "timestep")}
    assert new["is_first"].all() and (new["last_action"] == -1).all()  # the LSTM state restarts; no previous action,
    assert not new["last_reward"].any() and not new["timestep"].any()  # no previous reward, a new game's timestep

    n = flags.get("n_step", module.Args.n_step)
    ends = [after[key][:, k - n : k + n].T for key in ("reward", "terminated", "truncated")]  # (2n, envs)
    bootstrap = module.n_step_targets(*ends, 0.9, n)[2]  # rows 0 .. n - 1: the slots k - n .. k - 1
    assert (bootstrap <= n).all()  # they bootstrap from o_k at the latest
