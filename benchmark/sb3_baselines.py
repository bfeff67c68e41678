"""Stable-Baselines3's DQN and sb3-contrib's QR-DQN with RL Zoo's tuned hyperparameters, logged like this project's runs.

    python benchmark/sb3_baselines.py --algo dqn --env-id CartPole-v1 --seed 1 --no-track

Every training episode's true return (read from the Monitor wrapper: unclipped, time-outs included) is logged to
TensorBoard as `charts/episodic_return` and `charts/episodic_length` at the agent step where the episode ended, with
`charts/SPS`, in `{runs_dir}/{env_id}__sb3_{algo}__{seed}__{unix time}`: benchmark/report.py reads these runs beside
ours. After training, `--eval-episodes` greedy episodes on a fresh environment are logged as `eval/episodic_return`.
A checkpoint is written every `--checkpoint-every` agent steps and when a signal stops the run; `--resume PATH` goes
on from it (docs/benchmark.md, "Side by side with Stable-Baselines3").
Needs the `sb3` extra: `pip install -e ".[sb3]"`.
"""

import cleanrl_q_utils.quiet_start  # noqa: F401  (first: a signal while the libraries load exits quietly)

import argparse
import os
import shlex
import shutil
import time

import gymnasium as gym
import torch
import torch.nn as nn
from torch.utils.tensorboard import SummaryWriter

from cleanrl_q_utils import checkpoint_files, minatar
from cleanrl_q_utils.flag_checks import check_flag_ranges, check_wandb_login
from cleanrl_q_utils.flag_errors import flag_error, is_plain_name
from cleanrl_q_utils.run_folder import check_newer_checkpoint, lock_run_dir, make_run_dir
from cleanrl_q_utils.stop_signals import StopSignals

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

# A checkpoint holds the networks, the optimizer, the replay, SB3's step counters and the random generators, as tensors
# and plain values only: it loads with `torch.load(weights_only=True)` and never runs code (SB3's own `save` and
# `save_replay_buffer` pickle Python objects, which a crafted file could use to run code on load).
CHECKPOINT_FORMAT = 1
CHANGEABLE_ON_RESUME = ("checkpoint_every", "eval_episodes", "track", "wandb_project_name", "wandb_entity")
# SB3's progress through a run: its steps, its target-copy clock (_n_calls), its updates, and the exploration schedule's.
COUNTERS = ("num_timesteps", "_n_calls", "_n_updates", "_episode_num", "_current_progress_remaining", "exploration_rate")
REPLAY_ARRAYS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sb3_baselines.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", choices=sorted(ALGOS), help="SB3's DQN or sb3-contrib's QR-DQN (required)")
    parser.add_argument("--env-id", choices=sorted({env_id for _, env_id in HYPERPARAMS}), default="CartPole-v1")
    parser.add_argument("--seed", type=int, default=1, help="seed of the agent and of the environment")
    parser.add_argument("--total-timesteps", type=int, default=None, help="agent steps (default: RL Zoo's n_timesteps)")
    parser.add_argument("--eval-episodes", type=int, default=10, help="greedy episodes after training (0: none)")
    parser.add_argument("--runs-dir", default="runs", help="where the run directory is created")
    parser.add_argument("--track", action=argparse.BooleanOptionalAction, default=False, help="sync the logs to W&B")
    parser.add_argument("--wandb-project-name", default="cleanrl-q")
    parser.add_argument("--wandb-entity", default=None)
    parser.add_argument(
        "--checkpoint-every", type=int, default=250_000, help="agent steps between checkpoints (0: only on a stop)"
    )
    parser.add_argument("--resume", default=None, help="a checkpoint.pt of this script: the run goes on in its folder")
    args = parser.parse_args(argv)
    if args.resume is not None:
        args = resumed_args(parser, args)
    elif args.algo is None:
        parser.error("the following arguments are required: --algo")
    elif args.total_timesteps is None:
        args.total_timesteps = int(HYPERPARAMS[(args.algo, args.env_id)]["n_timesteps"])
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """The checks of this project's scripts, on the flags this tool shares with them, before anything is built."""
    check_flag_ranges({name: getattr(args, name) for name in ("seed", "total_timesteps", "eval_episodes", "checkpoint_every")})
    if os.path.exists(args.runs_dir) and not os.path.isdir(args.runs_dir):
        flag_error("runs_dir", args.runs_dir, "not a folder")
    if args.track:
        check_wandb_login()


