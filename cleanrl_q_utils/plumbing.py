"""Run plumbing shared by the scripts in cleanrl/: nothing in this file is reinforcement learning.

A script does `from cleanrl_q_utils import plumbing` for what every script does the same way and no reader of the
algorithm needs to see: flag errors, seeding and device, the run directory with TensorBoard (and W&B), the progress
line, true episode scores, checkpoints with signal handling and the NaN stop, and the video environment. What a run
saves, and how its loop works, stays in the script. The life of a run, as a script's `main` writes it:

    if args.eval_only:  # --eval-only --model-path: rebuild a saved agent and evaluate it, no training
        return plumbing.evaluate_only(args, __file__, validate_args, evaluate)
    args, checkpoint = plumbing.resume(args, __file__, CHECKPOINT_FORMAT)  # --resume: the checkpoint and its flags
    validate_args(args)  # the script's own checks, before anything is built
    with plumbing.Run(args, checkpoint, __file__, CHECKPOINT_FORMAT) as run:  # start-up block, logs, device, signals
        ...build envs, networks, buffers on run.device...
        def checkpoint_state(): return {...}  # everything a resumed run needs, listed once
        saved = run.restore(checkpoint_state()) if checkpoint else None
        progress = run.progress(global_step)
        for ...:
            ...
            progress.print(global_step, stats.recent)
            if run.checkpoint_or_stop(global_step, steps_this_iteration, is_last, checkpoint_state):
                break
        if args.save_model and not run.stopped:
            run.save_and_evaluate(q_network, evaluate, run.device)
        run.finish(stats.scores)  # the summary line
"""

import contextlib
import hashlib
import importlib.util
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections import deque
from dataclasses import fields, replace
from typing import Callable, NoReturn, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.utils.tensorboard import SummaryWriter

# How a run is carried out, not what it computes: a resumed run keeps the checkpoint's values unless the command line
# gives others. RECOVERY_FLAGS may also be changed on resume (with a note), e.g. a smaller step after a NaN stop;
# every other flag comes from the checkpoint.
OPERATIONAL_FLAGS = ("checkpoint_every", "checkpoint_replay", "track", "cuda")
RECOVERY_FLAGS = ("learning_rate", "max_grad_norm")
# Ranges of the flags that several scripts share, checked by `check_common_flags` for every field a script has.
# NaN fails every test (comparisons with NaN are false).
FLAG_RANGES = {
    **dict.fromkeys(
        ("learning_rate", "adam_eps", "kappa", "prioritized_replay_eps", "replay_ratio"), (lambda v: 0 < v < math.inf, "> 0")
    ),
    "max_grad_norm": (lambda v: v > 0, "> 0 (inf: no clipping)"),
    **dict.fromkeys(
        ("gamma", "q_lambda", "start_e", "end_e", "eval_epsilon", "priority_eta"), (lambda v: 0 <= v <= 1, "in [0, 1]")
    ),
    "exploration_fraction": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    **dict.fromkeys(
        (
            "prioritized_replay_alpha",
            "prioritized_replay_beta",
            "epsilon_alpha",
            "learning_starts",
            "burn_in",
            "checkpoint_every",
            "eval_episodes",
        ),
        (lambda v: 0 <= v < math.inf, ">= 0"),
    ),
    "seed": (lambda v: 0 <= v < 2**32, "in [0, 2^32)"),
}
# envpool builds gymnasium Box spaces from float64 bounds; gymnasium then warns on every classic-control run that it
# casts them to the float32 dtype the observations have, which is what we want.
warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
# The flags an --eval-only run takes from the command line; every other flag comes from the saved model file.
EVALUATION_FLAGS = ("eval_only", "model_path", "eval_episodes", "eval_epsilon", "capture_video", "seed", "cuda")
# Flags added after the first checkpoints were written: a checkpoint without them resumes with their defaults.
LATER_FLAGS = {"eval_only", "model_path", "resume_fresh_envs"}
# What --capture-video imports, by kind of environment (module, pip package).
VIDEO_MODULES = {
    "atari": [("moviepy", "moviepy"), ("ale_py", "ale-py"), ("cv2", "opencv-python")],
    "classic": [("moviepy", "moviepy"), ("pygame", "pygame")],
}
COUNT_FLAGS = (  # numbers of things: at least 1
    "total_timesteps num_envs num_steps num_minibatches update_epochs batch_size buffer_size seq_len n_step "
    "train_frequency target_network_frequency hidden_size lstm_size quantile_embedding_dim num_tau_samples "
    "num_tau_prime_samples num_quantile_samples log_interval max_episode_steps frame_stack"
).split()


def flag_error(flag: str, value, allowed: str) -> NoReturn:
    """Stops the run with one line that names the flag, its value and what is allowed."""
    raise SystemExit(f"error: --{flag.replace('_', '-')}={value}: {allowed}")


def check_flags(checks: list[tuple[str, object, bool, str]]) -> None:
    """`checks` holds (flag, value, ok, allowed) rows; the first row that is not ok stops the run."""
    for flag, value, ok, allowed in checks:
        if not ok:
            flag_error(flag, value, allowed)


