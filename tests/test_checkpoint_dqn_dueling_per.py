"""Checkpoints, resume, signals, non-finite losses and the memory pre-flight of dqn_dueling_per.py."""

import glob
import os
import signal

import numpy as np
import pytest
import torch

import cleanrl.dqn_dueling_per as script
from cleanrl.dqn_dueling_per import Args, NStepWindow, PrioritizedReplayBuffer, main, replay_memory_bytes
from cleanrl_q_utils.checkpoint_files import content_digest, read_checkpoint, to_safe

from helpers import checkpoint_of
from interrupts import interrupt_at_step, run_until_stopped
from tiny import tiny


def test_sigint_writes_a_checkpoint_and_stops(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    interrupt_at_step(monkeypatch, script, 50)
    handler_before = signal.getsignal(signal.SIGINT)
    run_until_stopped(main, Args(**tiny("dqn_dueling_per"), save_model=True))
    assert signal.getsignal(signal.SIGINT) is handler_before
    checkpoint = read_checkpoint(checkpoint_of())
    state = checkpoint["state"]
    assert checkpoint["global_step"] == 50 * 4 and state["iteration"] == 50
    assert len(state["stats"]["scores"]) > 0  # the games finished before the stop
    assert state["action_log"].shape == (50, 4) and state["action_log"].dtype == np.uint8
    assert state["rb"] is None  # no --checkpoint-replay
    assert not glob.glob("runs/*/*.cleanrl_model")  # an interrupted run is not saved or evaluated
    assert not glob.glob("runs/*/*.tmp")


def test_resume_with_replay_is_bitwise_exact(tmp_path, monkeypatch):
    args = tiny("dqn_dueling_per", checkpoint_replay=True, checkpoint_every=1000)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    scores_a = main(Args(**args))
    final_a = read_checkpoint(checkpoint_of())

    monkeypatch.chdir(tmp_path / "b")
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, script, 240)  # step 960: between two periodic checkpoints
        run_until_stopped(main, Args(**args))
    path = str(checkpoint_of())
    assert read_checkpoint(path)["global_step"] == 960
    scores_b = main(Args(resume=path, checkpoint_every=1000))
    final_b = read_checkpoint(path)

    assert final_b["global_step"] == final_a["global_step"] == 2000
    final_a, final_b = final_a["state"], final_b["state"]
    assert scores_b == scores_a == final_a["stats"]["scores"] == final_b["stats"]["scores"]
    for net in ("q_network", "target_network"):
        for name, weight in final_a[net].items():
            assert torch.equal(weight, final_b[net][name]), (net, name)
    assert final_a["rb"]["size"] == final_b["rb"]["size"]
    np.testing.assert_array_equal(final_a["rb"]["sum_tree"], final_b["rb"]["sum_tree"])


def test_resume_without_replay_refills_the_buffer_and_finishes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, script, 100)
        run_until_stopped(main, Args(**tiny("dqn_dueling_per")))
    path = str(checkpoint_of())
    loss, updates = script.weighted_huber_loss, []
    monkeypatch.setattr(script, "weighted_huber_loss", lambda *a: updates.append(1) or loss(*a))
    monkeypatch.setattr(script, "seconds_per_update", lambda *a: 0.001)  # the start-up timing's updates are not the run's
    with pytest.raises(SystemExit, match=r"^error: --gamma=0.5: cannot change on resume \(the checkpoint has 0.99\)"):
        main(Args(resume=path, checkpoint_every=1000, gamma=0.5))
    scores = main(Args(resume=path, checkpoint_every=1000))
    # Resumed at step 400 with an empty buffer: one update per iteration only after step 400 + 200.
    assert len(updates) == (2000 - 600) // 4
    out = capsys.readouterr().out
    assert "through 400 logged agent steps (100 steps of 4 envs)" in out
    final = read_checkpoint(path)
    assert final["global_step"] == 2000 and final["args"]["gamma"] == 0.99
    assert len(scores) == len(final["state"]["stats"]["scores"]) > 0


