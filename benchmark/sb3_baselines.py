"""Stable-Baselines3's DQN and sb3-contrib's QR-DQN with RL Zoo's tuned hyperparameters, logged like this project's runs.

    python benchmark/sb3_baselines.py --algo dqn --env-id CartPole-v1 --seed 1 --no-track

Every training episode's true return (read from the Monitor wrapper: unclipped, time-outs included) is logged to
TensorBoard as `charts/episodic_return` and `charts/episodic_length` at the agent step where the episode ended, with
`charts/SPS`, in `{runs_dir}/{env_id}__sb3_{algo}__{seed}__{unix time}`: benchmark/report.py reads these runs beside
ours. After training, `--eval-episodes` greedy episodes on a fresh environment are logged as `eval/episodic_return`.
Needs the `sb3` extra: `pip install -e ".[sb3]"`.
"""

import argparse
import os
import time

import gymnasium as gym
import torch
import torch.nn as nn
from torch.utils.tensorboard import SummaryWriter

from cleanrl_q_utils import minatar

try:
    from sb3_contrib import QRDQN
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
except ImportError as error:
    raise SystemExit(f'error: {error.name} is missing; install the sb3 extra: pip install -e ".[sb3]"')

# RL Zoo's entries for these envs (DLR-RM/rl-baselines3-zoo, hyperparams/dqn.yml and hyperparams/qrdqn.yml): one
# environment (RL Zoo's default n_envs), MlpPolicy, no observation normalization, no frame stack. DQN's and QR-DQN's
# entries are the same but for the number of quantiles. n_timesteps is the default of --total-timesteps; the rest are
# keyword arguments of the SB3 class, whose other arguments keep SB3's defaults (as in RL Zoo).
CARTPOLE = dict(
    n_timesteps=50_000,
    learning_rate=2.3e-3,
    batch_size=64,
    buffer_size=100_000,
    learning_starts=1_000,
    gamma=0.99,
    target_update_interval=10,
    train_freq=256,
    gradient_steps=128,
    exploration_fraction=0.16,
    exploration_final_eps=0.04,
)
ACROBOT = dict(
    n_timesteps=100_000,
    learning_rate=6.3e-4,
    batch_size=128,
    buffer_size=50_000,
    learning_starts=0,
    gamma=0.99,
    target_update_interval=250,
    train_freq=4,
    gradient_steps=-1,  # SB3: as many gradient steps as environment steps since the last update
    exploration_fraction=0.12,
    exploration_final_eps=0.1,
)
HYPERPARAMS = {
    ("dqn", "CartPole-v1"): {**CARTPOLE, "policy_kwargs": dict(net_arch=[256, 256])},
    ("dqn", "Acrobot-v1"): {**ACROBOT, "policy_kwargs": dict(net_arch=[256, 256])},
    ("qrdqn", "CartPole-v1"): {**CARTPOLE, "policy_kwargs": dict(net_arch=[256, 256], n_quantiles=10)},
    ("qrdqn", "Acrobot-v1"): {**ACROBOT, "policy_kwargs": dict(net_arch=[256, 256], n_quantiles=25)},
}


class MinAtarTorso(BaseFeaturesExtractor):
    """Young & Tian's convolution of 16 filters 3x3 over MinAtar's (10, 10, C) planes, as in this project's scripts;
    SB3's Q head adds the 128 units (net_arch=[128])."""

    def __init__(self, observation_space: gym.spaces.Box):
        height, width, channels = observation_space.shape
        super().__init__(observation_space, features_dim=16 * (height - 2) * (width - 2))
        self.conv = nn.Sequential(nn.Conv2d(channels, 16, 3), nn.ReLU(), nn.Flatten())

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.conv(observations.permute(0, 3, 1, 2).float())


# Young & Tian's DQN (MinAtar's examples/dqn.py) in SB3's terms: replay 100k, batch 32, one update per step after 5,000
# random steps, epsilon 1 -> 0.1 over the next 100k steps, target copy every 1,000 updates, Huber loss (SB3's), RMSprop
# (lr 2.5e-4, alpha 0.95, centered, eps 0.01), 5M steps. SB3's defaults that differ: gradients clipped to norm 10, and
# epsilon decays from step 0 (over 100k steps counted from the start: exploration_fraction 0.02 of 5M).
MINATAR = dict(
    n_timesteps=5_000_000,
    learning_rate=2.5e-4,
    batch_size=32,
    buffer_size=100_000,
    learning_starts=5_000,
    gamma=0.99,
    target_update_interval=1_000,
    train_freq=1,
    gradient_steps=1,
    exploration_fraction=0.02,
    exploration_final_eps=0.1,
)
MINATAR_POLICY = dict(
    features_extractor_class=MinAtarTorso,
    net_arch=[128],
    optimizer_class=torch.optim.RMSprop,
    optimizer_kwargs=dict(alpha=0.95, centered=True, eps=0.01),
)
for game in ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders"):
    HYPERPARAMS[("dqn", f"MinAtar/{game}-v0")] = {**MINATAR, "policy_kwargs": MINATAR_POLICY}
    # QR-DQN: the same with 32 quantiles (with sb3-contrib's 200 a run took 7 times DQN's time here; IQN's K is 32)
    HYPERPARAMS[("qrdqn", f"MinAtar/{game}-v0")] = {**MINATAR, "policy_kwargs": {**MINATAR_POLICY, "n_quantiles": 32}}