def check_common_flags(args) -> None:
    """Range checks of every flag in FLAG_RANGES and COUNT_FLAGS that `args` has, before the script's own checks: a
    learning rate of 0 or NaN, a negative max grad norm (it would flip the gradient), an epsilon above 1 stop here."""
    for name, value in vars(args).items():
        if name in COUNT_FLAGS and not (isinstance(value, int) and value >= 1):
            flag_error(name, value, "must be a whole number >= 1")
        if name in FLAG_RANGES and not FLAG_RANGES[name][0](value):
            flag_error(name, value, f"must be {FLAG_RANGES[name][1]}")
    if "learning_starts" in vars(args) and args.total_timesteps <= args.learning_starts:
        flag_error("total_timesteps", args.total_timesteps, f"must exceed --learning-starts={args.learning_starts}")
    # Every action of the run is logged (a byte per environment step) so that a resume can replay it.
    check_memory(args.total_timesteps, "the action log", f"--total-timesteps={args.total_timesteps}")
    check_evaluation_flags(args)


def check_evaluation_flags(args) -> None:
    """--eval-only needs a model file; --capture-video needs its optional packages, checked now rather than after
    hours of training, and something to record (only evaluation episodes are recorded)."""
    if args.eval_only and args.model_path is None:
        flag_error("eval_only", True, "needs --model-path PATH (a model written by --save-model)")
    if args.model_path is not None and not args.eval_only:
        flag_error("model_path", args.model_path, "is only read with --eval-only")
    if args.eval_only and args.resume is not None:
        flag_error("resume", args.resume, "cannot be combined with --eval-only")
    if args.model_path is not None and not os.path.isfile(args.model_path):
        flag_error("model_path", args.model_path, "no such file")
    if args.capture_video:
        check_video_modules(args.env_id)
        if not (args.save_model or args.eval_only):
            print("warning: --capture-video records the evaluation episodes, which only --save-model or --eval-only play")


def check_video_modules(env_id: str) -> None:
    """One line naming every missing package of --capture-video and the install command."""
    needed = VIDEO_MODULES["atari" if env_id.endswith("-v5") else "classic"]
    missing = [package for module, package in needed if importlib.util.find_spec(module) is None]
    if missing:
        raise SystemExit(f'error: --capture-video needs {", ".join(missing)}, not installed: pip install -e ".[video]"')


def check_env_id(env_id: str, atari: Optional[bool] = None):
    """The envpool spec of `env_id`, after checking that envpool knows it, that its actions are discrete and, with
    `atari` given, that it is (True) or is not (False) an Atari game of image observations."""
    import envpool

    if env_id not in envpool.list_all_envs():
        flag_error("env_id", env_id, "not an envpool environment id (e.g. CartPole-v1, Breakout-v5)")
    spec = envpool.make_spec(env_id)
    if not isinstance(spec.action_space, gym.spaces.Discrete):
        flag_error("env_id", env_id, f"has a {type(spec.action_space).__name__} action space; discrete actions needed")
    if atari is not None and (len(spec.observation_space.shape) == 3) != atari:
        kind = "an Atari game (e.g. Breakout-v5)" if atari else "vector observations (e.g. CartPole-v1)"
        flag_error("env_id", env_id, f"this script needs {kind}; its docs page names the script for the other kind")
    return spec


def available_memory_bytes() -> int:
    """RAM the kernel says can be allocated without swapping (MemAvailable), else the free pages."""
    try:
        with open("/proc/meminfo") as meminfo:
            return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_memory(needed_bytes: int, what: str, flags: str) -> None:
    """Stops before allocating when `what` (e.g. "the replay") would not fit in the available RAM; `flags` names the
    flags and values that set its size, e.g. "--buffer-size=1000000"."""
    available = available_memory_bytes()
    if needed_bytes > available:
        raise SystemExit(
            f"error: {flags}: {what} needs about {needed_bytes / 1e9:,.1f} GB but {available / 1e9:,.1f} GB are "
            "available; lower it"
        )