@pytest.mark.parametrize("damage", ["truncated", "garbage", "old_format"])
def test_unreadable_checkpoint_is_refused(tmp_path, monkeypatch, damage):
    monkeypatch.chdir(tmp_path)
    interrupt_at_step(monkeypatch, script, 10)
    run_until_stopped(main, Args(**tiny("dqn_dueling_per"), checkpoint_replay=True))
    path = str(checkpoint_of())
    if damage == "old_format":
        torch.save(to_safe(dict(read_checkpoint(path), format=1)), path)
    else:
        data = open(path, "rb").read()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2] if damage == "truncated" else os.urandom(1000))
    with pytest.raises(SystemExit, match="--resume=.*not a readable checkpoint"):
        main(Args(resume=path))


def test_diverged_environment_replay_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    interrupt_at_step(monkeypatch, script, 30)
    run_until_stopped(main, Args(**tiny("dqn_dueling_per")))
    path = str(checkpoint_of())
    checkpoint = read_checkpoint(path)
    checkpoint["state"]["action_log"][5] = 1 - checkpoint["state"]["action_log"][5]  # a different past
    checkpoint["digest"] = content_digest({key: value for key, value in checkpoint.items() if key != "digest"})
    torch.save(to_safe(checkpoint), path)
    with pytest.raises(SystemExit, match="fast-forward through the logged actions diverged"):
        main(Args(resume=path))


def test_bad_checkpoint_flags_stop_with_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="--checkpoint-every"):
        main(Args(checkpoint_every=-1))
    with pytest.raises(SystemExit, match="--resume"):
        main(Args(resume=str(tmp_path / "missing.pt")))


# Read at the next logging (every 100 updates: step 600) or checkpoint (step 300), whichever comes first.
@pytest.mark.parametrize("checkpoint_every, last_good, stop", [(0, "none written", 600), (100, "runs/.*/checkpoint.pt", 300)])
def test_nan_loss_stops_the_run_without_a_broken_checkpoint(tmp_path, monkeypatch, checkpoint_every, last_good, stop):
    monkeypatch.chdir(tmp_path)
    loss = script.weighted_huber_loss
    calls = []

    def nan_on_third_call(*args):
        calls.append(1)
        return loss(*args) * (float("nan") if len(calls) == 3 else 1.0)

    monkeypatch.setattr(script, "weighted_huber_loss", nan_on_third_call)
    monkeypatch.setattr(script, "seconds_per_update", lambda *a: 0.001)  # the start-up timing's updates are not the run's
    # One update per iteration of 4 steps after step 200: the third one is at step 212.
    with pytest.raises(SystemExit, match=f"non-finite loss or Q-values by step {stop}; last good checkpoint: {last_good}"):
        main(Args(**tiny("dqn_dueling_per"), checkpoint_every=checkpoint_every))
    written = glob.glob("runs/*/checkpoint.pt")
    if checkpoint_every:
        assert read_checkpoint(written[0])["global_step"] == 200  # the one before the NaN, not a broken one
    else:
        assert not written


def test_replay_memory_bytes_matches_the_allocated_arrays():
    rb = PrioritizedReplayBuffer(37, (4,), np.float32, alpha=0.6)  # 37: the trees pad to 64 leaves
    window = NStepWindow(3, 2, (4,), np.float32, gamma=0.99)
    arrays = (
        rb.obs,
        rb.next_obs,
        rb.actions,
        rb.returns,
        rb.discounts,
        rb.sum_tree.nodes,
        rb.min_tree.nodes,
        window.obs,
        window.actions,
        window.rewards,
        window.length,
    )
    estimate = replay_memory_bytes(Args(buffer_size=37, n_step=3, num_envs=2), (4,), np.float32)
    assert estimate == sum(a.nbytes for a in arrays)  # Atari's replay: tests/test_dqn_dueling_per_atari.py


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Breakout-v5"])
def test_oversized_buffer_is_refused_before_envs_are_built(monkeypatch, env_id):
    def no_envs(*args, **kwargs):
        raise AssertionError("envs built before the memory check")

    monkeypatch.setattr(script, "make_env", no_envs)
    with pytest.raises(SystemExit, match=r"--buffer-size=1000000000000: the replay needs about .* GB"):
        main(Args(env_id=env_id, buffer_size=10**12))


