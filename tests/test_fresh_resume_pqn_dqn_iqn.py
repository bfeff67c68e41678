"""--resume-fresh-envs of the PQN, dueling-PER DQN and IQN scripts: a resume that starts new games instead of stepping
the logged actions again, where nothing a script keeps across steps may join a dropped game to a new one."""

import numpy as np
import pytest
import torch

from cleanrl import dqn_dueling_per, iqn, iqn_atari, pqn, pqn_atari_envpool, pqn_atari_envpool_lstm
from cleanrl_q_utils.checkpoint_files import read_checkpoint

from helpers import checkpoint_of
from interrupts import interrupt_at_step, run_until_stopped
from tiny import tiny


def interrupt_then_resume_fresh(module, monkeypatch, capsys, flags: dict, k: int) -> tuple[dict, dict]:
    """Runs `module` with `flags` up to a SIGINT at its k-th envs.step, then resumes it with fresh envs to the end.
    Returns the saved state of the interrupted run and that of the finished one."""
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
    return before["state"], after["state"]


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
