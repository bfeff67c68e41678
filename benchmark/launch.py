"""Run one training command for every (env id, seed) pair, a few at a time.

    python benchmark/launch.py --env-ids CartPole-v1 Acrobot-v1 --seeds 1 2 3 --workers 2 -- \
        python cleanrl/pqn.py --no-track

Everything after `--` is the command; `--env-id E --seed S` is appended to it for each pair. Runs are ordered
seed-major (seed 1 of every env first), so a benchmark stopped halfway still covers every env. Each run's
output is echoed line by line with an `[env seed]` prefix and, with `--log-dir`, also saved to a file. The
launcher prints a summary and exits with status 1 if any run failed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Job:
    env_id: str
    seed: int
    command: list[str]
    returncode: int | None = None
    seconds: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.env_id} seed {self.seed}"


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Splits argv at the first `--` into launcher options and the command to launch."""
    if "--" not in argv:
        raise SystemExit("error: missing `-- <command...>`: put the training command after a lone `--`")
    split = argv.index("--")
    command = argv[split + 1 :]
    parser = argparse.ArgumentParser(
        prog="launch.py",
        description="Run `<command> --env-id E --seed S` for every env id and seed, N at a time.",
        usage="%(prog)s --env-ids ID [ID ...] --seeds S [S ...] [--workers N] [--log-dir DIR] [--dry-run] -- command...",
    )
    parser.add_argument("--env-ids", nargs="+", required=True, help="environment ids, passed as --env-id")
    parser.add_argument("--seeds", nargs="+", type=int, required=True, help="seeds, passed as --seed")
    parser.add_argument("--workers", type=int, default=1, help="how many runs execute at the same time")
    parser.add_argument("--log-dir", type=Path, default=None, help="also save each run's output to DIR/<env>__<seed>.log")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and run nothing")
    args = parser.parse_args(argv[:split])
    if not command:
        parser.error("the command after `--` is empty")
    if args.workers < 1:
        parser.error(f"--workers={args.workers}: must be at least 1")
    return args, command


def make_jobs(env_ids: list[str], seeds: list[int], command: list[str]) -> list[Job]:
    return [Job(env_id, seed, [*command, "--env-id", env_id, "--seed", str(seed)]) for seed in seeds for env_id in env_ids]


def run_job(job: Job, log_dir: Path | None, print_lock: threading.Lock) -> Job:
    """Runs one job to completion, echoing its output with a prefix; records exit code and duration."""
    prefix = f"[{job.env_id} {job.seed}] "
    log_file = None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        log_file = open(log_dir / f"{job.env_id}__{job.seed}.log", "w")
    start = time.time()
    try:
        # PYTHONUNBUFFERED: a Python child writing to a pipe would otherwise hold its progress lines back.
        with subprocess.Popen(
            job.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            errors="replace",
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        ) as process:
            for line in process.stdout:
                with print_lock:
                    print(prefix + line, end="", flush=True)
                if log_file is not None:
                    log_file.write(line)
        job.returncode = process.returncode
    except OSError as error:  # the program itself could not be started
        with print_lock:
            print(f"{prefix}could not start: {error}", flush=True)
        job.returncode = 127
    finally:
        if log_file is not None:
            log_file.close()
    job.seconds = time.time() - start
    return job


def print_summary(jobs: list[Job]) -> None:
    print("\nSummary")
    for job in jobs:
        if job.returncode is None:
            status = "not run"
        else:
            status = "ok" if job.returncode == 0 else f"FAILED (exit {job.returncode})"
        print(f"  {job.label:<36} {job.seconds / 60:8.2f} min  {status}")
    failed = sum(job.returncode != 0 for job in jobs)
    print(f"{len(jobs) - failed}/{len(jobs)} runs succeeded" + (f", {failed} failed" if failed else ""))


def main(argv: list[str] | None = None) -> int:
    args, command = parse_args(sys.argv[1:] if argv is None else argv)
    jobs = make_jobs(args.env_ids, args.seeds, command)
    if args.dry_run:
        for job in jobs:
            print(shlex.join(job.command))
        return 0
    print(f"Launching {len(jobs)} runs, {args.workers} at a time")
    print_lock = threading.Lock()
    pool = ThreadPoolExecutor(max_workers=args.workers)
    try:
        list(pool.map(lambda job: run_job(job, args.log_dir, print_lock), jobs))
    except KeyboardInterrupt:
        # Ctrl-C already reached the running children (same process group); start no queued run.
        print("\nInterrupted: waiting for the running runs to stop, starting no new ones")
        pool.shutdown(wait=True, cancel_futures=True)
    pool.shutdown()
    print_summary(jobs)
    return 0 if all(job.returncode == 0 for job in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