def test_seeded_runs_are_reproducible(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    first = main(Args(**tiny("dqn_dueling_per")))
    monkeypatch.chdir(tmp_path / "b")
    assert main(Args(**tiny("dqn_dueling_per"))) == first and len(first) > 10


# Breakout with rings of 32 frames for 2 envs, learning from step 16 (the CNN's sizes are fixed); the other flags
# from the Atari configuration.
ATARI_FLAGS = dict(env_id="Breakout-v5", total_timesteps=96, num_envs=2, buffer_size=64, batch_size=4, learning_starts=16,
                   train_frequency=2, target_network_frequency=16, hidden_size=Args.hidden_size)  # fmt: skip


@pytest.mark.parametrize("checkpoint_replay", [True, False])
def test_atari_sigint_checkpoint_and_resume_smoke(tmp_path, monkeypatch, checkpoint_replay):
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, script, 20)
        run_until_stopped(main, Args(**tiny("dqn_dueling_per", **ATARI_FLAGS), checkpoint_replay=checkpoint_replay))
    path = str(checkpoint_of())
    checkpoint = read_checkpoint(path)
    assert checkpoint["global_step"] == 40
    state = checkpoint["state"]
    assert state["obs"].shape == (2, 4, 84, 84) and state["obs"].dtype == np.uint8
    if checkpoint_replay:  # the first stack's 4 frames, then one a step
        assert state["rb"]["frames"].shape == (2, 24, 84, 84) and state["rb"]["frames"].dtype == torch.uint8
        assert state["rb"]["num_added"] == 24 and "obs" not in state["rb"]
    main(Args(resume=path, checkpoint_every=48))
    assert read_checkpoint(path)["global_step"] == 96


def test_atari_resume_with_replay_is_bitwise_exact(tmp_path, monkeypatch):
    """The frame replay's saved state (frames, repeat flags, transitions, trees, counters) brings the run back exactly:
    interrupted at step 40 (rings not yet full) and resumed, it ends with the uninterrupted run's networks and replay."""
    args = tiny("dqn_dueling_per", **ATARI_FLAGS, checkpoint_replay=True, checkpoint_every=96)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    scores_a = main(Args(**args))
    final_a = read_checkpoint(checkpoint_of())["state"]
    monkeypatch.chdir(tmp_path / "b")
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, script, 20)
        run_until_stopped(main, Args(**args))
    path = str(checkpoint_of())
    scores_b = main(Args(resume=path, checkpoint_every=96))
    final_b = read_checkpoint(path)["state"]
    assert scores_b == scores_a and final_a["updates"] == final_b["updates"] > 0
    for net in ("q_network", "target_network"):
        for name, weight in final_a[net].items():
            assert torch.equal(weight, final_b[net][name]), (net, name)
    for name in (*script.FrameReplayBuffer.ARRAYS, "sum_tree", "min_tree"):
        assert np.array_equal(np.asarray(final_a["rb"][name]), np.asarray(final_b["rb"][name])), name
    assert final_a["rb"]["num_added"] == final_b["rb"]["num_added"] == 4 + 96 // 2  # the rings of 32 wrapped


def test_tracked_resume_continues_the_same_wandb_run(offline_wandb, monkeypatch):
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, script, 20)
        run_until_stopped(main, Args(**tiny("dqn_dueling_per", total_timesteps=400), track=True))
    path = str(checkpoint_of())
    saved_id = read_checkpoint(path)["wandb_id"]
    assert saved_id is not None
    main(Args(resume=path, track=True, checkpoint_every=100))
    assert read_checkpoint(path)["wandb_id"] == saved_id and read_checkpoint(path)["global_step"] == 400
