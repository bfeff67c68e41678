"""Where a run writes and what it runs on: the run's name and folder (created exclusively, locked while the run
lives, and on resume chosen so that a run never writes into another's files), the stop on a full or read-only disk,
seeding, the device, the software versions logged with the hyperparameters, and the start-up block that says it all.

Layer 4 (run plumbing): imports checkpoint_files and classic_control."""

import contextlib
import ctypes
import errno
import fcntl
import os
import random
import shlex
import subprocess
import sys
import time
from typing import NoReturn, Optional

import gymnasium as gym
import numpy as np
import torch

from cleanrl_q_utils import classic_control
from cleanrl_q_utils.checkpoint_files import load_safely


def seed_everything(seed: int, torch_deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = torch_deterministic


def pick_device(cuda: bool, cpu_threads: Optional[int] = None) -> torch.device:
    """CUDA when asked for and present, else the CPU with `cpu_threads` intra-op threads (None: torch's default).
    Small networks run faster on one thread: more threads only add synchronization to every call."""
    device = torch.device("cuda" if cuda and torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        if cpu_threads is not None:
            torch.set_num_threads(cpu_threads)
        keep_freed_memory()
    return device


def keep_freed_memory() -> None:
    """Have glibc's malloc keep the memory of freed tensors of up to 32 MiB for the next ones. By default it hands
    such blocks back to the kernel and takes them again, zero-filled page by page, at every forward pass: IQN's
    target pass on a MinAtar batch (32 x 40 quantiles x 1024 features) ran 1.6 times slower for it. No-op elsewhere."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # from glibc's malloc.h
    mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024)  # glibc's largest: bigger blocks (replay buffers) still mmap
    mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024)


def describe_device(device: torch.device, cuda: bool) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    why = "no CUDA device found" if cuda else "--no-cuda"
    return f"cpu, {torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''} ({why})"


def software_versions(script: str) -> dict:
    """The versions a result depends on, logged with the hyperparameters: torch, envpool, gymnasium, and the git commit
    of the scripts (with "+changes" when the working tree differs from it); envpool "not installed" where classic
    control runs on gymnasium."""
    envpool = classic_control.import_envpool()

    def git(*command):
        try:
            done = subprocess.run(["git", *command], cwd=os.path.dirname(script), capture_output=True, text=True, timeout=5)
            return done.stdout.strip() if done.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            return None

    commit = git("rev-parse", "--short", "HEAD")
    if commit and git("status", "--porcelain", "--untracked-files=no"):
        commit += "+changes"
    return dict(
        torch=torch.__version__,
        envpool=envpool.__version__ if envpool else "not installed",
        gymnasium=gym.__version__,
        git=commit or "unknown",
    )


DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO)


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
    try:  # checked and memory-mapped: only the few plain values are read, not the tensors
        present = load_safely(path, mmap=True)
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


def open_run_folder(args, checkpoint: Optional[dict]) -> tuple[str, str, bool, int]:
    """(name, folder, created, lock) of a run: a new folder for a new run; for a resume the run's own folder (see
    `resumed_run_dir`), refused if it is read-only or holds a newer checkpoint of the run. The folder is locked."""
    if checkpoint is None:
        name = new_run_name(args)
        folder, created = f"runs/{name}", True
    else:
        name, folder = checkpoint["run_name"], resumed_run_dir(args.resume, checkpoint)
        check_writable_home(folder)
        created = not os.path.isdir(folder)
        make_run_dir(folder, exist_ok=True)
    lock = lock_run_dir(folder)
    if checkpoint is not None:
        try:
            check_newer_checkpoint(f"{folder}/checkpoint.pt", args.resume, checkpoint)
        except BaseException:
            os.close(lock)
            raise
    return name, folder, created, lock


def print_start_block(
    args, script: str, run_dir: str, checkpoint, device: torch.device, setting: dict, memory: Optional[list] = None
) -> None:
    """The start-up block, printed before anything slow: what runs, where it logs, on what, and with `memory` (what
    flag_checks.check_run_memory checked) how much memory the run will take."""
    name = os.path.basename(script)
    if checkpoint:
        print(f"{name}: resuming {args.env_id}, seed {args.seed}, at step {checkpoint['global_step']}")
        changed = checkpoint.get("changed")
        print(f"  flags changed on resume: {', '.join(changed)}" if changed else "  flags: all as in the checkpoint")
    else:
        print(f"{name}: {args.env_id}, seed {args.seed}, {args.total_timesteps} agent steps")
    print(f"  run directory: {run_dir}  (watch it: tensorboard --logdir {shlex.quote(os.path.dirname(run_dir) or '.')})")
    every = args.checkpoint_every
    when = f"every {every} agent steps and at the end" if every else "only when a signal stops the run (--checkpoint-every 0)"
    print(f"  checkpoint: {run_dir}/checkpoint.pt, {when}")
    if getattr(args, "save_model", False):
        videos = f", videos in {run_dir}/videos/" if getattr(args, "capture_video", False) else ""
        print(f"  model: {run_dir}/{args.exp_name}.cleanrl_model after training, then evaluated{videos}")
    versions = ", ".join(f"{package} {setting[package]}" for package in ("torch", "envpool", "gymnasium"))
    print(f"  device: {setting['device']} | {versions} | git {setting['git']}")
    if memory:
        print(f"  memory: {memory_line(memory)}")
    if device.type == "cpu" and args.env_id.endswith("-v5"):
        soon = "the first progress line, in 10 s, estimates how long the run takes"
        print(f"warning: Atari on a CPU is slow ({soon}); {slow_hint(script)}")


def format_bytes(size: int) -> str:
    """`7.3 GB`, `52 MB`, `40 kB` (powers of 1,000, as the memory pre-flight's messages)."""
    if size >= 1e9:
        return f"{size / 1e9:,.1f} GB"
    return f"{size / 1e6:,.0f} MB" if size >= 1e6 else f"{size / 1e3:,.0f} kB"


def memory_line(memory: list[tuple[str, list[tuple[str, int]], int]]) -> str:
    """What a run will take, from what flag_checks.check_run_memory checked: the total of each place (the RAM, and the
    GPU's for a run there) with its three largest shares (those of at least a hundredth of it), against what is
    available there. numpy and torch take memory as it is first written, so a run grows into its replay over hours;
    said at the start, a user sees at once what it will come to (Python, torch and envpool themselves not counted)."""
    places = []
    for where, needs, available in memory:
        total = sum(size for _, size in needs)
        largest = sorted(needs, key=lambda need: -need[1])[:3]
        shares = [f"{what} {format_bytes(size)}" for what, size in largest if size * 100 >= total]
        free = "free" if where else "available"
        places.append(f"about {format_bytes(total)}{where} ({', '.join(shares)}) of {format_bytes(available)} {free}")
    return "; ".join(places)


def slow_hint(script: str) -> str:
    """Where to go instead of a days-long Atari run on a CPU: the classic-control twin of the script."""
    name = os.path.basename(script)
    twin = name.replace("_atari_envpool_lstm", "").replace("_atari_envpool", "").replace("_atari", "")
    instead = f"cleanrl/{twin}" if twin != name else f"{name} --env-id CartPole-v1"
    return f"for a first run on a CPU, try `python {instead}` or a smaller --total-timesteps"