def seed_everything(seed: int, torch_deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = torch_deterministic


def pick_device(cuda: bool, cpu_threads: Optional[int] = None) -> torch.device:
    """CUDA when asked for and present, else the CPU with `cpu_threads` intra-op threads (None: torch's default).
    Small networks run faster on one thread: more threads only add synchronization to every call."""
    device = torch.device("cuda" if cuda and torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and cpu_threads is not None:
        torch.set_num_threads(cpu_threads)
    return device


def describe_device(device: torch.device, cuda: bool) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    why = "no CUDA device found" if cuda else "--no-cuda"
    return f"cpu, {torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''} ({why})"


def software_versions(script: str) -> dict:
    """The versions a result depends on, logged with the hyperparameters: torch, envpool, gymnasium, and the git commit
    of the scripts (with "+changes" when the working tree differs from it)."""
    import envpool

    def git(*command):
        try:
            done = subprocess.run(["git", *command], cwd=os.path.dirname(script), capture_output=True, text=True, timeout=5)
            return done.stdout.strip() if done.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            return None

    commit = git("rev-parse", "--short", "HEAD")
    if commit and git("status", "--porcelain", "--untracked-files=no"):
        commit += "+changes"
    return dict(torch=torch.__version__, envpool=envpool.__version__, gymnasium=gym.__version__, git=commit or "unknown")


def format_duration(seconds: float) -> str:
    """`3 days 08:35:58`, or `08:35:58` under a day."""
    seconds = int(max(seconds, 0))
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days} day{'s' if days > 1 else ''} {clock}" if days else clock


class EpisodeStats:
    """True game scores of vectorized envs: rewards summed over whole episodes (unclipped, time-outs included).
    envpool's reset step (the step after an episode end, which only resets) counts toward no episode."""

    def __init__(self, num_envs: int, window: int = 100):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.scores: list[float] = []  # every finished episode, in order
        self.recent = deque(maxlen=window)

    def update(self, reward, is_reset_step, episode_over, writer=None, global_step: int = 0) -> list[tuple[float, int]]:
        """Adds one vectorized step; logs and returns (score, length) of every episode that ended with it."""
        self.returns += np.where(is_reset_step, 0.0, reward)
        self.lengths += ~is_reset_step
        finished = [(float(self.returns[i]), int(self.lengths[i])) for i in np.flatnonzero(episode_over)]
        self.returns[episode_over], self.lengths[episode_over] = 0.0, 0
        for score, length in finished:
            self.scores.append(score)
            self.recent.append(score)
            if writer is not None:
                writer.add_scalar("charts/episodic_return", score, global_step)
                writer.add_scalar("charts/episodic_length", length, global_step)
        return finished

    def state_dict(self) -> dict:
        return {"returns": self.returns.copy(), "lengths": self.lengths.copy(), "scores": list(self.scores)}

    def load_state_dict(self, state: dict) -> None:
        self.returns[:], self.lengths[:], self.scores[:] = state["returns"], state["lengths"], state["scores"]
        self.recent.clear()
        self.recent.extend(self.scores[-self.recent.maxlen :])


class Progress:
    """The console line of a long run, at most every `interval` seconds: steps, percent done, SPS, recent return and
    time left. `slow_hint`, when given, is printed once with the first line if the run would take over a day."""

    def __init__(self, total_timesteps: int, start_step: int, interval: float = 10.0, slow_hint: Optional[str] = None):
        self.total, self.start_step, self.interval, self.slow_hint = total_timesteps, start_step, interval, slow_hint
        self.start_time = self.last_print = time.time()

    def sps(self, global_step: int) -> int:
        return int((global_step - self.start_step) / max(time.time() - self.start_time, 1e-9))

    def print(self, global_step: int, recent_scores, force: bool = False) -> None:
        if not force and time.time() - self.last_print < self.interval:
            return
        self.last_print = time.time()
        sps, mean = self.sps(global_step), np.mean(recent_scores) if len(recent_scores) else float("nan")
        left = (self.total - global_step) / max(sps, 1)
        print(
            f"step {global_step:>9}/{self.total} ({100 * global_step / self.total:5.1f}%) | SPS {sps:>6} | "
            f"return(100) {mean:8.2f} | ETA {format_duration(left)}"
        )
        if self.slow_hint and left > 86400:
            print(f"warning: at {sps} SPS this run takes {format_duration(left)} more; {self.slow_hint}")
        self.slow_hint = None


def resume(given, script: str, checkpoint_format: int):
    """(args, checkpoint) of a run: `given` unchanged and no checkpoint, or with --resume the checkpoint and its flags.
    OPERATIONAL_FLAGS keep the checkpoint's values unless given on the command line, RECOVERY_FLAGS may be changed
    (with a note), and other given flags that differ from the checkpoint's are named and ignored. `script` is the
    script's path (`__file__`); a checkpoint of another script or format, or whose contents changed, stops the run."""
    if given.resume is None:
        return given, None
    if not os.path.isfile(given.resume):
        flag_error("resume", given.resume, "no such file")
    try:  # not weights_only: a checkpoint holds numpy arrays and RNG states
        checkpoint = torch.load(given.resume, map_location="cpu", weights_only=False)
        names, script = {field.name for field in fields(given)}, os.path.basename(script)
        if not isinstance(checkpoint, dict) or "script" not in checkpoint:
            raise ValueError(f"an older format, expected format {checkpoint_format}")
        if checkpoint["script"] != script:
            raise ValueError(f"written by {checkpoint['script']}, not {script}")
        if checkpoint["format"] != checkpoint_format or set(checkpoint["args"]) - LATER_FLAGS != names - LATER_FLAGS:
            raise ValueError(f"format {checkpoint['format']}, expected {checkpoint_format}")
        if content_digest({k: v for k, v in checkpoint.items() if k != "digest"}) != checkpoint["digest"]:
            raise ValueError("its contents do not match their checksum (a damaged file)")
    except Exception as error:
        flag_error("resume", given.resume, f"not a readable checkpoint ({type(error).__name__}: {error})")
    saved = {**{name: getattr(type(given)(), name) for name in LATER_FLAGS & names}, **checkpoint["args"]}
    # How to resume is said anew each time: --resume, and --resume-fresh-envs (fresh games, or the exact replay).
    defaults, changes = type(given)(), {"resume": given.resume, "resume_fresh_envs": given.resume_fresh_envs}
    for name in sorted(names - {"resume", "resume_fresh_envs"}):
        value = getattr(given, name)
        if value == saved[name] or value == getattr(defaults, name):
            continue
        if name in OPERATIONAL_FLAGS + RECOVERY_FLAGS:
            changes[name] = value
            if name in RECOVERY_FLAGS:
                print(f"resume: --{name.replace('_', '-')} changes from {saved[name]} to {value}")
        else:
            print(f"resume: ignoring --{name.replace('_', '-')}={value}; the checkpoint's value is {saved[name]}")
    return replace(type(given)(**saved), **changes), checkpoint


def content_digest(value, hasher=None) -> str:
    """A BLAKE2 checksum of every tensor, array and number in `value`, in a fixed order. Stored in each checkpoint and
    checked on resume: a byte flipped inside a saved tensor is caught, which torch.load alone would not notice."""
    top = hasher is None
    hasher = hashlib.blake2b(digest_size=16) if top else hasher
    if isinstance(value, dict):
        for key in sorted(value, key=repr):
            hasher.update(repr(key).encode())
            content_digest(value[key], hasher)
    elif isinstance(value, (list, tuple)):
        for item in value:
            content_digest(item, hasher)
    elif isinstance(value, (torch.Tensor, np.ndarray)) and value.dtype != object:
        array = value.detach().cpu().contiguous().numpy() if isinstance(value, torch.Tensor) else value
        data = memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        for start in range(0, len(data), 1 << 26):  # in pieces: a signal is answered between them
            hasher.update(data[start : start + (1 << 26)])
    else:
        hasher.update(repr(value).encode())
    return hasher.hexdigest() if top else ""


def state_of(value):
    """What a checkpoint stores of one entry of a script's checkpoint state."""
    if hasattr(value, "state_dict"):  # networks, optimizers, buffers, EpisodeStats
        return value.state_dict()
    if isinstance(value, np.random.Generator):
        return value.bit_generator.state
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return value.copy() if isinstance(value, np.ndarray) else value.detach().cpu().clone()
    return list(value) if isinstance(value, (list, deque)) else value


def load_into(value, saved) -> None:
    """Restores one entry of a script's checkpoint state in place; plain numbers are left to the script."""
    if hasattr(value, "load_state_dict"):
        value.load_state_dict(saved)
    elif isinstance(value, np.random.Generator):
        value.bit_generator.state = saved
    elif isinstance(value, np.ndarray):
        value[: len(saved)] = saved  # a log may be saved only up to the steps done
    elif isinstance(value, torch.Tensor):
        value.copy_(saved)
    elif isinstance(value, (list, deque)):
        value.clear()
        value.extend(saved)


def rng_states() -> dict:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def all_finite(value) -> bool:
    """False if a floating tensor or array anywhere in `value` holds NaN or inf."""
    if isinstance(value, dict):
        return all(all_finite(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return all(all_finite(item) for item in value)
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return bool(torch.isfinite(value).all())
    if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating):
        return bool(np.isfinite(value).all())
    return True


stop_signal = None  # the signal that stopped the last run before its end, if one did


def new_run_name(args) -> str:
    """A fresh run name, whose directory under runs/ this call creates: a run started in the same second with the same
    env, name and seed (a sweep) gets a suffix instead of sharing, and overwriting, the other's files."""
    base = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    for suffix in ["", *(f"_{i}" for i in range(2, 1000))]:
        with contextlib.suppress(FileExistsError):
            os.makedirs(f"runs/{base}{suffix}")
            return base + suffix
    raise SystemExit(f"error: could not create a run directory runs/{base}_*")


def cli(main, args_class) -> None:
    """A script's command line: parses the flags into `args_class` and runs `main`. A run stopped by SIGINT or SIGTERM
    (after writing its checkpoint) exits with 128 + the signal's number, so that shells and schedulers can tell it
    from a finished run."""
    import tyro

    main(tyro.cli(args_class))
    if stop_signal is not None:
        sys.exit(128 + stop_signal)


class Run:
    """One training run: name and directory, TensorBoard writer (synced to W&B with --track), the SIGINT/SIGTERM
    handlers, and its checkpoints. Use it as a context manager: leaving the block, however, restores the previous
    signal handlers and closes the logs (tests call `main` in-process, so handlers must not leak)."""

    def __init__(self, args, checkpoint: Optional[dict], script: str, checkpoint_format: int, cpu_threads=None):
        global stop_signal
        stop_signal = None
        self.args, self.checkpoint, self.format = args, checkpoint, checkpoint_format
        self.script = os.path.abspath(script)
        self.start_time, self.eval_scores = time.time(), None
        self.global_step = checkpoint["global_step"] if checkpoint else 0  # the last step checkpoint_or_stop saw
        # The step at which the current envs started their first games: 0, or that of the last --resume-fresh-envs.
        # They are seeded with seed + that step, so that the new games are not the run's first ones again.
        fresh = checkpoint is not None and args.resume_fresh_envs
        self.envs_start = self.global_step if fresh else checkpoint.get("envs_start", 0) if checkpoint else 0
        self.env_seed = args.seed + self.envs_start
        self.device = pick_device(args.cuda, cpu_threads)
        self.name = checkpoint["run_name"] if checkpoint else new_run_name(args)
        # A resumed run goes on in its checkpoint's directory, from wherever it is started.
        self.dir = os.path.dirname(os.path.abspath(args.resume)) if checkpoint else f"runs/{self.name}"
        self.last_checkpoint = args.resume
        self.checkpoint_path = f"{self.dir}/checkpoint.pt"
        self.wandb_id = checkpoint["wandb_id"] if checkpoint else None
        setting = {"device": describe_device(self.device, args.cuda), **software_versions(self.script)}
        self.print_start(setting)
        if args.track:
            import wandb

            run = dict(project=args.wandb_project_name, entity=args.wandb_entity, name=self.name, id=self.wandb_id)
            config = {**vars(args), **setting}
            wandb.init(**run, sync_tensorboard=True, config=config, save_code=True, resume="allow")
            self.wandb_id = wandb.run.id
        # Everything up to the checkpoint's step was logged before it was written; what the interrupted run logged
        # after it is dropped, so that the resumed run does not log those steps twice.
        self.writer = SummaryWriter(self.dir, purge_step=checkpoint["global_step"] + 1 if checkpoint else None)
        if checkpoint is None:
            rows = "\n".join(f"|{key}|{value}|" for key, value in {**vars(args), **setting}.items())
            self.writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + rows)
        self.stop_requested = self.stopped = self.replaying = False
        self.previous_handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        # Python runs a handler once for signals that arrive during one long C call (say, copying a large replay);
        # the wakeup pipe gets a byte for every signal, so two of them are never taken for one.
        self.wakeup, wakeup_write = os.pipe()
        os.set_blocking(self.wakeup, False)
        os.set_blocking(wakeup_write, False)
        self.previous_wakeup = signal.set_wakeup_fd(wakeup_write)

    def print_start(self, setting: dict) -> None:
        """The start-up block, printed before anything slow: what runs, where it logs, on what."""
        args, script = self.args, os.path.basename(self.script)
        if self.checkpoint:
            print(f"{script}: resuming {args.env_id}, seed {args.seed}, at step {self.checkpoint['global_step']}")
        else:
            print(f"{script}: {args.env_id}, seed {args.seed}, {args.total_timesteps} agent steps")
        print(f"  run directory: {self.dir}  (watch it: tensorboard --logdir {os.path.dirname(self.dir) or '.'})")
        versions = ", ".join(f"{name} {setting[name]}" for name in ("torch", "envpool", "gymnasium"))
        print(f"  device: {setting['device']} | {versions} | git {setting['git']}")
        if self.device.type == "cpu" and args.env_id.endswith("-v5"):
            print(
                f"warning: Atari on a CPU is slow (the first progress line, in 10 s, gives the time left); {self.slow_hint()}"
            )

    def slow_hint(self) -> str:
        """Where to go instead of a days-long Atari run on a CPU: the classic-control twin of the script."""
        name = os.path.basename(self.script)
        twin = name.replace("_atari_envpool_lstm", "").replace("_atari_envpool", "").replace("_atari", "")
        instead = f"cleanrl/{twin}" if twin != name else f"{name} --env-id CartPole-v1"
        return f"for a first run on a CPU, try `python {instead}` or a smaller --total-timesteps"

    def progress(self, start_step: int) -> Progress:
        """The progress line of this run; Atari on a CPU warns with the first line if the run would take over a day."""
        slow = self.device.type == "cpu" and self.args.env_id.endswith("-v5")
        return Progress(self.args.total_timesteps, start_step, slow_hint=self.slow_hint() if slow else None)

    def note_empty_replay(self, learning_resumes_at: int) -> None:
        """Says, on a resume without --checkpoint-replay, that the replay restarts empty and when learning resumes."""
        print(
            f"resume: the replay was not saved (--checkpoint-replay was off): it refills from empty, and learning "
            f"resumes at step {learning_resumes_at}"
        )

    def save_and_evaluate(self, network: nn.Module, evaluate: Callable, device: torch.device) -> list[float]:
        """--save-model at the end of training: writes the model file, then plays the evaluation episodes with it
        (recorded with --capture-video), logs their scores and prints their mean."""
        path = f"{self.dir}/{self.args.exp_name}.cleanrl_model"
        save_model(path, self.script, self.args, network)
        print(f"model saved to {path}")
        self.eval_scores = evaluate(path, self.args, device, self.name)  # videos, if recorded: videos/<run name>
        for episode, score in enumerate(self.eval_scores):
            self.writer.add_scalar("eval/episodic_return", score, episode)
        print(evaluation_line(path, self.eval_scores))
        return self.eval_scores

    def finish(self, scores: list[float]) -> None:
        """The last line of a run: how far it got, how long it took, its recent training return and evaluation."""
        done, global_step = "stopped at" if self.stopped else "finished", self.global_step
        recent = f"return(100) {np.mean(scores[-100:]):.2f} ({len(scores)} episodes)" if scores else "no episode ended"
        line = f"{done} step {global_step}/{self.args.total_timesteps} in {format_duration(time.time() - self.start_time)}"
        if self.eval_scores:
            recent += f" | evaluation {np.mean(self.eval_scores):.2f} over {len(self.eval_scores)} episodes"
        print(f"{line} | {recent} | {self.dir}")

    def _on_signal(self, signum, frame):
        self.signum, arrived = signum, 1
        with contextlib.suppress(BlockingIOError):
            arrived = len(os.read(self.wakeup, 64))
        if self.stop_requested or self.replaying or arrived > 1:  # a second signal, or nothing new to save yet: exit at once
            self.restore_handlers()
            print(f"exiting at once on {signal.Signals(signum).name}; last good checkpoint: {self.last_checkpoint or 'none'}")
            raise SystemExit(128 + signum)  # leaving `save`, this removes a partly written file
        self.stop_requested = True
        print("stopping after this step, with a checkpoint; a second signal exits at once")

    def restore_handlers(self) -> None:
        for sig, handler in self.previous_handlers.items():
            signal.signal(sig, handler)
        if self.wakeup is not None:
            os.close(signal.set_wakeup_fd(self.previous_wakeup))
            os.close(self.wakeup)
            self.wakeup = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.restore_handlers()
        self.writer.close()
        if self.args.track:
            import wandb

            wandb.finish()

    def fast_forward(self, envs, action_log: np.ndarray, obs: np.ndarray, reset_flags: tuple, stats, action_dtype=np.int64):
        """Brings the envs, just built with `run.env_seed`, on from the checkpoint; returns (envs, obs) for the loop.

        envpool cannot save its state, but it is deterministic given its seed and the actions: by default the logged
        actions are stepped again, and the run goes on exactly (a signal meanwhile exits at once; the checkpoint is
        still the newest state). That costs the environment steps of the whole run so far. With --resume-fresh-envs
        the envs start new games instead, at a cost that does not grow with the run: the games in progress are
        dropped (their partial scores are not logged; `charts/games_dropped_at_resume` counts them) and the next step
        is made an envpool reset step for every env, by setting the script's `reset_flags` arrays (the flag that the
        step from `obs` is a reset step, and any flag that the observation after it starts a game). The script then
        zeroes recurrent state where it always does; where its replay ends n-step targets only at a stored episode
        end, it also marks its last stored step as a time-out, so that nothing is trained across the cut. A later
        exact resume replays only the actions since the last such cut."""
        envs_count = action_log.shape[1] if action_log.ndim > 1 else 1
        if self.args.resume_fresh_envs:
            dropped = int(np.count_nonzero(stats.lengths))
            stats.returns[:], stats.lengths[:] = 0.0, 0
            for flags in reset_flags:
                flags[:] = True
            self.writer.add_scalar("charts/games_dropped_at_resume", dropped, self.checkpoint["global_step"])
            print(
                f"resume: fresh environments ({action_log.size} logged agent steps not replayed); "
                f"{dropped} games in progress dropped"
            )
            return FirstStepIsReset(envs), obs
        start_row = self.envs_start // envs_count
        if start_row > 0:  # envs started fresh at that step, whose first step was a reset step
            envs, action_log = FirstStepIsReset(envs), action_log[start_row:]
        print(f"resume: replaying {action_log.size} logged agent steps ({len(action_log)} steps of {envs_count} envs)")
        stepped, self.replaying = None, True
        for actions in action_log:
            stepped = envs.step(actions.astype(action_dtype))[0]
        self.replaying = False
        if stepped is not None and not np.array_equal(stepped, obs):
            raise SystemExit("error: the environment replay diverged from the checkpoint (another envpool version?)")
        return envs, obs

    def restore(self, state: dict) -> dict:
        """Loads the checkpoint into `state` (the script's checkpoint state) in place, then the random generators
        (last: building the networks and envs drew from them). Returns the saved entries, for the plain numbers."""
        saved = self.checkpoint["state"]
        if set(saved) != set(state):
            flag_error("resume", self.args.resume, f"holds {sorted(saved)}, expected {sorted(state)}")
        for key, value in state.items():
            load_into(value, saved[key])
        set_rng_states(self.checkpoint["rng"])
        print(f"resume: continuing {self.name} from step {self.checkpoint['global_step']}")
        return saved

    def save(self, global_step: int, state: dict) -> str:
        """Writes beside the previous checkpoint, syncs, then renames over it: a crash, a full disk or a second signal
        while writing leaves that one whole. A state holding NaN or inf is not written (the previous one stays good)."""
        learned = [key for key, value in state.items() if isinstance(value, (nn.Module, torch.optim.Optimizer))]
        state = {key: state_of(value) for key, value in state.items()}
        header = dict(format=self.format, script=os.path.basename(self.script), args=vars(self.args), run_name=self.name)
        checkpoint = dict(header, wandb_id=self.wandb_id, global_step=global_step, rng=rng_states(), state=state)
        checkpoint["envs_start"] = self.envs_start
        if not all_finite(
            [state[key] for key in learned]
        ):  # weights and optimizer moments (buffers may hold inf by design, e.g. min-trees)
            raise SystemExit(
                f"error: non-finite values in the state at step {global_step}; no checkpoint written; "
                f"last good checkpoint: {self.last_checkpoint or 'none written'}"
            )
        checkpoint["digest"] = content_digest(checkpoint)
        tmp, failed = self.checkpoint_path + ".tmp", []

        def write():
            try:
                with open(tmp, "wb") as file:
                    torch.save(checkpoint, file)
                    file.flush()
                    os.fsync(file.fileno())
            except BaseException as error:
                failed.append(error)

        # Written by a helper thread, so that this one stays free to answer a second signal at once.
        writer = threading.Thread(target=write, daemon=True)
        try:
            writer.start()
            while writer.is_alive():
                writer.join(0.05)
            if failed:
                raise failed[0]
            os.replace(tmp, self.checkpoint_path)
        except BaseException as error:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            if isinstance(error, (OSError, RuntimeError)):  # torch.save reports a full disk as a RuntimeError
                raise SystemExit(
                    f"error: writing the checkpoint failed at step {global_step} ({error}); is the disk full? "
                    f"last good checkpoint: {self.last_checkpoint or 'none written'}"
                ) from None
            raise
        self.last_checkpoint = self.checkpoint_path
        return self.checkpoint_path

    def checkpoint_or_stop(self, global_step: int, steps: int, last: bool, state: Callable[[], dict]) -> bool:
        """Call once at the end of every iteration, after its logging, with the `steps` it took. Writes a checkpoint
        when global_step crossed a multiple of --checkpoint-every, at the last iteration (if checkpointing), or when
        a signal asked to stop; returns True when the loop must stop."""
        every, stopping = self.args.checkpoint_every, self.stop_requested  # read once: a later signal waits a step
        self.global_step = global_step
        crossed = every > 0 and global_step // every > (global_step - steps) // every
        if crossed or stopping or (every > 0 and last):
            self.save(global_step, state())
        if stopping:
            global stop_signal
            self.stopped, stop_signal = True, self.signum
            print(
                f"checkpoint written to {self.checkpoint_path}; continue the run with:\n"
                f"  python {self.script} --resume {os.path.abspath(self.checkpoint_path)}"
            )
        return stopping

    def clip_grad_norm(self, parameters, max_norm: float, global_step: int, **kwargs) -> torch.Tensor:
        """The gradient clip and the one NaN stop: a NaN or inf in the loss or the Q-values reaches the gradient norm,
        so the run stops here, before the optimizer step spreads it into the weights, naming the last good checkpoint."""
        try:
            return torch.nn.utils.clip_grad_norm_(parameters, max_norm, error_if_nonfinite=True, **kwargs)
        except RuntimeError:
            raise SystemExit(
                f"error: non-finite loss or Q-values at step {global_step}; last good checkpoint: "
                f"{self.last_checkpoint or 'none written'}"
            ) from None


class FirstStepIsReset:
    """Fresh envpool envs (--resume-fresh-envs) whose first step is a reset step, as after an episode end under
    NEXT_STEP autoreset: the actions are ignored and the first observation of a new game comes back, with zero reward,
    no episode end, and the reset's info. Every later call goes to the envs themselves."""

    def __init__(self, envs):
        self.envs, self.first = envs, envs.reset()

    def __getattr__(self, name):
        return getattr(self.envs, name)

    def step(self, actions):
        if self.first is None:
            return self.envs.step(actions)
        (obs, info), self.first = self.first, None
        no = np.zeros(len(obs), dtype=bool)
        return obs, np.zeros(len(obs), dtype=np.float32), no, no.copy(), info


MODEL_FILE = "cleanrl-q model"  # marks a model file written by `save_model`


def save_model(path: str, script: str, args, network: nn.Module) -> None:
    """A model file holds the weights and every flag of the run, which rebuild the network (sizes, env) later."""
    torch.save(
        {"kind": MODEL_FILE, "script": os.path.basename(script), "args": vars(args), "model": network.state_dict()}, path
    )


def read_model_file(path: str, device="cpu") -> dict:
    """The contents of a model file; a file of bare weights (written before flags were saved) reads as {"model": ...}."""
    try:
        saved = torch.load(path, map_location=device, weights_only=True)
    except Exception as error:
        flag_error("model_path", path, f"not a readable model file ({type(error).__name__}: {error})")
    return saved if isinstance(saved, dict) and saved.get("kind") == MODEL_FILE else {"model": saved}


def load_weights(path: str, device) -> dict:
    """The network weights of a model file, for `load_state_dict`."""
    return read_model_file(path, device)["model"]


def evaluation_line(path: str, scores: list[float]) -> str:
    if not scores:
        return f"evaluation of {path}: no episodes played (--eval-episodes 0)"
    return (
        f"evaluation of {path} over {len(scores)} episodes: mean {np.mean(scores):.2f} ± {np.std(scores):.2f} "
        f"(min {np.min(scores):.2f}, max {np.max(scores):.2f})"
    )


def evaluate_only(given, script: str, validate: Callable, evaluate: Callable) -> list[float]:
    """--eval-only --model-path PATH: rebuilds the saved agent with the flags saved beside its weights and plays
    `--eval-episodes` evaluation episodes (recorded with --capture-video); prints and returns their scores. Only
    EVALUATION_FLAGS come from the command line; other flags given that differ from the saved ones are named."""
    check_evaluation_flags(given)
    saved, name = read_model_file(given.model_path), os.path.basename(script)
    if "args" not in saved:
        print(f"note: {given.model_path} holds weights only: the network is built from the command-line flags")
        args = given
    elif saved["script"] != name:
        flag_error("model_path", given.model_path, f"written by {saved['script']}, not {name}")
    else:
        names, defaults = {field.name for field in fields(given)}, type(given)()
        kept = {key: value for key, value in saved["args"].items() if key in names and key not in EVALUATION_FLAGS}
        for key, value in kept.items():
            if getattr(given, key) not in (value, getattr(defaults, key)):
                print(f"eval-only: ignoring --{key.replace('_', '-')}={getattr(given, key)}; the model's value is {value}")
        args = replace(given, **kept)
    validate(args)
    device = pick_device(args.cuda)
    print(f"{name}: evaluating {args.model_path} on {args.env_id}, device {describe_device(device, args.cuda)}")
    run_name = f"{os.path.basename(os.path.dirname(os.path.abspath(args.model_path)))}-eval-{int(time.time())}"
    scores = evaluate(args.model_path, args, device, run_name)
    print(evaluation_line(args.model_path, scores))
    if args.capture_video:
        print(f"videos in videos/{run_name}")
    return scores


def make_video_env(
    env_id: str, run_name: str, frame_stack: int = 4, max_episode_steps: Optional[int] = None, episodic_life: bool = True
):
    """A recording gymnasium env for --capture-video (envpool does not render): for Atari ids, ale-py's env with the
    training preprocessing (NOOP starts, 4-frame skip, 84x84 grayscale, `frame_stack` frames); else gymnasium's own.
    `episodic_life` is the training env's envpool flag: with it envpool presses FIRE after every lost life, without
    it only at the start of a game, so the recorded game is the one trained and scored."""
    check_video_modules(env_id)
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # frames are drawn off-screen: no display needed (or complained of)
    if env_id.endswith("-v5"):
        import ale_py

        gym.register_envs(ale_py)
    if not env_id.endswith("-v5"):
        return gym.wrappers.RecordVideo(gym.make(env_id, render_mode="rgb_array"), f"videos/{run_name}", lambda _: True)
    frames = {} if max_episode_steps is None else {"max_num_frames_per_episode": 4 * max_episode_steps}
    env = gym.make(f"ALE/{env_id}", frameskip=1, repeat_action_probability=0.0, render_mode="rgb_array", **frames)
    env = gym.wrappers.RecordVideo(env, f"videos/{run_name}", episode_trigger=lambda _: True)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False)
    env = FireAfterLifeLoss(env, episodic_life) if "FIRE" in env.unwrapped.get_action_meanings() else env
    return gym.wrappers.FrameStackObservation(env, frame_stack) if frame_stack > 1 else env


