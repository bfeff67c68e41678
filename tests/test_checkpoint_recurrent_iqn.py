"""Checkpoints of recurrent_iqn.py and recurrent_iqn_atari.py: a signal stops a run with a checkpoint, a resumed
run is bitwise the uninterrupted one, unreadable checkpoints, NaNs and oversized buffers stop with a clear
message, and seeded runs repeat exactly."""

import glob
import os
import signal

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cleanrl import recurrent_iqn, recurrent_iqn_atari
from cleanrl_q_utils.checkpoint_files import read_checkpoint

from helpers import checkpoint_of
from interrupts import interrupt_at_step, run_until_stopped
from tiny import tiny


def vector_args(**kw):
    return recurrent_iqn.Args(**tiny("recurrent_iqn", **kw))


def test_sigint_writes_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    interrupt_at_step(monkeypatch, recurrent_iqn, 50)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    run_until_stopped(recurrent_iqn.main, vector_args(save_model=True))
    path = str(checkpoint_of())
    checkpoint = read_checkpoint(path)
    assert checkpoint["global_step"] == 50 * 4 and checkpoint["state"]["rb"] is None
    assert not glob.glob("runs/*/*.cleanrl_model")  # an interrupted run neither saves nor evaluates the model
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


def scalars(run_dir):
    """Every TensorBoard scalar of a run directory but the wall-clock SPS: tag -> [(step, value)]."""
    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = [tag for tag in accumulator.Tags()["scalars"] if tag != "charts/SPS"]
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)] for tag in tags}


# (module, its flags over tiny(module), the envs.step call the signal arrives at): every run learns before and after
# the interruption
RESUMED_RUNS = {
    "uniform": (recurrent_iqn, dict(total_timesteps=1200, checkpoint_every=500), 150),
    "prioritized": (recurrent_iqn, dict(total_timesteps=1200, checkpoint_every=500, prioritized_replay=True), 150),
    "atari": (
        recurrent_iqn_atari,
        dict(env_id="Breakout-v5", checkpoint_every=400),
        45,
    ),
}


@pytest.mark.parametrize("name", RESUMED_RUNS)
def test_resumed_run_is_bitwise_the_uninterrupted_run(name, tmp_path, monkeypatch):
    module, options, interrupt_at = RESUMED_RUNS[name]
    flags = tiny(module, checkpoint_replay=True, **options)
    for run in "ab":  # separate run directories: two runs can start within the same second
        (tmp_path / run).mkdir()
    monkeypatch.chdir(tmp_path / "a")
    returns_a = module.main(module.Args(**flags))
    path_a = str(checkpoint_of(tmp_path / "a"))

    monkeypatch.chdir(tmp_path / "b")
    interrupt_at_step(monkeypatch, module, interrupt_at)  # between two periodic checkpoints
    run_until_stopped(module.main, module.Args(**flags))
    path_b = str(checkpoint_of(tmp_path / "b"))
    interrupted = read_checkpoint(path_b)
    assert interrupted["global_step"] == interrupt_at * 4 and interrupted["state"]["updates"] > 0
    assert interrupted["state"]["rb"]["obs"].dtype == (torch.uint8 if module is recurrent_iqn_atari else torch.float32)
    returns_b = module.main(module.Args(resume=path_b, checkpoint_every=flags["checkpoint_every"]))

    assert read_checkpoint(path_a)["global_step"] == read_checkpoint(path_b)["global_step"] == flags["total_timesteps"]
    a, b = read_checkpoint(path_a)["state"], read_checkpoint(path_b)["state"]
    for key in ["q_network", "target_network"]:
        assert all(torch.equal(a[key][name], b[key][name]) for name in a[key])
    for state_a, state_b in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(state_a[key], state_b[key]) for key in ["exp_avg", "exp_avg_sq"])
    assert a["updates"] == b["updates"] > interrupted["state"]["updates"]
    assert returns_a == returns_b and len(returns_a) > 0
    assert scalars(os.path.dirname(path_a)) == scalars(os.path.dirname(path_b))


