"""--resume-fresh-envs in the recurrent scripts (r2d2, r2d2_atari, recurrent_iqn, recurrent_iqn_atari): the resumed
run steps no logged action, keeps the replay written before the cut, and no training sequence crosses the cut: the
last stored step ends like a time-out (targets bootstrap from the observation at the cut), the reset step there is
never trained, and the first new step starts an episode with zeroed recurrent inputs."""

import numpy as np
import pytest
import torch

from cleanrl import r2d2, r2d2_atari, recurrent_iqn, recurrent_iqn_atari
from cleanrl_q_utils.checkpoint_files import read_checkpoint

from helpers import checkpoint_of
from interrupts import interrupt_at_step, run_until_stopped
from tiny import tiny


def interrupted_then_resumed_fresh(module, flags, interrupt_at, monkeypatch, capsys):
    """Runs `flags` until the envs.step call `interrupt_at`, resumes it with fresh envs; returns both checkpoints."""
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, module, interrupt_at)
        run_until_stopped(module.main, module.Args(**flags))
    path = str(checkpoint_of())
    cut = read_checkpoint(path)
    capsys.readouterr()
    module.main(module.Args(resume=path, resume_fresh_envs=True, cuda=False))
    out = capsys.readouterr().out
    assert "resume: fresh environments" in out and "fast-forwarding" not in out  # no logged action was stepped
    final = read_checkpoint(path)
    assert final["global_step"] == flags["total_timesteps"]
    return cut, final


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
    cut, final = interrupted_then_resumed_fresh(module, flags, k, monkeypatch, capsys)
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
    cut, final = interrupted_then_resumed_fresh(module, flags, k, monkeypatch, capsys)
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
