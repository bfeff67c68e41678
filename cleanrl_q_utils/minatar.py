"""MinAtar (Young & Tian 2019, "MinAtar: An Atari-Inspired Testbed for Thorough and Reproducible Reinforcement Learning
Experiments") through gymnasium, for the vector scripts: the env id check, the vectorized training and evaluation envs,
and the rendering env of videos (a script's MinAtar configuration is merged into its flags by
`command_line.with_minatar_defaults`).

MinAtar is GPL-3.0: this project depends on it as the optional extra `minatar` and only calls it. Its games are played
as the package ships them, which is Young & Tian's protocol: sticky actions (0.1), difficulty ramping, no frame skip,
`MinAtar/<Game>-v0` with all six actions (`-v1`: the game's minimal set). No time limit is registered and none is
added: every game ends on its own (Freeway after 2,500 steps), and an episode's score is its summed reward.

Layer 2 (parts): imports no module of this package.
"""

import os
import types
import warnings

import gymnasium as gym
import numpy as np

INSTALL = 'pip install -e ".[minatar]"'
# gymnasium calls every -v0 id "out of date" when a -v1 exists; MinAtar's v0 is the full action set, not an old version.
warnings.filterwarnings("ignore", message=r".*MinAtar/\w+-v0 is out of date")


def is_minatar(env_id: str) -> bool:
    return env_id.startswith("MinAtar/")


def register(env_id: str) -> None:
    """Registers the MinAtar ids with gymnasium (gymnasium 1.x does not load the package's plugin by itself)."""
    try:
        import minatar.gym
    except ImportError:
        raise SystemExit(
            f"error: --env-id={env_id}: MinAtar is not installed (an optional extra, GPL-3.0): {INSTALL}"
        ) from None
    if "MinAtar/Breakout-v0" not in gym.registry:
        minatar.gym.register_envs()


def spec(env_id: str):
    """The observation and action spaces of a MinAtar id, or one line naming the ids there are."""
    register(env_id)
    if env_id not in gym.registry:
        games = sorted(name for name in gym.registry if is_minatar(name))
        raise SystemExit(f"error: --env-id={env_id}: not a MinAtar id; there are {', '.join(games)}")
    env = gym.make(env_id)
    spaces = types.SimpleNamespace(observation_space=env.observation_space, action_space=env.action_space)
    env.close()
    return spaces


class SeededVectorEnv(gym.vector.SyncVectorEnv):
    """gymnasium's vector env (NEXT_STEP autoreset, as envpool) seeded when built, as envpool is: the first `reset()`
    seeds game i with `seed + i`, and every later game continues that game's generator."""

    def __init__(self, env_fns, seed: int):
        super().__init__(env_fns)
        self.first_seed = seed

    def reset(self, *, seed=None, options=None):
        seed, self.first_seed = self.first_seed if seed is None else seed, None
        return super().reset(seed=seed, options=options)


def make_envs(env_id: str, num_envs: int, seed: int, max_episode_steps=None) -> SeededVectorEnv:
    """`num_envs` games of `env_id`; `max_episode_steps` adds gymnasium's TimeLimit (its time-outs are truncations)."""
    register(env_id)
    # The env checker validates every step; the games are the package's own and need no checking.
    cap = dict(disable_env_checker=True, max_episode_steps=max_episode_steps)
    return SeededVectorEnv([lambda: gym.make(env_id, **cap) for _ in range(num_envs)], seed)


class LargeFrames(gym.Wrapper):
    """Renders the 10x10 grid as a 160x160 RGB picture of uint8, which video writers take (MinAtar gives floats)."""

    def render(self):
        frame = (255 * np.asarray(self.env.render())).astype(np.uint8)
        return frame.repeat(16, axis=0).repeat(16, axis=1)


def make_rendering_env(env_id: str) -> gym.Env:
    """One env of a MinAtar game, played as in training, that renders frames for a video recorder."""
    register(env_id)
    os.environ.setdefault("MPLBACKEND", "Agg")
    return LargeFrames(gym.make(env_id, render_mode="rgb_array", disable_env_checker=True))