def test_resume_without_replay_waits_for_learning_starts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    interrupt_at_step(monkeypatch, recurrent_iqn, 100)
    run_until_stopped(recurrent_iqn.main, vector_args())
    path = str(checkpoint_of())
    assert read_checkpoint(path)["state"]["updates"] > 0
    train_step, filled = recurrent_iqn.train_step, []  # steps per environment in the replay at each update
    monkeypatch.setattr(recurrent_iqn, "train_step", lambda *a: filled.append(a[4].pos) or train_step(*a))
    monkeypatch.setattr(
        recurrent_iqn, "seconds_per_update", lambda *a: 0.001
    )  # the start-up timing's updates are not the run's
    recurrent_iqn.main(vector_args(resume=path))
    assert filled and min(filled) > 160 // 4  # the empty buffer is filled for learning_starts steps again


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_unreadable_checkpoint_is_refused(damage, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    interrupt_at_step(monkeypatch, recurrent_iqn, 10)
    run_until_stopped(recurrent_iqn.main, vector_args(total_timesteps=400))
    path = str(checkpoint_of())
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2] if damage == "truncated" else b"not a checkpoint at all" * 10)
    with pytest.raises(SystemExit, match="--resume=.*not a readable checkpoint"):
        recurrent_iqn.main(vector_args(resume=path))
    with pytest.raises(SystemExit, match="--resume"):
        recurrent_iqn.main(vector_args(resume="no/such/checkpoint.pt"))


def test_non_finite_loss_stops_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    loss, calls = recurrent_iqn.quantile_huber_loss, []

    def nan_on_third_call(*args, **kwargs):
        calls.append(1)
        value = loss(*args, **kwargs)
        return value * float("nan") if len(calls) == 3 else value

    monkeypatch.setattr(recurrent_iqn, "quantile_huber_loss", nan_on_third_call)
    monkeypatch.setattr(
        recurrent_iqn, "seconds_per_update", lambda *a: 0.001
    )  # the start-up timing's updates are not the run's
    handler = signal.getsignal(signal.SIGINT)
    # updates every 40 steps from step 160 on (32 slots x 6 / replay ratio 16 / 4 envs = 3 iterations; first at 168)
    with pytest.raises(SystemExit, match=r"non-finite loss or Q-values by step \d+; last good checkpoint: none"):
        recurrent_iqn.main(vector_args(total_timesteps=400))
    assert not glob.glob("runs/*/checkpoint.pt") and signal.getsignal(signal.SIGINT) == handler


@pytest.mark.parametrize("module", [recurrent_iqn, recurrent_iqn_atari], ids=["vector", "atari"])
def test_oversized_buffer_is_refused_before_envs_are_built(module, monkeypatch):
    monkeypatch.setattr(module, "make_env", lambda *a, **k: pytest.fail("an environment was built"))
    with pytest.raises(SystemExit, match=r"--buffer-size=1000000000000: the replay needs about .* GB .* but"):
        module.main(module.Args(buffer_size=10**12, cuda=False))


def test_replay_memory_estimate_matches_the_allocation():
    args = vector_args(buffer_size=4000, prioritized_replay=True)
    rb = recurrent_iqn.SequenceReplay(args, (2,), np.float32, args.lstm_size, torch.device("cpu"))
    allocated = sum(getattr(rb, key).nbytes for key in rb.ARRAYS) + rb.state.nbytes + rb.priorities.nodes.nbytes
    assert recurrent_iqn.replay_memory_bytes(args, (2,), np.float32) == allocated


def test_seeded_runs_repeat_exactly(tmp_path, monkeypatch):
    for run in "ab":  # separate run directories: two runs can start within the same second
        (tmp_path / run).mkdir()
    monkeypatch.chdir(tmp_path / "a")
    first = recurrent_iqn.main(vector_args(total_timesteps=1000))
    monkeypatch.chdir(tmp_path / "b")
    second = recurrent_iqn.main(vector_args(total_timesteps=1000))
    assert first == second and len(first) > 0
