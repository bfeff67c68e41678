"""The memory pre-flight of dqn_dueling_per.py."""

import numpy as np
import pytest

import cleanrl.dqn_dueling_per as script
from cleanrl.dqn_dueling_per import Args, NStepWindow, PrioritizedReplayBuffer, main, replay_memory_bytes


def test_replay_memory_bytes_matches_the_allocated_arrays():
    rb = PrioritizedReplayBuffer(37, (4,), np.float32, alpha=0.6)  # 37: the trees pad to 64 leaves
    window = NStepWindow(3, 2, (4,), np.float32, gamma=0.99)
    arrays = (rb.obs, rb.next_obs, rb.actions, rb.returns, rb.discounts, rb.sum_tree.nodes, rb.min_tree.nodes,
              window.obs, window.actions, window.rewards, window.length)
    estimate = replay_memory_bytes(Args(buffer_size=37, n_step=3, num_envs=2), (4,), np.float32)
    assert estimate == sum(a.nbytes for a in arrays)
    atari = replay_memory_bytes(Args(buffer_size=1_000_000), (4, 84, 84), np.uint8)
    assert 56e9 < atari < 57e9  # the docs' "about 56 KB per transition"


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Breakout-v5"])
def test_oversized_buffer_is_refused_before_envs_are_built(monkeypatch, env_id):
    def no_envs(*args, **kwargs):
        raise AssertionError("envs built before the memory check")

    monkeypatch.setattr(script, "make_env", no_envs)
    with pytest.raises(SystemExit, match=r"--buffer-size=1000000000000: the replay needs about .* GB"):
        main(Args(env_id=env_id, buffer_size=10**12))
