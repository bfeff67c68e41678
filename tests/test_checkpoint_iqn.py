"""Checkpoints of cleanrl/iqn.py and cleanrl/iqn_atari.py: SIGINT, exact resume, unreadable files, NaN stop, memory."""

import signal

import numpy as np
import pytest
import torch

from cleanrl import iqn, iqn_atari
from cleanrl_q_utils.checkpoint_files import read_checkpoint

from helpers import checkpoint_of, run_dir_of
from interrupts import interrupt_at_step, run_until_stopped
from tiny import tiny


def tb_scalars(root):
    """Every scalar (but SPS) of the one run under root/runs, as {tag: [(step, value), ...]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir_of(root)), size_guidance={"scalars": 0})
    acc.Reload()
    tags = [tag for tag in acc.Tags()["scalars"] if tag != "charts/SPS"]
    return {tag: [(event.step, event.value) for event in acc.Scalars(tag)] for tag in tags}


def test_sigint_leaves_a_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    previous = signal.getsignal(signal.SIGINT)
    with monkeypatch.context() as m:
        interrupt_at_step(m, iqn, 50)
        run_until_stopped(iqn.main, iqn.Args(**tiny("iqn"), save_model=True))
    assert signal.getsignal(signal.SIGINT) is previous  # the handlers are given back
    path = checkpoint_of(tmp_path)
    assert not path.with_suffix(".pt.tmp").exists()
    assert not (path.parent / "iqn.cleanrl_model").exists()  # an interrupted run is not saved as a model
    ckpt, state = read_checkpoint(path), read_checkpoint(path)["state"]
    assert ckpt["global_step"] == 200 and state["iteration"] == 50  # stopped after the step that got the signal
    assert state["action_log"].shape == (50, 4) and state["action_log"].dtype == np.uint8
    assert "rb" not in state and len(state["stats"]["scores"]) > 0  # the games finished before the stop


def test_resume_is_bitwise_exact(tmp_path, monkeypatch):
    flags = tiny("iqn", checkpoint_every=1000, checkpoint_replay=True)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    scores_a = iqn.main(iqn.Args(**flags))
    final_a = read_checkpoint(checkpoint_of(tmp_path / "a"))

    monkeypatch.chdir(tmp_path / "b")
    with monkeypatch.context() as m:
        interrupt_at_step(m, iqn, 240)
        run_until_stopped(iqn.main, iqn.Args(**flags))
    path = checkpoint_of(tmp_path / "b")
    assert read_checkpoint(path)["global_step"] == 960  # interrupted before the periodic checkpoint at step 1000
    scores_b = iqn.main(iqn.Args(resume=str(path), checkpoint_every=1000, cuda=False))
    final_b = read_checkpoint(path)

    assert final_a["global_step"] == final_b["global_step"] == 2000
    state_a, state_b = final_a["state"], final_b["state"]
    assert scores_a == scores_b and state_a["stats"]["scores"] == state_b["stats"]["scores"]
    for name in ("q_network", "target_network"):
        for key, value in state_a[name].items():
            assert torch.equal(value, state_b[name][key]), (name, key)
    assert state_a["updates"] == state_b["updates"]
    assert np.array_equal(state_a["action_log"], state_b["action_log"])
    assert state_a["rng"] == state_b["rng"]
    # The resumed run appends to the interrupted run's TensorBoard log: together they log what run a logged.
    assert tb_scalars(tmp_path / "a") == tb_scalars(tmp_path / "b")


def test_resume_without_replay_refills_the_buffer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as m:
        interrupt_at_step(m, iqn, 100)  # step 400: learning has started, the buffer is not stored
        run_until_stopped(iqn.main, iqn.Args(**tiny("iqn", total_timesteps=1000)))
    path = checkpoint_of(tmp_path)
    updates_before = read_checkpoint(path)["state"]["updates"]
    scores = iqn.main(iqn.Args(resume=str(path), checkpoint_every=10_000, cuda=False))
    final = read_checkpoint(path)
    assert final["global_step"] == 1000 and scores == final["state"]["stats"]["scores"]
    # Steps 404..600 refill the empty buffer (learning_starts = 200 more steps), then one update per iteration.
    assert final["state"]["updates"] == updates_before + (1000 - 600) // 4


def test_seeded_runs_are_reproducible(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    flags = tiny("iqn", total_timesteps=1000)
    assert iqn.main(iqn.Args(**flags)) == iqn.main(iqn.Args(**flags))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "not_a_checkpoint", "missing"])
def test_unreadable_checkpoint_is_refused(damage, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "checkpoint.pt"
    if damage == "truncated":
        with monkeypatch.context() as m:
            interrupt_at_step(m, iqn, 3)
            run_until_stopped(iqn.main, iqn.Args(**tiny("iqn")))
        data = checkpoint_of(tmp_path).read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(np.random.default_rng(0).bytes(5000))
    elif damage == "not_a_checkpoint":
        torch.save({"weights": torch.zeros(3)}, path)
    with pytest.raises(SystemExit, match=f"--resume={path}: (not a readable checkpoint|no such file)"):
        iqn.main(iqn.Args(resume=str(path), cuda=False))


def test_checkpoint_flags_are_validated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="--checkpoint-every=-1"):
        iqn.main(iqn.Args(checkpoint_every=-1))
    assert not (tmp_path / "runs").exists()


def test_nan_loss_stops_without_checkpointing_the_broken_network(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    loss, calls = iqn.quantile_huber_loss, []

    def nan_on_third_call(*a, **kw):
        calls.append(1)
        out = loss(*a, **kw)
        return out * float("nan") if len(calls) == 3 else out

    monkeypatch.setattr(iqn, "quantile_huber_loss", nan_on_third_call)
    monkeypatch.setattr(iqn, "seconds_per_update", lambda *a: 0.001)  # the start-up timing's updates are not the run's
    # Updates at steps 204, 208, 212: the third one is poisoned; the last checkpoint is the one of step 200. The NaN is
    # read at the next checkpoint (step 300), or without checkpoints at the next logging (every 100 updates: step 600).
    with pytest.raises(SystemExit, match=r"non-finite loss or Q-values by step 300; last good checkpoint: runs/.*pt"):
        iqn.main(iqn.Args(**tiny("iqn"), checkpoint_every=100))
    ckpt = read_checkpoint(checkpoint_of(tmp_path))
    assert ckpt["global_step"] == 200
    assert all(torch.isfinite(v).all() for v in ckpt["state"]["q_network"].values())
    calls.clear()
    with pytest.raises(SystemExit, match="by step 600; last good checkpoint: none written"):
        iqn.main(iqn.Args(**tiny("iqn")))


@pytest.mark.parametrize("module", [iqn, iqn_atari])
def test_oversized_buffer_is_refused_before_envs_are_built(module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def no_env(*a, **kw):
        raise AssertionError("an environment was built")

    monkeypatch.setattr(module, "make_env", no_env)
    with pytest.raises(SystemExit, match=r"--buffer-size=1000000000000: the replay needs about [\d,.]+ GB .*"):
        module.main(module.Args(buffer_size=10**12))
    assert not (tmp_path / "runs").exists()


def test_replay_memory_estimate_matches_the_allocated_arrays():
    rng = np.random.default_rng(0)
    args = iqn.Args(buffer_size=1003, num_envs=4)  # 250 slots per environment: 1000 in all
    rb = iqn.ReplayBuffer(1003, 4, (4,), "cpu", rng)
    assert iqn.replay_memory_bytes(args, (4,)) == sum(getattr(rb, name).nbytes for name in rb.ARRAYS) == 1000 * 33
    args = iqn_atari.Args(buffer_size=1003, num_envs=4)
    rb = iqn_atari.ReplayBuffer(1003, 4, (84, 84), 4, "cpu", rng)
    assert iqn_atari.replay_memory_bytes(args, (84, 84)) == sum(getattr(rb, name).nbytes for name in rb.ARRAYS)


def test_atari_sigint_checkpoint_and_resume_without_replay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as m:
        interrupt_at_step(m, iqn_atari, 90)  # step 180: after learning started
        run_until_stopped(iqn_atari.main, iqn_atari.Args(**tiny("iqn_atari")))
    path = checkpoint_of(tmp_path)
    ckpt = read_checkpoint(path)
    assert ckpt["global_step"] == 180 and ckpt["state"]["obs"].shape == (2, 4, 84, 84) and "rb" not in ckpt["state"]
    # The resume replays the 90 logged steps of Breakout and checks that it reaches the stored frames.
    scores = iqn_atari.main(iqn_atari.Args(resume=str(path), checkpoint_every=10_000, cuda=False))
    assert isinstance(scores, list) and read_checkpoint(path)["global_step"] == 240


def test_atari_resume_with_replay_is_bitwise_exact(tmp_path, monkeypatch):
    flags = tiny("iqn_atari", total_timesteps=200, checkpoint_every=10_000, checkpoint_replay=True)  # at the end only
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    scores_a = iqn_atari.main(iqn_atari.Args(**flags))
    final_a = read_checkpoint(checkpoint_of(tmp_path / "a"))
    monkeypatch.chdir(tmp_path / "b")
    with monkeypatch.context() as m:
        interrupt_at_step(m, iqn_atari, 85)  # step 170: between updates (learning starts after step 160)
        run_until_stopped(iqn_atari.main, iqn_atari.Args(**flags))
    path = checkpoint_of(tmp_path / "b")
    scores_b = iqn_atari.main(iqn_atari.Args(resume=str(path), checkpoint_every=10_000, cuda=False))
    state_a, state_b = final_a["state"], read_checkpoint(path)["state"]
    assert state_a["updates"] == state_b["updates"] > 0 and scores_a == scores_b
    for key, value in state_a["q_network"].items():
        assert torch.equal(value, state_b["q_network"][key]), key
    assert torch.equal(state_a["rb"]["frames"], state_b["rb"]["frames"])


def test_add_history_rebuilds_the_current_stack():
    # A resume without stored replay starts an empty frame-once buffer in the middle of games.
    for stack, starts_game in [([5, 6, 7, 8], False), ([5, 5, 6, 7], False), ([5, 5, 5, 5], True)]:
        obs = np.array(stack, dtype=np.uint8).reshape(1, 4, 1, 1) * np.ones((1, 4, 2, 2), dtype=np.uint8)
        rb = iqn_atari.ReplayBuffer(20, 1, (2, 2), 4, "cpu", np.random.default_rng(0))
        rb.add_history(obs)
        one, no = np.ones(1, dtype=bool), np.zeros(1, dtype=bool)
        rb.add(obs[:, -1], np.array([starts_game]), np.array([1]), np.array([1.0]), np.array([0.0]), valid=one)
        rb.add(np.full((1, 2, 2), 9, dtype=np.uint8), no, np.array([0]), np.array([0.0]), np.array([0.0]), valid=one)
        assert np.array_equal(rb.stacks(np.array([0]), np.array([3]))[0], obs[0])
        assert rb.stacks(np.array([0]), np.array([4]))[0, :, 0, 0].tolist() == stack[1:] + [9]
        batch = rb.sample(8)  # only the one real transition, from the rebuilt stack to the next one
        assert (batch.obs == torch.from_numpy(obs)).all() and (batch.actions == 1).all()


def test_tracked_resume_continues_the_wandb_run(offline_wandb, monkeypatch):
    flags = tiny("iqn", total_timesteps=400, track=True)
    with monkeypatch.context() as m:
        interrupt_at_step(m, iqn, 50)
        run_until_stopped(iqn.main, iqn.Args(**flags))
    path = checkpoint_of(offline_wandb.parent)
    run_id = read_checkpoint(path)["wandb_id"]
    assert run_id is not None
    iqn.main(iqn.Args(resume=str(path), track=True, checkpoint_every=1000, cuda=False))
    assert read_checkpoint(path)["wandb_id"] == run_id and read_checkpoint(path)["global_step"] == 400