def resumed_args(parser: argparse.ArgumentParser, given: argparse.Namespace) -> argparse.Namespace:
    """The flags of the run that `given.resume` continues: its checkpoint's, but for those a resume may change
    (CHANGEABLE_ON_RESUME); another flag given with a value other than the run's stops in one line. The checkpoint
    itself is kept in `args.checkpoint`."""
    if not os.path.isfile(given.resume):
        flag_error("resume", given.resume, "not a file" if os.path.exists(given.resume) else "no such file")
    checkpoint = checkpoint_files.read_checkpoint(given.resume)
    try:
        if checkpoint["script"] != "sb3_baselines.py" or checkpoint["format"] != CHECKPOINT_FORMAT:
            raise ValueError(f"written by {checkpoint['script']}, format {checkpoint['format']}")
        if checkpoint_files.content_digest({k: v for k, v in checkpoint.items() if k != "digest"}) != checkpoint["digest"]:
            raise ValueError("its contents do not match their checksum (a damaged file)")
        if not is_plain_name(checkpoint["run_name"]):
            raise ValueError(f"its run name {checkpoint['run_name']!r} is not a folder name")
        saved = checkpoint["args"]
        if (saved["algo"], saved["env_id"]) not in HYPERPARAMS:
            raise ValueError(f"an algorithm and env this script does not have: {saved['algo']}, {saved['env_id']}")
    except (KeyError, TypeError, ValueError) as error:
        flag_error("resume", given.resume, f"not a checkpoint of this script ({type(error).__name__}: {error})")
    args = argparse.Namespace(**saved, resume=given.resume, checkpoint=checkpoint)
    for name, value in vars(given).items():
        if name == "resume" or value == parser.get_default(name) or value == saved[name]:
            continue
        if name not in CHANGEABLE_ON_RESUME:
            flag_error(name, value, f"cannot change on resume (the run has {saved[name]})")
        setattr(args, name, value)
    return args


