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
import errno
import fcntl
import hashlib
import importlib.util
import math
import netrc
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import warnings
from collections import deque
from dataclasses import fields, replace
from typing import Callable, NoReturn, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.utils.tensorboard import SummaryWriter

from cleanrl_q_utils import minatar

# The flags a resumed run may change from the command line: how the run is carried out and logged, what happens after
# training, and a smaller step after a NaN stop. Every other flag keeps the checkpoint's value; giving it another one
# stops the run, by name.
CHANGEABLE_ON_RESUME = (
    *("checkpoint_every", "checkpoint_replay", "track", "wandb_project_name", "wandb_entity", "cuda"),
    *("save_model", "capture_video", "eval_episodes", "eval_epsilon"),
    *("learning_rate", "max_grad_norm"),
)
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
    # Schaul et al.'s exponents: alpha 0 is uniform replay, 1 full prioritization; beta 1 fully corrects the bias.
    **dict.fromkeys(("prioritized_replay_alpha", "prioritized_replay_beta"), (lambda v: 0 <= v <= 1, "in [0, 1]")),
    "exploration_fraction": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    **dict.fromkeys(
        (
            "epsilon_alpha",
            "learning_starts",
            "burn_in",
            "checkpoint_every",
            "eval_episodes",
        ),
        (lambda v: 0 <= v < math.inf, ">= 0"),
    ),
    # envpool takes int32 seeds; evaluation envs are seeded a little above the run's seed.
    "seed": (lambda v: 0 <= v < 2**31 - 2**16, "in [0, 2147418112) (envpool takes 32-bit signed seeds)"),
}
# envpool builds gymnasium Box spaces from float64 bounds; gymnasium then warns on every classic-control run that it
# casts them to the float32 dtype the observations have, which is what we want.
warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
# A signal during the recorded evaluation ends the run with one line of its own; gymnasium's recorder, collected on the
# way out, would add that it could not save the episode it was recording.
warnings.filterwarnings("ignore", message=".*Unable to save last video")
# The flags an --eval-only run takes from the command line; every other flag comes from the saved model file.
EVALUATION_FLAGS = ("eval_only", "model_path", "eval_episodes", "eval_epsilon", "capture_video", "seed", "cuda")
# Flags added after the first checkpoints were written: a checkpoint without them resumes with their defaults.
LATER_FLAGS = {"eval_only", "model_path", "resume_fresh_envs"}
# What --capture-video imports, by kind of environment (module, pip package).
VIDEO_MODULES = {
    "atari": [("moviepy", "moviepy"), ("ale_py", "ale-py"), ("cv2", "opencv-python")],
    "classic": [("moviepy", "moviepy"), ("pygame", "pygame")],
    "minatar": [("moviepy", "moviepy")],
}
COUNT_FLAGS = (  # numbers of things: at least 1
    "total_timesteps num_envs num_steps num_minibatches update_epochs batch_size buffer_size seq_len n_step "
    "train_frequency target_network_frequency hidden_size lstm_size quantile_embedding_dim num_tau_samples "
    "num_tau_prime_samples num_quantile_samples log_interval max_episode_steps frame_stack sequence_period"
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
    if not is_plain_name(args.exp_name, 100):
        flag_error("exp_name", args.exp_name, "must be a folder name: no '/', not '.' or '..', at most 100 bytes")
    if args.track:
        check_wandb_login()
    if "learning_starts" in vars(args) and args.total_timesteps <= args.learning_starts:
        flag_error("total_timesteps", args.total_timesteps, f"must exceed --learning-starts={args.learning_starts}")
    # Every action of the run is logged (a byte per environment step) so that a resume can replay it.
    check_memory(args.total_timesteps, "the action log", f"--total-timesteps={args.total_timesteps}")
    check_evaluation_flags(args)


def check_wandb_login() -> None:
    """--track needs a Weights & Biases login (or offline logging); without one, wandb would stop the run after its
    folder exists, or wait for a key typed in."""
    if importlib.util.find_spec("wandb") is None:
        raise SystemExit("error: --track needs wandb, not installed: pip install wandb")
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return
    host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    with contextlib.suppress(OSError, netrc.NetrcParseError):
        if netrc.netrc(os.environ.get("NETRC")).authenticators(host):
            return
    raise SystemExit(
        "error: --track: no Weights & Biases login found; run `wandb login`, set WANDB_API_KEY, or set "
        "WANDB_MODE=offline to log locally and `wandb sync` later"
    )


def rounded_total(args, total: int) -> int:
    """`total` rounded up to whole iterations of a script's loop: PQN rollouts (--num-envs x --num-steps), else steps
    of every environment (--num-envs)."""
    per_iteration = getattr(args, "num_envs", 1) * getattr(args, "num_steps", 1)
    return -(-total // per_iteration) * per_iteration


def whole_iterations(args):
    """`args` with --total-timesteps a whole number of iterations: a total between two multiples is rounded up,
    with a note, rather than run short without a word."""
    total = rounded_total(args, args.total_timesteps)
    if total != args.total_timesteps:
        print(f"note: --total-timesteps={args.total_timesteps} rounded up to {total}, a whole number of iterations")
    return replace(args, total_timesteps=total)


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
        flag_error("model_path", args.model_path, "not a file" if os.path.exists(args.model_path) else "no such file")
    if args.capture_video:
        check_video_modules(args.env_id)
        if not (args.save_model or args.eval_only):
            print("warning: --capture-video records the evaluation episodes, which only --save-model or --eval-only play")


def check_video_modules(env_id: str) -> None:
    """One line naming every missing package of --capture-video and the install command."""
    needed = VIDEO_MODULES["atari" if env_id.endswith("-v5") else "minatar" if minatar.is_minatar(env_id) else "classic"]
    missing = [package for module, package in needed if importlib.util.find_spec(module) is None]
    if missing:
        raise SystemExit(f'error: --capture-video needs {", ".join(missing)}, not installed: pip install -e ".[video]"')


def check_env_id(env_id: str, atari: Optional[bool] = None):
    """The envpool spec of `env_id`, after checking that envpool knows it, that its actions are discrete and, with
    `atari` given, that it is (True) or is not (False) an Atari game of image observations. MinAtar ids (gymnasium's)
    are for the scripts of vector observations, which give their 10x10 images a torso of their own."""
    import envpool

    if minatar.is_minatar(env_id):
        if atari:
            flag_error("env_id", env_id, "a MinAtar game: this script needs an Atari game; its twin for vectors plays MinAtar")
        return minatar.spec(env_id)
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
    time left. The time left comes from the rate since learning started (at `learning_starts`): the steps before it
    only act and run much faster, so a rate that counted them would promise too little time; until then the line
    says "warming up". A script whose updates are few and long (one per hundreds or thousands of agent steps, and
    only once whole sequences are stored) gives `updates_per_step` and its update count to `print`: the time left is
    then the remaining steps at the measured acting time per step plus the remaining updates at the measured time
    per update, known from the first update on. `slow_hint`, when given, is printed once, with the first estimate,
    if the run would take over a day more."""

    def __init__(
        self,
        total_timesteps: int,
        start_step: int,
        learning_starts: int = 0,
        interval: float = 10.0,
        slow_hint=None,
        updates_per_step: float = 0.0,
    ):
        self.total, self.start_step, self.interval, self.slow_hint = total_timesteps, start_step, interval, slow_hint
        self.start_time = self.last_print = time.time()
        self.learning_starts, self.origin = learning_starts, None  # origin: (step, time) of the rate's first point
        self.updates_per_step, self.last_call = updates_per_step, None  # last_call: (step, updates, time)
        # time spent between calls without an update (acting), and between calls with updates (and their steps)
        self.act_steps = self.act_seconds = self.updates_timed = self.update_seconds = self.update_call_steps = 0

    def sps(self, global_step: int) -> int:
        return int((global_step - self.start_step) / max(time.time() - self.start_time, 1e-9))

    def count(self, global_step: int, updates: int, now: float) -> None:
        """Adds the time since the last call to the acting time, or to the updates' time if updates were made."""
        last, self.last_call = self.last_call, (global_step, updates, now)
        if last is None or global_step <= self.learning_starts:
            return
        if updates == last[1]:
            self.act_steps, self.act_seconds = self.act_steps + global_step - last[0], self.act_seconds + now - last[2]
        else:
            self.updates_timed += updates - last[1]
            self.update_seconds += now - last[2]
            self.update_call_steps += global_step - last[0]

    def time_left(self, global_step: int) -> Optional[float]:
        """Seconds left at the rate since learning started; None before a rate is known."""
        if self.updates_per_step:
            if not (self.updates_timed and self.act_steps and self.act_seconds):
                return None
            per_step = self.act_seconds / self.act_steps  # the acting steps of calls with updates are not update time
            per_update = max(self.update_seconds - self.update_call_steps * per_step, 0.0) / self.updates_timed
            return (self.total - global_step) * (per_step + self.updates_per_step * per_update)
        if self.origin is None:
            return None
        steps, seconds = global_step - self.origin[0], time.time() - self.origin[1]
        return (self.total - global_step) * seconds / steps if steps > 0 and seconds > 0 else None

    def print(self, global_step: int, recent_scores, force: bool = False, updates: Optional[int] = None) -> None:
        if updates is not None:
            self.count(global_step, updates, time.time())
        if self.origin is None and global_step >= self.learning_starts:
            self.origin = (global_step, time.time())
        if not force and time.time() - self.last_print < self.interval:
            return
        self.last_print = time.time()
        sps, mean = self.sps(global_step), np.mean(recent_scores) if len(recent_scores) else float("nan")
        left = self.time_left(global_step)
        if global_step >= self.total:
            eta = "done"
        elif left is not None:
            eta = f"ETA {format_duration(left)}"
        elif global_step < self.learning_starts:
            eta = f"warming up (learning starts at step {self.learning_starts})"
        else:  # learning started; with updates counted, the first update has not yet been timed
            eta = "ETA after the first update" if self.updates_per_step and not self.updates_timed else "ETA measuring"
        print(
            f"step {global_step:>9}/{self.total} ({100 * global_step / self.total:5.1f}%) | SPS {sps:>6} | "
            f"return(100) {mean:8.2f} | {eta}"
        )
        if self.slow_hint and left is not None:
            if left > 86400:
                print(
                    f"warning: at the speed measured since learning began this run takes {format_duration(left)} more; "
                    f"{self.slow_hint}"
                )
            self.slow_hint = None


def resume(given, script: str, checkpoint_format: int):
    """(args, checkpoint) of a run: `given` unchanged and no checkpoint, or with --resume the checkpoint and its flags.

    A flag given on the command line wins whatever its value, if it may change on resume (CHANGEABLE_ON_RESUME);
    another flag given with a value other than the checkpoint's stops the run, by name; a flag not given keeps the
    checkpoint's value. What changed is listed in the start-up block (`checkpoint["changed"]`). `script` is the
    script's path (`__file__`); a checkpoint of another script or format, or whose contents changed, stops the run."""
    if given.resume is None:
        if given.resume_fresh_envs:
            flag_error("resume_fresh_envs", True, "only with --resume PATH (how to rebuild a resumed run's games)")
        return given, None
    if not os.path.isfile(given.resume):
        flag_error("resume", given.resume, "not a file" if os.path.exists(given.resume) else "no such file")
    checkpoint, names = read_checkpoint(given.resume, "resume"), {field.name for field in fields(given)}
    if isinstance(checkpoint, dict) and checkpoint.get("kind") == MODEL_FILE:
        flag_error("resume", given.resume, "a model file (--save-model), not a checkpoint: evaluate it with --eval-only")
    try:
        script = os.path.basename(script)
        if checkpoint.get("script") != script:
            raise ValueError(f"written by {checkpoint.get('script')}, not {script}")
        if checkpoint["format"] != checkpoint_format or set(checkpoint["args"]) - LATER_FLAGS != names - LATER_FLAGS:
            raise ValueError(f"format {checkpoint['format']}, expected {checkpoint_format}")
        if content_digest({k: v for k, v in checkpoint.items() if k != "digest"}) != checkpoint["digest"]:
            raise ValueError("its contents do not match their checksum (a damaged file)")
        if not is_plain_name(checkpoint["run_name"]):
            raise ValueError(f"its run name {checkpoint['run_name']!r} is not a folder name")
        defaults = type(given)()
        for name, value in checkpoint["args"].items():
            default = getattr(defaults, name, None)
            kinds = (type(default), type(None)) if default is None or not isinstance(default, float) else (float, int)
            if name in names and default is not None and not isinstance(value, kinds) or isinstance(value, (dict, list)):
                raise ValueError(f"its flag {name} holds {value!r}")
    except (KeyError, TypeError, ValueError) as error:
        flag_error("resume", given.resume, f"not a readable checkpoint ({type(error).__name__}: {error})")
    saved = {**{name: getattr(type(given)(), name) for name in LATER_FLAGS & names}, **checkpoint["args"]}
    # How to resume is said anew each time: --resume, and --resume-fresh-envs (fresh games, or the exact replay).
    args, changed = replace(type(given)(**saved), resume=given.resume, resume_fresh_envs=given.resume_fresh_envs), []
    for name in sorted(flags_given(given) - {"resume", "resume_fresh_envs"}):
        value = getattr(given, name)
        if value == saved[name] or name == "total_timesteps" and rounded_total(args, value) == saved[name]:
            continue  # the same value (a launcher repeats the whole command), or the total it was rounded up to
        if name not in CHANGEABLE_ON_RESUME:
            changeable = ", ".join("--" + flag.replace("_", "-") for flag in CHANGEABLE_ON_RESUME if flag in names)
            flag_error(name, value, f"cannot change on resume (the checkpoint has {saved[name]}); these can: {changeable}")
        args = replace(args, **{name: value})
        changed.append(f"--{name.replace('_', '-')} {saved[name]} -> {value}")
    checkpoint["changed"] = changed
    return args, checkpoint


def flags_given(args) -> set[str]:
    """The fields of `args` given on the command line (`--name`, `--name=value`, `--no-name`, with - or _), plus, for a
    script's `main` called from Python, the fields whose values differ from the defaults."""
    names, defaults = {field.name for field in fields(args)}, type(args)()
    given = {name for name in names if getattr(args, name) != getattr(defaults, name)}
    for token in sys.argv[1:]:
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0].replace("-", "_")
            given |= {name, name[3:]} & names if name.startswith("no_") else {name} & names
    return given


def is_plain_name(name, most_bytes: int = 255) -> bool:
    """A name that is one folder or file name: no path separator, not `.` or `..`, not empty, not too long."""
    plain = isinstance(name, str) and name not in ("", ".", "..") and not {"/", "\x00"} & set(name)
    return plain and len(name.encode()) <= most_bytes


def read_checkpoint(path: str, flag: str = "resume") -> dict:
    """A checkpoint's contents, loaded without running code: `torch.load(weights_only=True)` unpickles only tensors and
    plain values (numbers, strings, lists, tuples, dicts), and numpy arrays are stored as tensors of their bytes (see
    `to_safe`). A file holding anything else, a pickled object that could run code included, is refused in one line."""
    try:
        return from_safe(load_safely(path, "cpu"))
    except Exception as error:
        flag_error(flag, path, f"not a readable checkpoint ({unreadable_reason(error)})")


def load_safely(path: str, map_location, **kwargs):
    """`torch.load(weights_only=True)` without torch's warnings (on a file's pickle protocol, say): a file it refuses
    is then said in one line."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, map_location=map_location, weights_only=True, **kwargs)


NUMPY_MARK = "numpy array"  # to_safe's form of a numpy array or scalar: {NUMPY_MARK: dtype, "shape": ..., "bytes": ...}


def to_safe(value):
    """`value` with every numpy array and scalar replaced by a dict of its dtype, shape and bytes (a uint8 tensor that
    shares its memory), so that `torch.load(weights_only=True)` reads it back; `from_safe` undoes it bit for bit."""
    if isinstance(value, dict):
        return {key: to_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_safe(item) for item in value)
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value) if np.asarray(value).flags.c_contiguous else np.ascontiguousarray(value)
        if array.dtype.hasobject:
            raise TypeError("a numpy array of Python objects cannot be checkpointed safely")
        raw = torch.from_numpy(array.reshape(-1).view(np.uint8))
        return {NUMPY_MARK: array.dtype.str, "shape": array.shape, "scalar": isinstance(value, np.generic), "bytes": raw}
    return value


def from_safe(value):
    if isinstance(value, dict):
        if NUMPY_MARK in value:
            array = value["bytes"].numpy().view(np.dtype(value[NUMPY_MARK])).reshape(value["shape"])
            return array[()] if value["scalar"] else array
        return {key: from_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(from_safe(item) for item in value)
    return value


def new_temporary_file(path: str) -> tuple[int, str]:
    """(descriptor, path) of a new file beside `path`, with the permissions a plain `open` would give it (mkstemp's
    are owner-only, which would hide checkpoints and models from the colleagues a folder is shared with)."""
    handle, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=os.path.dirname(path) or ".")
    umask = os.umask(0o22)
    os.umask(umask)
    os.fchmod(handle, 0o666 & ~umask)
    return handle, tmp


def write_atomically(path: str, write: Callable) -> None:
    """Calls `write(file)` on a new temporary file beside `path`, syncs it, then renames it over `path`: readers see the
    old file or the new one whole, never a part (a crash, a full disk, a signal), and two writers never share a file."""
    handle, tmp = new_temporary_file(path)
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


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


def set_learning_rate(value, learning_rate: float) -> None:
    """Sets the step size of `value` if it is an optimizer: torch's (every parameter group) or the flat RAdam (`lr`)."""
    if isinstance(value, torch.optim.Optimizer):
        for group in value.param_groups:
            group["lr"] = learning_rate
    elif hasattr(value, "load_state_dict") and isinstance(getattr(value, "lr", None), float):
        value.lr = learning_rate


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
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO)
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # a closed terminal (SIGHUP) stops a run like SIGTERM


