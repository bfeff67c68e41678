"""Classic control without envpool: envpool ships Linux wheels only, so where it cannot be imported (macOS) the vector
scripts play gymnasium's own CartPole, Acrobot, MountainCar and LunarLander, stepped as envpool steps them
(`GymnasiumPool`).

What the scripts rely on is kept: NEXT_STEP autoreset (the step after an episode end only starts the next episode: its
action is ignored, its reward is 0 and it ends nothing), time-outs as truncations at the id's step cap (or at
`max_episode_steps`), float32 rewards, observations of the space's dtype, game i seeded with `seed + i` when built, and
envpool's info fields of classic control (`env_id`, `players`, `elapsed_step`). The games themselves are gymnasium's:
their first states are drawn by another generator than envpool's, so the same seed plays other games, and a game that
ends on the capped step is both terminated and truncated (gymnasium's TimeLimit), where envpool calls it truncated only.
Given the seed and the actions the games are the same every time, which a resume's fast-forward through the logged
actions needs.

Atari stays on envpool: without it an Atari id stops with one line that says so.

Layer 2 (parts): imports flag_errors only.
"""

import types

import gymnasium as gym
import numpy as np

from cleanrl_q_utils.flag_errors import flag_error

# envpool's classic-control ids with discrete actions that gymnasium also has (envpool's LunarLander-v2 is gone from
# gymnasium 1.x).
IDS = ("CartPole-v0", "CartPole-v1", "Acrobot-v1", "MountainCar-v0", "LunarLander-v3")
ENVPOOL_NEEDED = "envpool, which installs on Linux only (pip install envpool)"


def import_envpool():
    """The envpool module, or None where it is not installed (it has no wheels for macOS or Windows)."""
    try:
        import envpool
    except ImportError:
        return None
    return envpool


def is_atari(env_id: str) -> bool:
    return env_id.endswith("-v5")  # envpool's Atari ids


def check_env_id(env_id: str, atari=None):
    """The spaces of `env_id` played without envpool, or one line saying what runs without it."""
    if atari or is_atari(env_id):
        flag_error("env_id", env_id, f"Atari games need {ENVPOOL_NEEDED}; without it CartPole-v1 or MinAtar ids run")
    if env_id not in IDS:
        flag_error("env_id", env_id, f"without {ENVPOOL_NEEDED}, the ids are {', '.join(IDS)} and MinAtar's")
    try:
        env = gym.make(env_id, disable_env_checker=True)
    except gym.error.DependencyNotInstalled:
        flag_error("env_id", env_id, 'needs Box2D, not installed: pip install "gymnasium[box2d]"')
    spaces = types.SimpleNamespace(observation_space=env.observation_space, action_space=env.action_space)
    env.close()
    return spaces


class GymnasiumPool(gym.Env):
    """`num_envs` gymnasium games of `env_id` behind envpool's interface (module docstring): `reset()` and `step(actions)`
    of whole batches, `observation_space` and `single_observation_space` both the space of one game (as envpool's)."""

    def __init__(self, env_id: str, num_envs: int, seed: int, max_episode_steps=None):
        check_env_id(env_id)
        # max_episode_steps None keeps the id's registered cap (CartPole-v1 500), as envpool does.
        self.envs = [gym.make(env_id, max_episode_steps=max_episode_steps, disable_env_checker=True) for _ in range(num_envs)]
        self.num_envs, self.first_seed = num_envs, seed
        self.observation_space = self.single_observation_space = self.envs[0].observation_space
        self.action_space = self.single_action_space = self.envs[0].action_space
        space = self.single_observation_space
        self.obs = np.zeros((num_envs, *space.shape), dtype=space.dtype)
        self.elapsed_step = np.zeros(num_envs, dtype=np.int32)
        self.ended = np.zeros(num_envs, dtype=bool)  # these games' next step is a reset step

    def info(self) -> dict:
        ids = np.arange(self.num_envs, dtype=np.int32)
        return dict(env_id=ids, players=dict(env_id=ids.copy()), elapsed_step=self.elapsed_step.copy())

    def reset(self, *, seed=None, options=None):
        """Starts a game in every env. The seed given when built seeds the first reset; as envpool, `seed` is ignored
        and every later game continues its env's generator."""
        for i, env in enumerate(self.envs):
            self.obs[i] = env.reset(seed=None if self.first_seed is None else self.first_seed + i)[0]
        self.first_seed = None
        self.elapsed_step[:] = 0
        self.ended[:] = False
        return self.obs.copy(), self.info()

    def step(self, actions):
        rewards = np.zeros(self.num_envs, dtype=np.float32)
        terminated, truncated = np.zeros(self.num_envs, dtype=bool), np.zeros(self.num_envs, dtype=bool)
        for i, env in enumerate(self.envs):
            if self.ended[i]:  # NEXT_STEP autoreset: this step only starts the next game; its action is not played
                self.obs[i], self.elapsed_step[i] = env.reset()[0], 0
            else:
                self.obs[i], rewards[i], terminated[i], truncated[i], _ = env.step(int(actions[i]))
                self.elapsed_step[i] += 1
        self.ended = terminated | truncated
        return self.obs.copy(), rewards, terminated, truncated, self.info()

    def close(self):
        for env in self.envs:
            env.close()


def make_envs(env_id: str, num_envs: int, seed: int, max_episode_steps=None) -> GymnasiumPool:
    """The stand-in for `envpool.make(env_id, env_type="gymnasium", num_envs=..., seed=..., max_episode_steps=...)`."""
    return GymnasiumPool(env_id, num_envs, seed, max_episode_steps)