class EpisodeLogger(BaseCallback):
    """Logs each finished training episode (Monitor's `info["episode"]`) at the agent step where it ended, and a
    progress line at most every 10 s. SB3 collects `train_freq` steps at a time, so a run can end up to
    `train_freq - 1` steps after `total_timesteps` (CartPole: 50,176 instead of 50,000).

    It also writes the checkpoints: at the end of a collection (the steps stored in the replay, the gradient steps
    on them not yet taken; a resume takes them first), every `--checkpoint-every` agent steps and when a signal
    asks the run to stop, which then ends at the next step, before that step is logged or stored."""

    def __init__(self, writer, args: argparse.Namespace, run_name: str, run_dir: str, returns: list, signals: StopSignals):
        super().__init__()
        self.writer, self.args, self.run_name, self.total = writer, args, run_name, args.total_timesteps
        self.returns: list[float] = returns
        self.checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
        self.last_checkpoint = args.resume
        self.signals, signals.last_checkpoint = signals, lambda: self.last_checkpoint
        self.stopped = False

    def _on_training_start(self) -> None:
        self.start_time = self.last_print = time.time()
        self.start_step = self.num_timesteps
        every = self.args.checkpoint_every
        self.next_checkpoint = (self.num_timesteps // every + 1) * every if every else None

    def _on_step(self) -> bool:
        if self.stopped:
            return False
        step = self.num_timesteps  # already counts the step just taken
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(float(info["episode"]["r"]))
                self.writer.add_scalar("charts/episodic_return", info["episode"]["r"], step)
                self.writer.add_scalar("charts/episodic_length", info["episode"]["l"], step)
                self.writer.add_scalar("charts/SPS", self.steps_per_second(), step)
        if time.time() - self.last_print > 10:
            self.print_progress()
        return True

    def _on_rollout_end(self) -> None:
        due = self.next_checkpoint is not None and self.num_timesteps >= self.next_checkpoint
        if self.signals.stop_requested or due and self.num_timesteps < self.total:
            self.write_checkpoint()
            self.stopped = self.signals.stop_requested
        if due:
            every = self.args.checkpoint_every
            self.next_checkpoint = (self.num_timesteps // every + 1) * every

    def _on_training_end(self) -> None:
        self.signals.training_done = not self.stopped
        self.print_progress()

    def write_checkpoint(self) -> None:
        model, buffer = self.model, self.model.replay_buffer
        args = {key: value for key, value in vars(self.args).items() if key not in ("resume", "checkpoint")}
        checkpoint = {
            "script": "sb3_baselines.py",
            "format": CHECKPOINT_FORMAT,
            "run_name": self.run_name,
            "global_step": model.num_timesteps,
            "args": args,
            "policy": model.policy.state_dict(),
            "optimizer": model.policy.optimizer.state_dict(),
            "counters": {name: getattr(model, name) for name in COUNTERS},
            "replay": {
                **{name: getattr(buffer, name) for name in REPLAY_ARRAYS},
                **{"pos": buffer.pos, "full": buffer.full},
            },
            "returns": self.returns[-100:],
            "rng": checkpoint_files.rng_states(),
            "action_space_rng": model.action_space.np_random.bit_generator.state,
        }
        self.writer.flush()  # everything logged up to this step is on disk before the checkpoint says it is

        def note_writing(tmp):
            self.signals.writing = tmp

        checkpoint_files.write_checkpoint(self.checkpoint_path, checkpoint, note_writing)
        self.last_checkpoint, self.checkpoint_step = self.checkpoint_path, model.num_timesteps
        print(f"checkpoint at step {model.num_timesteps}: {self.checkpoint_path}", flush=True)

    def steps_per_second(self) -> int:
        return int((self.num_timesteps - self.start_step) / max(time.time() - self.start_time, 1e-9))

    def print_progress(self) -> None:
        self.last_print = time.time()
        recent = self.returns[-100:]
        mean = f"{sum(recent) / len(recent):.1f}" if recent else "-"
        print(f"step {self.num_timesteps:>7}/{self.total} | SPS {self.steps_per_second():>5} | return (last 100) {mean}")


def new_run_name(runs_dir: str, base: str) -> str:
    """`base`, or `base_2`, `base_3`, ... if a run started in the same second has it: each run has a folder of its own."""
    for name in [base, *(f"{base}_{i}" for i in range(2, 1000))]:
        try:
            make_run_dir(os.path.join(runs_dir, name))  # a folder it cannot create: one line
            return name
        except FileExistsError:
            continue
    raise SystemExit(f"error: could not create a run folder {runs_dir}/{base}_*")


def restore(model, checkpoint: dict, seed: int) -> None:
    """Puts a checkpoint's networks, optimizer, replay, counters and random generators into a new `model`, then takes
    the gradient steps the stopped run had not yet taken on its last collection. The game in progress at the stop is
    lost: the resumed run starts a new one, from a seed of its own."""
    model.policy.load_state_dict(checkpoint["policy"])
    model.policy.optimizer.load_state_dict(checkpoint["optimizer"])
    for name, value in checkpoint["counters"].items():
        setattr(model, name, value)
    buffer, replay = model.replay_buffer, checkpoint["replay"]
    for name in REPLAY_ARRAYS:
        getattr(buffer, name)[...] = replay[name]
    buffer.pos, buffer.full = int(replay["pos"]), bool(replay["full"])
    model.env.seed(seed + model.num_timesteps)  # used by the reset that learn() makes
    checkpoint_files.set_rng_states(checkpoint["rng"])
    model.action_space.np_random.bit_generator.state = checkpoint["action_space_rng"]
    if model.num_timesteps > model.learning_starts and model.gradient_steps != 0:
        steps = model.gradient_steps if model.gradient_steps > 0 else model.train_freq.frequency
        model.train(batch_size=model.batch_size, gradient_steps=steps)


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


def sb3_kwargs(args: argparse.Namespace) -> dict:
    """The keyword arguments of the SB3 class for this algorithm and env (its HYPERPARAMS entry but the budget)."""
    return {key: value for key, value in HYPERPARAMS[(args.algo, args.env_id)].items() if key != "n_timesteps"}


def make_model(args: argparse.Namespace):
    """The SB3 agent of a run, on its training environment, seeded with the run's seed."""
    kwargs = sb3_kwargs(args)
    env = Monitor(make_env(args.env_id))  # Monitor sums the raw rewards of each episode into info["episode"]
    model = ALGOS[args.algo]("MlpPolicy", env, seed=args.seed, device="cpu", verbose=0, **kwargs)
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's own logger would leave an empty /tmp/SB3-* folder
    return model


def main(args: argparse.Namespace) -> str:
    """Trains one agent, or with --resume goes on with a stopped one; returns its run directory. A run stopped by a
    signal writes its checkpoint, says how to resume, and exits with status 128 + the signal's number."""
    # These networks (two layers of 256, batches of 64-128) run fastest on one thread: more only add synchronization to
    # every call, and two runs side by side on a 2-core machine would fight over the cores. Ours also use one thread.
    torch.set_num_threads(1)
    exp_name = f"sb3_{args.algo}"
    checkpoint = getattr(args, "checkpoint", None)
    # Taken before the run folder exists, as this project's runs do: a signal while the run starts stops it at its
    # first collection, with a checkpoint; a second Ctrl-C exits at once, and a new run's folder is removed.
    signals = StopSignals(lambda: args.resume)
    run_dir = lock = writer = model = callback = None
    try:
        if checkpoint is None:
            base = f"{args.env_id.replace('/', '-')}__{exp_name}__{args.seed}__{int(time.time())}"
            run_name = new_run_name(args.runs_dir, base)
            run_dir = os.path.join(args.runs_dir, run_name)
        else:  # the checkpoint's own folder if it is the run's, else runs_dir/<run name>: never beside another run's files
            run_name, folder = checkpoint["run_name"], os.path.dirname(args.resume) or "."
            own_folder = os.path.basename(os.path.realpath(folder)) == run_name
            run_dir = folder if own_folder else os.path.join(args.runs_dir, run_name)
            make_run_dir(run_dir, exist_ok=True)
        lock = lock_run_dir(run_dir)
        if checkpoint is not None:
            check_newer_checkpoint(os.path.join(run_dir, "checkpoint.pt"), args.resume, checkpoint)
            print(f"sb3_baselines.py: resuming {run_name} at step {checkpoint['global_step']} in {run_dir}")
        if args.track:
            import wandb

            wandb.init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                name=run_name,
                id=run_name,  # a resume goes on with the same W&B run
                resume="allow",
                sync_tensorboard=True,
                config={key: value for key, value in vars(args).items() if key != "checkpoint"},
                save_code=True,
            )
        # On resume, what the stopped run logged after its checkpoint is dropped, so that no step is logged twice.
        writer = SummaryWriter(run_dir, purge_step=checkpoint["global_step"] + 1 if checkpoint is not None else None)
        if checkpoint is None:
            rows = {**vars(args), "exp_name": exp_name, **sb3_kwargs(args)}
            writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in rows.items()))

        model = make_model(args)
        if checkpoint is not None:
            restore(model, checkpoint, args.seed)
        returns = list(checkpoint["returns"]) if checkpoint else []
        callback = EpisodeLogger(writer, args, run_name, run_dir, returns, signals)
        # learn() counts its total from the restored step on: the exploration schedule runs over the whole run.
        model.learn(
            total_timesteps=args.total_timesteps - model.num_timesteps,
            callback=callback,
            reset_num_timesteps=checkpoint is None,
        )
        if callback.stopped:
            # Quoted: the folders above the run may hold spaces or characters a shell reads.
            command = shlex.join(["python", os.path.abspath(__file__), "--resume", os.path.abspath(callback.checkpoint_path)])
            print(f"stopped at step {callback.checkpoint_step} with a checkpoint; continue the run with:\n  {command}")
            raise SystemExit(128 + signals.signum)
        if args.eval_episodes:
            scores = evaluate(model, args.env_id, args.eval_episodes, seed=args.seed + 1)
            for episode, score in enumerate(scores):
                writer.add_scalar("eval/episodic_return", score, episode)
            print(f"greedy evaluation over {len(scores)} episodes: {sum(scores) / len(scores):.1f}")
    except BaseException:
        # A new run stopped or failed before its first step leaves no folder behind, as this project's runs do.
        left_empty = checkpoint is None and run_dir is not None and (callback is None or callback.num_timesteps == 0)
        raise
    else:
        left_empty = False
    finally:
        signals.restore()
        if model is not None:
            model.env.close()
        if writer is not None:
            writer.close()
        if lock is not None:
            os.close(lock)
        if args.track and writer is not None:
            import wandb

            wandb.finish()
        if left_empty:
            shutil.rmtree(run_dir, ignore_errors=True)
    return run_dir


if __name__ == "__main__":
    main(parse_args())