def new_run_name(args) -> str:
    """A fresh run name, whose directory under runs/ this call creates: a run started in the same second with the same
    env, name and seed (a sweep) gets a suffix instead of sharing, and overwriting, the other's files. A namespaced
    env id (MinAtar/Breakout-v0) is written with a dash (MinAtar-Breakout-v0): a run is one folder."""
    base = f"{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    for suffix in ["", *(f"_{i}" for i in range(2, 1000))]:
        with contextlib.suppress(FileExistsError):
            make_run_dir(f"runs/{base}{suffix}")
            return base + suffix
    raise SystemExit(f"error: could not create a run directory runs/{base}_*")


def make_run_dir(path: str, exist_ok: bool = False) -> None:
    try:
        os.makedirs(path, exist_ok=exist_ok)
    except FileExistsError:
        raise
    except OSError as error:
        stop_on_disk_error(f"error: cannot create the run folder {path} ({error.strerror}); start the run where it can write")


def stop_on_disk_error(message: str) -> NoReturn:
    """A full disk or a read-only folder: one line on stderr and exit status 2, as for a bad command line."""
    print(message, file=sys.stderr, flush=True)
    raise SystemExit(2)


def lock_run_dir(path: str) -> int:
    """Takes the run folder's lock for as long as the process lives (the kernel releases it when the process ends, a
    crash included); a second process running the same run stops here instead of writing into the same files."""
    handle = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(handle)
        raise SystemExit(f"error: the run in {path} is running in another process (it holds the folder's lock)") from None
    return handle