def terminated_at_step_cap(terminated: np.ndarray, truncated: np.ndarray, info: dict) -> np.ndarray:
    """The termination flags of one envpool Atari step, with a game that ends on the capped step counted as ended:
    envpool returns `done & ~truncated` there, a time-out whose target would bootstrap, though `info["terminated"]`
    says the game is over. gymnasium (TimeLimit, ale-py's frame cap) already sets both flags; without that info key
    the flags are returned unchanged."""
    if "terminated" not in info:
        return terminated
    return terminated | (truncated & np.asarray(info["terminated"], dtype=bool))


class FireAfterLifeLoss(gym.Wrapper):
    """Presses FIRE once after the reset and, with `after_life_loss`, after every lost life, as envpool does
    (`use_fire_reset`; with `episodic_life` a life loss there is a reset): games like Breakout then go on without
    the agent having to serve. Without `episodic_life` envpool serves only a game's first ball, and so does this."""

    def __init__(self, env, after_life_loss: bool = True):
        super().__init__(env)
        self.after_life_loss = after_life_loss

    def fire(self):
        return self.env.step(self.env.unwrapped.get_action_meanings().index("FIRE"))

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.fire()
        return self.env.reset(**kwargs) if terminated or truncated else (obs, info)

    def step(self, action):
        lives = self.env.unwrapped.ale.lives()
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.after_life_loss and info["lives"] < lives and not (terminated or truncated):
            obs, fire_reward, terminated, truncated, info = self.fire()
            reward += fire_reward
        return obs, reward, terminated, truncated, info
