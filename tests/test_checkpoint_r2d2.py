"""Checkpoints, resume, signals, non-finite stops and the memory pre-flight of cleanrl/r2d2.py and r2d2_atari.py."""

import glob
import signal

import numpy as np
import pytest
import torch

from cleanrl import r2d2, r2d2_atari
from cleanrl_q_utils.checkpoint_files import read_checkpoint, to_safe

from helpers import checkpoint_of, run_dir_of
from interrupts import interrupt_at_step, run_until_stopped
from tiny import tiny


def logged_scalars():
    """Every scalar the run in runs/ logged except SPS, as {tag: [(step, value)]}; TensorBoard applies the purge
    of what an interrupted run logged after its checkpoint."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir_of()), size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = [tag for tag in accumulator.Tags()["scalars"] if tag != "charts/SPS"]
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)] for tag in tags}


def test_sigint_leaves_a_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    interrupt_at_step(monkeypatch, r2d2, 100)
    previous = signal.getsignal(signal.SIGINT)
    run_until_stopped(r2d2.main, r2d2.Args(**tiny("r2d2")))
    assert signal.getsignal(signal.SIGINT) is previous  # handlers restored
    checkpoint = read_checkpoint(checkpoint_of())
    assert checkpoint["global_step"] == 100 * 4
    action_log = checkpoint["state"]["action_log"]
    assert action_log.shape == (100, 4) and action_log.dtype == np.uint8
    assert set(checkpoint["state"]["rb"]) == {"t", "episode_start"}  # no arrays without --checkpoint-replay
    assert not glob.glob("runs/*/*.tmp")


def test_resumed_run_is_bitwise_identical(tmp_path, monkeypatch):
    args = tiny("r2d2", checkpoint_replay=True, checkpoint_every=1000)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    scores_a = r2d2.main(r2d2.Args(**args))
    final_a, logged_a = read_checkpoint(checkpoint_of()), logged_scalars()

    monkeypatch.chdir(tmp_path / "b")
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, r2d2, 237)  # step 948: learning has begun, the replay holds open windows
        run_until_stopped(r2d2.main, r2d2.Args(**args))
    interrupted = read_checkpoint(checkpoint_of())
    assert interrupted["global_step"] == 948 and interrupted["state"]["updates"] > 0
    assert len(interrupted["state"]["rb"]["open"])
    scores_b = r2d2.main(r2d2.Args(resume=str(checkpoint_of()), checkpoint_every=1000, cuda=False))
    final_b = read_checkpoint(checkpoint_of())
    assert logged_scalars() == logged_a and len(logged_a["losses/td_loss"]) > 10

    assert final_a["global_step"] == final_b["global_step"] == 2000
    final_a, final_b = final_a["state"], final_b["state"]
    for net in ("q_network", "target_network"):
        for name, weight in final_a[net].items():
            assert torch.equal(weight, final_b[net][name]), (net, name)
    assert final_a["updates"] == final_b["updates"]
    assert scores_a == scores_b and len(scores_a) > 10
    assert np.array_equal(final_a["rb"]["tree"], final_b["rb"]["tree"])


def test_resume_without_replay_collects_before_learning(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, r2d2, 150)
        run_until_stopped(r2d2.main, r2d2.Args(**tiny("r2d2")))
    updates_at_stop = read_checkpoint(checkpoint_of())["state"]["updates"]
    with pytest.raises(SystemExit, match=r"^error: --buffer-size=123: cannot change on resume"):
        r2d2.main(r2d2.Args(resume=str(checkpoint_of()), checkpoint_every=1000, cuda=False, buffer_size=123))
    scores = r2d2.main(r2d2.Args(resume=str(checkpoint_of()), checkpoint_every=1000, cuda=False))
    out = capsys.readouterr().out
    assert "through 600 logged agent steps (150 steps of 4 envs)" in out
    final = read_checkpoint(checkpoint_of())
    assert final["global_step"] == 2000 and final["state"]["learn_from"] == 600 + 300
    assert final["state"]["updates"] > updates_at_stop and all(np.isfinite(scores))


def test_unreadable_checkpoints_stop_with_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, r2d2, 20)
        run_until_stopped(r2d2.main, r2d2.Args(**tiny("r2d2")))
    data = open(checkpoint_of(), "rb").read()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all" * 100)
    state = read_checkpoint(checkpoint_of())
    torch.save(to_safe(dict(state, format=1)), tmp_path / "old_format.pt")
    # format 3: a replay whose new sequences entered at the max priority, with no acting Q-values to resume from
    torch.save(to_safe(dict(state, format=r2d2.CHECKPOINT_FORMAT - 1)), tmp_path / "previous_format.pt")
    torch.save(to_safe(dict(state, args=dict(state["args"], frame_stack=4))), tmp_path / "other_script.pt")
    for path in ("truncated.pt", "garbage.pt", "missing.pt", "old_format.pt", "previous_format.pt", "other_script.pt"):
        with pytest.raises(SystemExit, match="--resume"):
            r2d2.main(r2d2.Args(resume=path))
    with pytest.raises(SystemExit, match="--checkpoint-every"):
        r2d2.main(r2d2.Args(checkpoint_every=-1))


def test_non_finite_loss_stops_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    td_errors, calls = r2d2.sequence_td_errors, []

    def nan_on_third_call(*args, **kwargs):
        calls.append(1)
        td, mask, q_taken = td_errors(*args, **kwargs)
        return (td * float("nan") if len(calls) == 3 else td), mask, q_taken

    monkeypatch.setattr(r2d2, "sequence_td_errors", nan_on_third_call)
    monkeypatch.setattr(r2d2, "seconds_per_update", lambda *a: 0.001)  # the start-up timing's updates are not the run's
    with pytest.raises(SystemExit, match=r"non-finite .* by step \d+; last good checkpoint: none written"):
        r2d2.main(r2d2.Args(**tiny("r2d2")))
    assert not glob.glob("runs/*/checkpoint.pt")


@pytest.mark.parametrize("module", [r2d2, r2d2_atari])
def test_oversized_replay_is_refused_before_anything_is_built(module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="--buffer-size=1000000000000: the replay needs about .* GB"):
        module.main(module.Args(buffer_size=10**12))
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("module, obs_shape, dtype", [(r2d2, (2,), np.float32), (r2d2_atari, (84, 84), np.uint8)])
def test_replay_memory_estimate_matches_the_allocation(module, obs_shape, dtype):
    args = module.Args(num_envs=3, buffer_size=3000, seq_len=6, burn_in=4, sequence_period=3, n_step=2, lstm_size=8)
    rb = module.SequenceReplay(args, obs_shape, dtype)
    allocated = sum(value.nbytes for value in vars(rb).values() if isinstance(value, np.ndarray))
    assert module.replay_memory_bytes(args, obs_shape, dtype) == allocated + rb.tree.nodes.nbytes


def test_seeded_runs_are_reproducible(tmp_path, monkeypatch):
    args = tiny("r2d2", total_timesteps=1200)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    first = r2d2.main(r2d2.Args(**args))
    monkeypatch.chdir(tmp_path / "b")
    assert r2d2.main(r2d2.Args(**args)) == first and len(first) > 5


def test_atari_resumed_run_is_bitwise_identical(tmp_path, monkeypatch):
    args = tiny("r2d2_atari", checkpoint_replay=True, checkpoint_every=10_000)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    r2d2_atari.main(r2d2_atari.Args(**args))
    final_a, logged_a = read_checkpoint(checkpoint_of())["state"], logged_scalars()

    monkeypatch.chdir(tmp_path / "b")
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, r2d2_atari, 80)
        run_until_stopped(r2d2_atari.main, r2d2_atari.Args(**args))
    checkpoint = read_checkpoint(checkpoint_of())
    assert checkpoint["global_step"] == 160 and checkpoint["state"]["updates"] > 0
    assert checkpoint["state"]["stack"].shape == (2, 4, 84, 84)
    r2d2_atari.main(r2d2_atari.Args(resume=str(checkpoint_of()), checkpoint_every=10_000, cuda=False))
    final_b = read_checkpoint(checkpoint_of())["state"]

    for name, weight in final_a["q_network"].items():
        assert torch.equal(weight, final_b["q_network"][name]), name
    assert np.array_equal(final_a["rb"]["tree"], final_b["rb"]["tree"])
    assert logged_scalars() == logged_a and len(logged_a["losses/td_loss"]) > 5


def test_tracked_run_resumes_its_wandb_run(offline_wandb, monkeypatch):
    import wandb

    init, ids = wandb.init, []

    def recording_init(*args, **kwargs):
        run = init(*args, **kwargs)
        ids.append((kwargs.get("id"), run.id))
        return run

    monkeypatch.setattr(wandb, "init", recording_init)
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, r2d2, 20)
        run_until_stopped(r2d2.main, r2d2.Args(**tiny("r2d2", total_timesteps=400), track=True))
    saved_id = read_checkpoint(checkpoint_of())["wandb_id"]
    r2d2.main(r2d2.Args(resume=str(checkpoint_of()), track=True, cuda=False))
    assert ids == [(None, saved_id), (saved_id, saved_id)]