def resumed_run_dir(resume_path: str, checkpoint: dict) -> str:
    """Where a resumed run writes: the checkpoint's own folder when it is the run's folder (named for the run, as
    runs/<run name>/checkpoint.pt is), else runs/<run name> under the working directory. It never writes beside a
    checkpoint that is not in its run's folder (a backup, a copy, another run's folder)."""
    folder = os.path.dirname(resume_path) or "."
    return folder if os.path.basename(os.path.realpath(folder)) == checkpoint["run_name"] else f"runs/{checkpoint['run_name']}"


def check_newer_checkpoint(path: str, resume_path: str, checkpoint: dict) -> None:
    """Stops a resume that would overwrite, at `path`, a newer checkpoint of the run or a file that is not this run's."""
    if not os.path.exists(path) or os.path.samefile(path, resume_path):
        return
    try:  # mmap: only the few plain values are read, not the tensors
        present = load_safely(path, "cpu", mmap=True)
        present_step = present["global_step"] if present["run_name"] == checkpoint["run_name"] else None
    except Exception:
        present_step = None
    step = checkpoint["global_step"]
    if present_step is None:
        raise SystemExit(f"error: --resume={resume_path}: {path} is not a checkpoint of this run; move it away to resume")
    if present_step > step:
        raise SystemExit(
            f"error: --resume={resume_path}: {path} holds the run's checkpoint at step {present_step}, newer than step "
            f"{step}: resume from it, or move it away to go back to step {step}"
        )