ALGOS = {"dqn": DQN, "qrdqn": QRDQN}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sb3_baselines.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", choices=sorted(ALGOS), required=True, help="SB3's DQN or sb3-contrib's QR-DQN")
    parser.add_argument("--env-id", choices=sorted({env_id for _, env_id in HYPERPARAMS}), default="CartPole-v1")
    parser.add_argument("--seed", type=int, default=1, help="seed of the agent and of the environment")
    parser.add_argument("--total-timesteps", type=int, default=None, help="agent steps (default: RL Zoo's n_timesteps)")
    parser.add_argument("--eval-episodes", type=int, default=10, help="greedy episodes after training (0: none)")
    parser.add_argument("--runs-dir", default="runs", help="where the run directory is created")
    parser.add_argument("--track", action=argparse.BooleanOptionalAction, default=False, help="sync the logs to W&B")
    parser.add_argument("--wandb-project-name", default="cleanrl-q")
    parser.add_argument("--wandb-entity", default=None)
    args = parser.parse_args(argv)
    if args.total_timesteps is None:
        args.total_timesteps = int(HYPERPARAMS[(args.algo, args.env_id)]["n_timesteps"])
    if args.total_timesteps <= 0:
        parser.error(f"--total-timesteps={args.total_timesteps}: must be > 0")
    if args.eval_episodes < 0:
        parser.error(f"--eval-episodes={args.eval_episodes}: must be >= 0")
    return args


class EpisodeLogger(BaseCallback):
    """Logs each finished training episode (Monitor's `info["episode"]`) at the agent step where it ended, and a
    progress line at most every 10 s. SB3 collects `train_freq` steps at a time, so a run can end up to
    `train_freq - 1` steps after `total_timesteps` (CartPole: 50,176 instead of 50,000)."""

    def __init__(self, writer: SummaryWriter, total_timesteps: int):
        super().__init__()
        self.writer, self.total = writer, total_timesteps
        self.returns: list[float] = []

    def _on_training_start(self) -> None:
        self.start_time = self.last_print = time.time()

    def _on_step(self) -> bool:
        step = self.num_timesteps  # already counts the step just taken
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(float(info["episode"]["r"]))
                self.writer.add_scalar("charts/episodic_return", info["episode"]["r"], step)
                self.writer.add_scalar("charts/episodic_length", info["episode"]["l"], step)
                self.writer.add_scalar("charts/SPS", int(step / (time.time() - self.start_time)), step)
        if time.time() - self.last_print > 10:
            self.print_progress()
        return True

    def _on_training_end(self) -> None:
        self.print_progress()

    def print_progress(self) -> None:
        self.last_print = time.time()
        recent = self.returns[-100:]
        mean = f"{sum(recent) / len(recent):.1f}" if recent else "-"
        sps = int(self.num_timesteps / (time.time() - self.start_time))
        print(f"step {self.num_timesteps:>7}/{self.total} | SPS {sps:>5} | return (last 100) {mean}")


def make_env(env_id: str) -> gym.Env:
    if minatar.is_minatar(env_id):
        minatar.register(env_id)
        return gym.make(env_id, disable_env_checker=True)
    return gym.make(env_id)


def evaluate(model, env_id: str, episodes: int, seed: int) -> list[float]:
    """Returns of `episodes` greedy episodes on a fresh environment seeded `seed`."""
    env = make_env(env_id)
    scores = []
    obs, _ = env.reset(seed=seed)
    for _ in range(episodes):
        score, done = 0.0, False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            score += float(reward)
            done = terminated or truncated
        scores.append(score)
        obs, _ = env.reset()
    env.close()
    return scores


def main(args: argparse.Namespace) -> str:
    """Trains one agent; returns its run directory."""
    # These networks (two layers of 256, batches of 64-128) run fastest on one thread: more only add synchronization to
    # every call, and two runs side by side on a 2-core machine would fight over the cores. Ours also use one thread.
    torch.set_num_threads(1)
    exp_name = f"sb3_{args.algo}"
    run_name = f"{args.env_id.replace('/', '-')}__{exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join(args.runs_dir, run_name)
    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            name=run_name,
            sync_tensorboard=True,
            config=vars(args),
            save_code=True,
        )
    kwargs = {key: value for key, value in HYPERPARAMS[(args.algo, args.env_id)].items() if key != "n_timesteps"}
    writer = SummaryWriter(run_dir)
    rows = {**vars(args), "exp_name": exp_name, **kwargs}
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in rows.items()))

    env = Monitor(make_env(args.env_id))  # Monitor sums the raw rewards of each episode into info["episode"]
    model = ALGOS[args.algo]("MlpPolicy", env, seed=args.seed, device="cpu", verbose=0, **kwargs)
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's own logger would leave an empty /tmp/SB3-* folder
    model.learn(total_timesteps=args.total_timesteps, callback=EpisodeLogger(writer, args.total_timesteps))
    if args.eval_episodes:
        scores = evaluate(model, args.env_id, args.eval_episodes, seed=args.seed + 1)
        for episode, score in enumerate(scores):
            writer.add_scalar("eval/episodic_return", score, episode)
        print(f"greedy evaluation over {len(scores)} episodes: {sum(scores) / len(scores):.1f}")
    env.close()
    writer.close()
    if args.track:
        wandb.finish()
    return run_dir


if __name__ == "__main__":
    main(parse_args())
