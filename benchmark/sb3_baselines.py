"""Stable-Baselines3's DQN and sb3-contrib's QR-DQN with RL Zoo's tuned hyperparameters, logged like this project's runs.

    python benchmark/sb3_baselines.py --algo dqn --env-id CartPole-v1 --seed 1 --no-track

Every training episode's true return (read from the Monitor wrapper: unclipped, time-outs included) is logged to
TensorBoard as `charts/episodic_return` and `charts/episodic_length` at the agent step where the episode ended, with
`charts/SPS`, in `runs/{env_id}__sb3_{algo}__{seed}__{unix time}`: benchmark/report.py reads these runs beside ours.
After training, `--eval-episodes` greedy episodes on a fresh environment are logged as `eval/episodic_return`. The run
folder, the logs, W&B, the checkpoints, the signals and the resume are those of this project's scripts
(cleanrl_q_utils); a checkpoint is written every `--checkpoint-every` agent steps and when a signal stops the run, and
`--resume PATH` goes on from it (docs/benchmark.md, "Side by side with Stable-Baselines3").
Needs the `sb3` extra: `pip install -e ".[sb3]"`.
"""

import cleanrl_q_utils.quiet_start  # noqa: F401  (first: a signal while the libraries load exits quietly)

from dataclasses import dataclass, replace
from typing import Optional

import gymnasium as gym
import torch
import torch.nn as nn

from cleanrl_q_utils import command_line, episode_scores, minatar, training_run
from cleanrl_q_utils.flag_checks import check_flag_ranges, check_wandb_login
from cleanrl_q_utils.flag_errors import PLAIN_NAME_RULE, flag_error, is_plain_name

try:
    from sb3_contrib import QRDQN
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
except ImportError as error:
    raise SystemExit(f'error: {error.name} is missing; install the sb3 extra: pip install -e ".[sb3]"')

# The layout of checkpoint.pt, which a resume checks; 2: training_run.Run's header, the state `checkpoint_state` lists
CHECKPOINT_FORMAT = 2
# The evaluation environment is seeded --seed + EVAL_SEED_OFFSET, the offset the scripts use: past the seed of this
# run's training environment and of every other run's.
EVAL_SEED_OFFSET = 1000