def check_writable_home(run_dir: str) -> None:
    """A resume of a checkpoint copied from elsewhere writes into runs/<run name>; refuse early if that cannot work."""
    parent = os.path.dirname(run_dir) or "."
    if (
        os.path.isdir(run_dir)
        and not os.access(run_dir, os.W_OK)
        or not os.path.isdir(run_dir)
        and os.path.isdir(parent)
        and not os.access(parent, os.W_OK)
    ):
        stop_on_disk_error(f"error: cannot write to the run folder {run_dir} (read-only); resume where you can write")


def cli(main, args_class) -> None:
    """A script's command line: parses the flags into `args_class` and runs `main`. A run stopped by a signal (after
    writing its checkpoint) exits with 128 + the signal's number, so that shells and schedulers can tell it from a
    finished run."""
    import tyro

    if {"-h", "--help"} & set(sys.argv[1:]):  # tyro's help is one flat list; the flags read better by group
        return print_grouped_help(args_class, sys.modules[args_class.__module__].__doc__)
    main(tyro.cli(args_class))
    if stop_signal is not None:
        sys.exit(128 + stop_signal)


# `--help` groups: the fields of each, in their order in `Args`; a field not named here is an algorithm flag.
HELP_GROUPS = {
    "run": ("exp_name", "seed", "torch_deterministic", "cuda", "track", "wandb_project_name", "wandb_entity"),
    "environment": ("env_id", "num_envs", "frame_stack", "max_episode_steps", "mask_velocity"),
    "algorithm": (),
    "replay": (
        *("buffer_size", "batch_size", "learning_starts", "replay_ratio", "seq_len", "burn_in", "sequence_period"),
        *("prioritized_replay", "prioritized_replay_alpha", "prioritized_replay_beta", "prioritized_replay_eps"),
        "priority_eta",
    ),
    "checkpoints": ("checkpoint_every", "checkpoint_replay", "resume", "resume_fresh_envs"),
    "evaluation": ("save_model", "capture_video", "eval_episodes", "eval_epsilon", "eval_only", "model_path"),
}


def print_grouped_help(args_class, script_doc: Optional[str]) -> None:
    """`--help`: the first paragraph of the script's docstring, a usage line, then the fields of `args_class` under
    the headings of HELP_GROUPS, each as `--flag TYPE  (default: X)` with its docstring below."""
    import ast
    import inspect
    import textwrap
    import typing

    source = textwrap.dedent(inspect.getsource(args_class))
    body = ast.parse(source).body[0].body
    docs = {
        statement.target.id: " ".join(following.value.value.split())
        for statement, following in zip(body, body[1:])
        if isinstance(statement, ast.AnnAssign)
        and isinstance(following, ast.Expr)
        and isinstance(following.value, ast.Constant)
    }
    group_of = {name: group for group, names in HELP_GROUPS.items() for name in names}
    by_group = {group: [] for group in HELP_GROUPS}
    hints = typing.get_type_hints(args_class)
    for field in fields(args_class):
        by_group[group_of.get(field.name, "algorithm")].append(field)
    width = min(shutil.get_terminal_size().columns, 100)
    summary = " ".join((script_doc or "").strip().split("\n\n")[0].split())  # the docstring's first paragraph
    lines = [textwrap.fill(summary, width), "", f"usage: python {sys.argv[0]} [-h] [--flag VALUE ...]"]
    for group, members in by_group.items():
        lines += ["", f"{group}:"] if members else []
        for field in members:
            flag, kind = "--" + field.name.replace("_", "-"), hints[field.name]
            if kind is bool:
                usage = f"{flag} / --no-{flag[2:]}"
            else:
                kinds = [arg for arg in typing.get_args(kind) if arg is not type(None)] or [kind]  # Optional[str]: STR
                usage = f"{flag} {getattr(kinds[0], '__name__', str(kinds[0])).upper()}"
            lines.append(f"  {usage}  (default: {field.default})")
            indent = " " * 6
            text = docs.get(field.name, "")
            lines.append(textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False))
    print("\n".join(lines))