@dataclass
class Args:
    exp_name: Optional[str] = None
    """the name of this experiment (default: sb3_<algo>, the name benchmark/report.py draws SB3's runs under)"""
    seed: int = 1
    """seed of the agent and of the environment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = False
    """if toggled, SB3's networks train on cuda when available (by default on the CPU, with one thread)"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "cleanrl-q"
    """the wandb's project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    eval_episodes: int = 10
    """the number of greedy episodes played after training, on a fresh environment (0: none)"""

    env_id: str = "CartPole-v1"
    """the id of the environment: CartPole-v1, Acrobot-v1 or a MinAtar game (MinAtar/Breakout-v0, ...)"""
    total_timesteps: Optional[int] = None
    """the total number of agent steps (default: RL Zoo's n_timesteps for the algorithm and env)"""
    algo: Optional[str] = None
    """dqn (Stable-Baselines3's DQN) or qrdqn (sb3-contrib's QR-DQN); required"""
    checkpoint_every: int = 250_000
    """write a resumable checkpoint every this many agent steps and at the end (0: only when a signal stops the run)"""
    resume: Optional[str] = None
    """continue the run saved in this checkpoint, in the same run directory (and W&B run)"""
    resume_fresh_envs: bool = False
    """with --resume: start new games; a resumed SB3 run always does, given or not (SB3 cannot replay its games)"""


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


# What a checkpoint holds of SB3's model besides its networks, optimizer and the random generators: its progress through
# the run (steps, the target-copy clock _n_calls, updates, the exploration schedule's) and the replay's arrays.
COUNTERS = ("num_timesteps", "_n_calls", "_n_updates", "_episode_num", "_current_progress_remaining", "exploration_rate")
REPLAY_ARRAYS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")


def run_args(args: Args, resumed: bool) -> Args:
    """The flags the run goes with: a new run gets RL Zoo's budget and the name sb3_<algo> where not given; a resumed
    one starts new games (SB3 can neither save nor replay its environment's). Stops in one line on an algorithm or an
    env this script has no hyperparameters for."""
    if args.algo not in ALGOS:
        flag_error("algo", args.algo, f"one of {', '.join(ALGOS)} (required)")
    env_ids = sorted({env_id for algo, env_id in HYPERPARAMS if algo == args.algo})
    if args.env_id not in env_ids:
        flag_error("env_id", args.env_id, f"one of {', '.join(env_ids)}")
    if resumed:
        return replace(args, resume_fresh_envs=True)
    budget = HYPERPARAMS[(args.algo, args.env_id)]["n_timesteps"]
    return replace(
        args,
        exp_name=f"sb3_{args.algo}" if args.exp_name is None else args.exp_name,
        total_timesteps=budget if args.total_timesteps is None else args.total_timesteps,
    )


def validate_args(args: Args) -> None:
    """The checks of this project's scripts on the flags this tool shares with them, before anything is built."""
    check_flag_ranges(vars(args))
    if not is_plain_name(args.exp_name, 100):
        flag_error("exp_name", args.exp_name, f"must be a plain name: {PLAIN_NAME_RULE}, at most 100 bytes")
    if args.track:
        check_wandb_login()


def checkpoint_state(model, returns: list[float]) -> dict:
    """All a resume needs of SB3's model, as plain values (state dicts, arrays, numbers) for `Run.save`: taken where SB3
    ends a collection, before the gradient steps on it."""
    buffer = model.replay_buffer
    replay = {**{name: getattr(buffer, name) for name in REPLAY_ARRAYS}, "pos": buffer.pos, "full": buffer.full}
    return dict(
        policy=model.policy.state_dict(),
        optimizer=model.policy.optimizer.state_dict(),
        counters={name: getattr(model, name) for name in COUNTERS},
        replay=replay,
        returns=returns,
        action_space_rng=model.action_space.np_random.bit_generator.state,
    )


def load_state(model, saved: dict) -> None:
    """Puts a checkpoint's state (`checkpoint_state`, as saved) into a new `model`: networks, optimizer, counters, replay
    and the generator of its random actions."""
    model.policy.load_state_dict(saved["policy"])
    model.policy.optimizer.load_state_dict(saved["optimizer"])
    for name in COUNTERS:
        setattr(model, name, saved["counters"][name])
    buffer, replay = model.replay_buffer, saved["replay"]
    for name in REPLAY_ARRAYS:
        getattr(buffer, name)[...] = replay[name]
    buffer.pos, buffer.full = int(replay["pos"]), bool(replay["full"])
    model.action_space.np_random.bit_generator.state = saved["action_space_rng"]


def train_on_last_collection(model) -> None:
    """The gradient steps that SB3 takes after a collection, which the stopped run took after its checkpoint: a resume
    takes them first, with the random generators restored, and its networks and optimizer are then those of the
    stopped run, bit for bit."""
    if model.num_timesteps > model.learning_starts and model.gradient_steps != 0:
        steps = model.gradient_steps if model.gradient_steps > 0 else model.train_freq.frequency
        model.train(batch_size=model.batch_size, gradient_steps=steps)


class EpisodeLogger(BaseCallback):
    """Logs each finished training episode (Monitor's `info["episode"]`) at the agent step where it ended, and the
    progress line. SB3 collects `train_freq` steps at a time, so a run can end up to `train_freq - 1` steps after
    `total_timesteps` (CartPole: 50,176 instead of 50,000).

    At the end of each collection it asks the run whether a checkpoint is due (every `--checkpoint-every` agent steps,
    at the end, or when a signal asked the run to stop) and writes it: the steps are in the replay, the gradient steps
    on them not yet taken (a resume takes them first). After a stop's checkpoint, the next step ends the collection and
    the training, before that step is logged or stored."""

    def __init__(self, run: training_run.Run, total_timesteps: int, returns: list[float]):
        super().__init__()
        self.run, self.total, self.returns = run, total_timesteps, returns

    def _on_training_start(self) -> None:
        self.progress = episode_scores.Progress(self.total, self.num_timesteps, self.model.learning_starts)
        self.collection_start = self.num_timesteps

    def _on_step(self) -> bool:
        if self.run.stopped:
            return False
        step = self.num_timesteps  # already counts the step just taken
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(float(info["episode"]["r"]))
                self.run.writer.add_scalar("charts/episodic_return", info["episode"]["r"], step)
                self.run.writer.add_scalar("charts/episodic_length", info["episode"]["l"], step)
                self.run.writer.add_scalar("charts/SPS", self.progress.sps(step), step)
        self.progress.print(step, self.returns[-100:])
        return True

    def _on_rollout_end(self) -> None:
        step, steps = self.num_timesteps, self.num_timesteps - self.collection_start
        if self.run.checkpoint_due(step, steps, last=step >= self.total):
            self.run.save(step, checkpoint_state(self.model, self.returns), learned=("policy", "optimizer"))
        self.collection_start = step

    def _on_training_end(self) -> None:
        if not self.run.stopped:
            self.progress.print(self.num_timesteps, self.returns[-100:], force=True)


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


def sb3_kwargs(args: Args) -> dict:
    """The keyword arguments of the SB3 class for this algorithm and env (its HYPERPARAMS entry but the budget)."""
    return {key: value for key, value in HYPERPARAMS[(args.algo, args.env_id)].items() if key != "n_timesteps"}


def make_model(args: Args, device: torch.device):
    """The SB3 agent of a run, on its training environment, seeded with the run's seed."""
    env = Monitor(make_env(args.env_id))  # Monitor sums the raw rewards of each episode into info["episode"]
    model = ALGOS[args.algo]("MlpPolicy", env, seed=args.seed, device=device, verbose=0, **sb3_kwargs(args))
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's own logger would leave an empty /tmp/SB3-* folder
    return model


def main(args: Args) -> str:
    """Trains one agent, or with --resume goes on with a stopped one; returns its run directory. A run stopped by a
    signal writes its checkpoint, says how to resume, and exits with status 128 + the signal's number."""
    args, checkpoint = command_line.resume(args, __file__, CHECKPOINT_FORMAT)
    args = run_args(args, resumed=checkpoint is not None)
    validate_args(args)
    # cpu_threads=1: these networks (two layers of 256, batches of 32-128) run fastest on one thread, and two runs side
    # by side on a 2-core machine would otherwise fight over the cores. The run's signal handlers are taken before its
    # folder exists: a signal while it starts stops it at its first collection, with a checkpoint.
    with training_run.Run(args, checkpoint, __file__, CHECKPOINT_FORMAT, cpu_threads=1) as run:
        if checkpoint is None:  # beside the run's flags: the SB3 class's own, which the flags choose
            rows = "\n".join(f"|{key}|{value}|" for key, value in sb3_kwargs(args).items())
            run.writer.add_text("sb3_hyperparameters", "|param|value|\n|-|-|\n" + rows)
        model = make_model(args, run.device)
        try:
            returns = []
            if checkpoint is not None:
                with run.restoring() as saved:
                    load_state(model, saved)
                    returns = list(saved["returns"])
                # The game in progress at the stop is lost: the resumed run starts a new one, seeded seed + its step.
                model.env.seed(run.env_seed)  # used by the reset that learn() makes
                train_on_last_collection(model)
            # learn() counts its total from the restored step on: the exploration schedule runs over the whole run.
            model.learn(
                total_timesteps=args.total_timesteps - model.num_timesteps,
                callback=EpisodeLogger(run, args.total_timesteps, returns),
                reset_num_timesteps=checkpoint is None,
            )
            if args.eval_episodes and not run.stopped:
                run.log_evaluation(
                    run.dir, evaluate(model, args.env_id, args.eval_episodes, seed=args.seed + EVAL_SEED_OFFSET)
                )
            run.finish(returns)
        finally:
            model.env.close()
    return run.dir


if __name__ == "__main__":
    main(command_line.parse(Args))