class Run:
    """One training run: name and directory, TensorBoard writer (synced to W&B with --track), the signal handlers,
    and its checkpoints. Use it as a context manager: leaving the block, however, restores the previous signal
    handlers, closes the logs and releases the run folder's lock (tests call `main` in-process: nothing must leak).

    A run writes only into its own folder: runs/<run name>, or for a resume the folder `resumed_run_dir` names; the
    folder is locked while the run lives. A signal (SIGINT, SIGTERM, SIGHUP) during training stops the run after the
    current step with a checkpoint; a second one exits at once, the last checkpoint intact; after training (the
    model file, the evaluation, the video) it exits at once, the final checkpoint written. Either way the exit status
    is 128 + the signal's number."""

    def __init__(self, args, checkpoint: Optional[dict], script: str, checkpoint_format: int, cpu_threads=None):
        global stop_signal
        stop_signal = None
        self.args, self.checkpoint, self.format = args, checkpoint, checkpoint_format
        self.script = os.path.abspath(script)
        self.start_time, self.eval_scores, self.lock, self.writer = time.time(), None, None, None
        self.learning_resumes_at = None  # set by note_empty_replay
        self.stop_requested = self.stopped = self.replaying = self.writing = self.training_done = False
        self.global_step = self.start_step = checkpoint["global_step"] if checkpoint else 0  # last step checkpoint_or_stop saw
        # The step at which the current envs started their first games: 0, or that of the last --resume-fresh-envs.
        # They are seeded with seed + that step (envpool takes 31-bit seeds), so that new games are not the first ones.
        fresh = checkpoint is not None and args.resume_fresh_envs
        self.envs_start = self.global_step if fresh else checkpoint.get("envs_start", 0) if checkpoint else 0
        self.env_seed = (args.seed + self.envs_start) % 2**31
        self.device = pick_device(args.cuda, cpu_threads)
        self.wandb_id = checkpoint["wandb_id"] if checkpoint else None
        # A run started with `nohup` (SIGHUP ignored) goes on when its terminal closes, as nohup promises.
        handled = [sig for sig in HANDLED_SIGNALS if sig != signal.SIGHUP or signal.getsignal(sig) != signal.SIG_IGN]
        self.previous_handlers = {sig: signal.signal(sig, self._on_signal) for sig in handled}
        # Python runs a handler once for signals that arrive during one long C call (say, copying a large replay);
        # the wakeup pipe gets a byte for every signal, so two of them are never taken for one.
        self.wakeup, wakeup_write = os.pipe()
        os.set_blocking(self.wakeup, False)
        os.set_blocking(wakeup_write, False)
        self.previous_wakeup = signal.set_wakeup_fd(wakeup_write)
        # TensorBoard writes from a thread of its own, which prints a traceback when the disk is full before the
        # error reaches this thread (and `__exit__`, which says it in one line).
        self.previous_excepthook, threading.excepthook = threading.excepthook, self._thread_exception
        self.created = checkpoint is None
        try:
            self.open_run_dir(checkpoint)
            self.start_logs(checkpoint)
        except BaseException as error:  # a signal or an error while starting: nothing of this run is left half made
            self.__exit__(type(error), error, None)
            raise

    def open_run_dir(self, checkpoint: Optional[dict]) -> None:
        args = self.args
        if checkpoint is None:
            self.name = new_run_name(args)
            self.dir = f"runs/{self.name}"
        else:
            self.name, self.dir = checkpoint["run_name"], resumed_run_dir(args.resume, checkpoint)
            check_writable_home(self.dir)
            self.created = not os.path.isdir(self.dir)
            make_run_dir(self.dir, exist_ok=True)
        self.lock = lock_run_dir(self.dir)
        self.checkpoint_path = f"{self.dir}/checkpoint.pt"
        self.last_checkpoint = None
        if checkpoint is not None:
            check_newer_checkpoint(self.checkpoint_path, args.resume, checkpoint)
            self.last_checkpoint = args.resume

    def start_logs(self, checkpoint: Optional[dict]) -> None:
        args = self.args
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

    def print_start(self, setting: dict) -> None:
        """The start-up block, printed before anything slow: what runs, where it logs, on what."""
        args, script = self.args, os.path.basename(self.script)
        if self.checkpoint:
            print(f"{script}: resuming {args.env_id}, seed {args.seed}, at step {self.checkpoint['global_step']}")
            changed = self.checkpoint.get("changed")
            print(f"  flags changed on resume: {', '.join(changed)}" if changed else "  flags: all as in the checkpoint")
        else:
            print(f"{script}: {args.env_id}, seed {args.seed}, {args.total_timesteps} agent steps")
        print(f"  run directory: {self.dir}  (watch it: tensorboard --logdir {os.path.dirname(self.dir) or '.'})")
        every = args.checkpoint_every
        when = (
            f"every {every} agent steps and at the end" if every else "only when a signal stops the run (--checkpoint-every 0)"
        )
        print(f"  checkpoint: {self.dir}/checkpoint.pt, {when}")
        if getattr(args, "save_model", False):
            videos = f", videos in {self.dir}/videos/" if getattr(args, "capture_video", False) else ""
            print(f"  model: {self.dir}/{args.exp_name}.cleanrl_model after training, then evaluated{videos}")
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

    def progress(self, start_step: int, updates_per_step: float = 0.0) -> Progress:
        """The progress line of this run, its time left measured from the step learning (re)starts at (with
        `updates_per_step`: from the acting time per step and the time per update, see `Progress`); Atari on a CPU
        warns with the first estimate if the run would take over a day more."""
        slow = self.device.type == "cpu" and self.args.env_id.endswith("-v5")
        learning_starts = self.learning_resumes_at or getattr(self.args, "learning_starts", 0)
        hint = self.slow_hint() if slow else None
        return Progress(
            self.args.total_timesteps, start_step, learning_starts, slow_hint=hint, updates_per_step=updates_per_step
        )

    def note_empty_replay(self, learning_resumes_at: int) -> None:
        """Says, on a resume without --checkpoint-replay, that the replay restarts empty and when learning resumes."""
        self.learning_resumes_at = learning_resumes_at
        print(
            f"resume: the replay was not saved (--checkpoint-replay was off): it refills from empty, and learning "
            f"resumes at step {learning_resumes_at}"
        )

    def save_and_evaluate(self, network: nn.Module, evaluate: Callable, device: torch.device) -> list[float]:
        """--save-model at the end of training: writes the model file, then plays the evaluation episodes with it
        (recorded with --capture-video), logs their scores and prints their mean."""
        if self.stop_requested:  # asked to stop before the loop took a step (a resume of a finished run)
            global stop_signal
            self.stopped, stop_signal = True, self.signum
            print(f"stopped before the final evaluation; the checkpoint is unchanged: {self.last_checkpoint}")
            return []
        path = f"{self.dir}/{self.args.exp_name}.cleanrl_model"
        try:
            save_model(path, self.script, self.args, network)
        except (OSError, RuntimeError) as error:  # torch.save reports a full disk as a RuntimeError
            last = self.last_checkpoint or "none written"
            stop_on_disk_error(f"error: writing the model file {path} failed ({error}); last good checkpoint: {last}")
        print(f"model saved to {path}")
        self.eval_scores = evaluate(path, self.args, device, f"{self.dir}/videos")  # with --capture-video
        for episode, score in enumerate(self.eval_scores):
            self.writer.add_scalar("eval/episodic_return", score, episode)
        print(evaluation_line(path, self.eval_scores))
        if getattr(self.args, "capture_video", False):
            print(f"videos in {self.dir}/videos")
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
        self.signum, arrived, name = signum, 1, signal.Signals(signum).name
        with contextlib.suppress(BlockingIOError):
            arrived = len(os.read(self.wakeup, 64))
        last = self.last_checkpoint or "none"
        if self.writing and (self.stop_requested or arrived > 1):
            # A checkpoint is being written by another thread, inside torch: the process ends now, without the
            # interpreter's shutdown (which would abort that thread); the temporary file is removed by `save`'s caller
            # never returning, so it is removed here. The logs were flushed before the write began.
            with contextlib.suppress(OSError):
                os.remove(self.writing)
            print(f"exiting at once on {name}, during a checkpoint write; last good checkpoint: {last}", flush=True)
            os._exit(128 + signum)
        if self.training_done:
            self.restore_handlers()
            print(f"exiting on {name}: training had finished; the final evaluation is not done; last checkpoint: {last}")
            raise SystemExit(128 + signum)
        if self.stop_requested or self.replaying or arrived > 1:  # a second signal, or nothing new to save yet: exit at once
            self.restore_handlers()
            print(f"exiting at once on {name}; last good checkpoint: {last}")
            raise SystemExit(128 + signum)
        self.stop_requested = True
        print(f"{name}: stopping after this step, with a checkpoint; a second signal exits at once")

    def _thread_exception(self, hook_args) -> None:
        if not (isinstance(hook_args.exc_value, OSError) and hook_args.exc_value.errno in DISK_ERRORS):
            self.previous_excepthook(hook_args)

    def restore_handlers(self) -> None:
        threading.excepthook = self.previous_excepthook
        for sig, handler in self.previous_handlers.items():
            signal.signal(sig, handler)
        if self.wakeup is not None:
            os.close(signal.set_wakeup_fd(self.previous_wakeup))
            os.close(self.wakeup)
            self.wakeup = None

    def close(self, remove_if_new: bool = False) -> None:
        """Restores the signal handlers, closes the logs, releases the lock. `remove_if_new`: a run folder this run
        created and that holds no checkpoint (a run stopped before its first step) is removed, not left empty."""
        self.restore_handlers()
        if self.writer is not None:
            with contextlib.suppress(OSError):
                self.writer.close()
        if self.args.track and self.writer is not None:
            import wandb

            wandb.finish()
        if self.lock is not None:
            if remove_if_new and self.created and self.last_checkpoint is None and self.global_step == self.start_step:
                shutil.rmtree(self.dir, ignore_errors=True)
            os.close(self.lock)
            self.lock = None

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        self.close(remove_if_new=kind is not None)
        if isinstance(error, OSError) and error.errno in DISK_ERRORS:  # a full disk, a read-only folder: one line
            where = f" {error.filename}" if error.filename else ""
            last = self.last_checkpoint or "none written"
            stop_on_disk_error(f"error: writing{where} failed: {error.strerror or error}; last good checkpoint: {last}")

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
        print(
            f"resume: replaying {action_log.size} logged agent steps ({len(action_log)} steps of {envs_count} envs) to "
            "rebuild the environments (envpool cannot save them; --resume-fresh-envs skips this)",
            flush=True,
        )
        stepped, self.replaying, started = None, True, time.time()
        last = started
        for row, actions in enumerate(action_log, 1):
            stepped = envs.step(actions.astype(action_dtype))[0]
            # The first line, after a second, says how long the replay takes; then one every `Progress` interval.
            if time.time() - last >= (10.0 if last > started else 1.0) and row < len(action_log):
                last = time.time()
                left = (len(action_log) - row) * (last - started) / row
                done = f"{row * envs_count}/{action_log.size} agent steps ({100 * row / len(action_log):.0f}%)"
                print(f"resume: replayed {done}, {format_duration(left)} left", flush=True)
        if last > started:
            print(f"resume: replay done in {format_duration(time.time() - started)}")
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
        try:
            for key, value in state.items():
                load_into(value, saved[key])
            learning_rate = getattr(self.args, "learning_rate", None)
            if learning_rate != self.checkpoint["args"].get("learning_rate", learning_rate):
                for value in state.values():  # a restored optimizer brings back its saved step size: the given one wins
                    set_learning_rate(value, learning_rate)
            set_rng_states(self.checkpoint["rng"])
        except (RuntimeError, ValueError, TypeError, KeyError, IndexError) as error:
            first = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
            flag_error("resume", self.args.resume, f"its state does not fit this run ({type(error).__name__}: {first})")
        step, restored = self.checkpoint["global_step"], ", ".join(sorted(saved))
        print(f"resume: continuing {self.name} from step {step}; restored {restored} and the random generators")
        return saved

    def save(self, global_step: int, state: dict) -> str:
        """Writes beside the previous checkpoint, syncs, then renames over it: a crash, a full disk or a second signal
        while writing leaves that one whole. A state holding NaN or inf is not written (the previous one stays good).
        Numpy arrays are stored as tensors of their bytes, so that the file loads with `weights_only=True`."""
        learned = [key for key, value in state.items() if isinstance(value, (nn.Module, torch.optim.Optimizer))]
        state = {key: state_of(value) for key, value in state.items()}
        header = dict(format=self.format, script=os.path.basename(self.script), args=vars(self.args), run_name=self.name)
        checkpoint = dict(header, wandb_id=self.wandb_id, global_step=global_step, rng=rng_states(), state=state)
        checkpoint["envs_start"] = self.envs_start
        if not all_finite([state[key] for key in learned]):  # weights, optimizer moments (buffers may hold inf by design)
            raise SystemExit(
                f"error: non-finite values in the state at step {global_step}; no checkpoint written; "
                f"last good checkpoint: {self.last_checkpoint or 'none written'}"
            )
        checkpoint["digest"] = content_digest(checkpoint)
        checkpoint = to_safe(checkpoint)
        self.writer.flush()  # the logs up to this step are on disk before the checkpoint that vouches for them
        handle, tmp = new_temporary_file(self.checkpoint_path)
        failed = []

        def write():
            try:
                with os.fdopen(handle, "wb") as file:
                    torch.save(checkpoint, file)
                    file.flush()
                    os.fsync(file.fileno())
            except BaseException as error:
                failed.append(error)

        # Written by a helper thread, so that this one stays free to answer a second signal at once.
        writer = threading.Thread(target=write, daemon=True)
        try:
            self.writing = tmp
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
                stop_on_disk_error(
                    f"error: writing the checkpoint failed at step {global_step} ({error}); is the disk full? "
                    f"last good checkpoint: {self.last_checkpoint or 'none written'}"
                )
            raise
        finally:
            self.writing = False
        self.last_checkpoint = self.checkpoint_path
        return self.checkpoint_path

    def checkpoint_or_stop(self, global_step: int, steps: int, last: bool, state: Callable[[], dict]) -> bool:
        """Call once at the end of every iteration, after its logging, with the `steps` it took. Writes a checkpoint
        when global_step crossed a multiple of --checkpoint-every, at the last iteration (if checkpointing), or when
        a signal asked to stop; returns True when the loop must stop."""
        every, stopping = self.args.checkpoint_every, self.stop_requested  # read once: a later signal waits a step
        self.global_step = global_step
        crossed = every > 0 and global_step // every > (global_step - steps) // every
        saved = crossed or stopping or (every > 0 and last)
        if saved:
            self.save(global_step, state())
        if last and self.stop_requested and not stopping:  # asked to stop during the last step: stop, as promised
            stopping = True
            if not saved:
                self.save(global_step, state())
        self.training_done = last and not stopping
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
    """A model file holds the weights and every flag of the run, which rebuild the network (sizes, env) later. It is
    written whole or not at all (a temporary file renamed over `path`)."""
    model = {"kind": MODEL_FILE, "script": os.path.basename(script), "args": vars(args), "model": network.state_dict()}
    write_atomically(path, lambda file: torch.save(model, file))


def read_model_file(path: str, device="cpu") -> dict:
    """The contents of a model file, loaded without running code (`weights_only=True`: tensors and plain values only);
    a file of bare weights (written before flags were saved) reads as {"model": ...}."""
    try:
        saved = load_safely(path, device)
    except Exception as error:
        flag_error("model_path", path, f"not a readable model file ({unreadable_reason(error)})")
    if isinstance(saved, dict) and {"format", "digest", "state"} <= set(saved):
        flag_error("model_path", path, "a checkpoint, not a model file: --save-model writes one (or --resume this)")
    return saved if isinstance(saved, dict) and saved.get("kind") == MODEL_FILE else {"model": saved}


def unreadable_reason(error: Exception) -> str:
    """One line on why torch.load refused a file: torch's own message on unpickling runs over many lines."""
    if isinstance(error, pickle.UnpicklingError) and "Weights only load failed" in str(error):
        return "it holds Python objects other than tensors and plain values; loading those could run code, so it is not"
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else 'unreadable'}"


def load_weights(network: nn.Module, path: str, device) -> None:
    """Loads the weights of a model file into `network`, or stops with one line when they do not fit it (a file of
    another script, or of bare weights saved with other network sizes)."""
    weights = read_model_file(path, device)["model"]
    try:
        network.load_state_dict(weights)
    except (RuntimeError, TypeError, AttributeError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        flag_error("model_path", path, f"its weights do not fit this script's network ({first.strip()[:160]})")


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
    # Seeded, so that an evaluation repeats exactly; a training run's own evaluation instead continues the generators
    # that training advanced (same environment seeds, other random draws: see docs/get-started/basic-usage.md).
    seed_everything(args.seed, getattr(args, "torch_deterministic", True))
    device = pick_device(args.cuda)
    print(f"{name}: evaluating {args.model_path} on {args.env_id}, device {describe_device(device, args.cuda)}")
    # No run folder: an evaluation leaves nothing in the model's run folder, whose run may be going on.
    video_folder = f"videos/{os.path.basename(os.path.dirname(os.path.abspath(args.model_path)))}-eval-{int(time.time())}"
    scores = evaluate(args.model_path, args, device, video_folder)
    print(evaluation_line(args.model_path, scores))
    if args.capture_video:
        print(f"videos in {video_folder}")
    return scores


def make_video_env(
    env_id: str, video_folder: str, frame_stack: int = 4, max_episode_steps: Optional[int] = None, episodic_life: bool = True
):
    """A recording gymnasium env for --capture-video (envpool does not render): for Atari ids, ale-py's env with the
    training preprocessing (NOOP starts, 4-frame skip, 84x84 grayscale, `frame_stack` frames); else gymnasium's own.
    `episodic_life` is the training env's envpool flag: with it envpool presses FIRE after every lost life, without
    it only at the start of a game, so the recorded game is the one trained and scored."""
    check_video_modules(env_id)
    if minatar.is_minatar(env_id):
        return minatar.make_video_env(env_id, video_folder)
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # frames are drawn off-screen: no display needed (or complained of)
    if env_id.endswith("-v5"):
        import ale_py

        gym.register_envs(ale_py)
    if not env_id.endswith("-v5"):
        return gym.wrappers.RecordVideo(gym.make(env_id, render_mode="rgb_array"), video_folder, lambda _: True)
    frames = {} if max_episode_steps is None else {"max_num_frames_per_episode": 4 * max_episode_steps}
    env = gym.make(f"ALE/{env_id}", frameskip=1, repeat_action_probability=0.0, render_mode="rgb_array", **frames)
    env = gym.wrappers.RecordVideo(env, video_folder, episode_trigger=lambda _: True)
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
