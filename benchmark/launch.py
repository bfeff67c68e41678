"""Run one training command for every (env id, seed) pair: here a few at a time, or on a Ray cluster or Slurm.

    python benchmark/launch.py --env-ids CartPole-v1 Acrobot-v1 --seeds 1 2 3 --workers 2 -- \
        python cleanrl/pqn.py --no-track

Everything after `--` is the command; `--env-id E --seed S` is appended to it for each pair. Runs are ordered
seed-major (seed 1 of every env first), so a benchmark stopped halfway still covers every env. Each run's
output is echoed line by line with an `[env seed]` prefix and, with `--log-dir`, also saved to a file. The
launcher prints a summary, one row per run with its final return and run folder (read from the `run directory:` line
the run printed, wherever its runs/ is) and, for a run that failed, one line saying why (its last `error:` line or
exception, else how it exited); it exits with status 1 if any run failed (2 if it could not start at all).

`--backend ray` runs every pair as a Ray task with `--cpus-per-run`/`--gpus-per-run` on the cluster at
`--ray-address` (default: a new local one); `--backend slurm` submits them as a Slurm job array through submitit.
With `--output-dir` (the default for both), each pair runs in its own directory `<output-dir>/<exp>/<env>__<seed>/`,
which holds its `runs/<run name>/` and its `console.log`. A run that fails, or whose node dies, is retried up to
`--max-retries` times, and a retry resumes from the run's checkpoint (`--checkpoint-every` is passed on); a Slurm
job that is preempted or reaches `--time` stops its run with a checkpoint and is requeued to resume it. Running the
same command again skips the runs that finished and resumes the others; a run folder that holds a run of another
command is refused. The launcher creates files only below --output-dir (and --log-dir). SIGINT, SIGTERM or SIGHUP to
the launcher (local, ray) stops the running runs, which write their checkpoints; the launcher waits for them and
exits with 128 + the signal's number. docs/cluster.md has the details.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NoReturn

BACKENDS = ("local", "ray", "slurm")
EXTRA = {"ray": "ray", "slurm": "submitit"}
DEFAULT_OUTPUT_DIR = "cluster-runs"  # of the ray and slurm backends; the local backend runs in the current directory
FRESH_RESUME = "--resume-fresh-envs"  # how the cluster backends resume: new games, at a cost independent of the step
# A run stopped by SIGINT, SIGTERM or SIGHUP (after writing its checkpoint) exits with 128 + the signal's number; one
# killed by it before the script could answer has the negative number. Either way it was asked to stop: no retry.
STOP_CODES = {code for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) for code in (128 + sig, -sig)}
LAST_EPISODES = 100
# Slurm: how often one run may be cut by --time and requeued (submitit's max_num_timeout); each piece resumes.
MAX_TIMEOUTS = 100
STOPPED_BEFORE_START = "not started: the launcher was stopped"
CANCELLED = "cancelled: the launcher was stopped"  # a Ray task: not started, or killed by a second Ctrl-C
RECORD = "launch.json"  # in a run's folder: the exact command it runs, and its result once it ended
REPO = Path(__file__).resolve().parents[1]
EXP_NAME_RULE = "must be a name the scripts accept for --exp-name: one folder name (no '/', not '.' or '..')"


def load_name_rule() -> Callable[[str, int], bool]:
    """The scripts' own rule for --exp-name (cleanrl_q_utils.flag_errors.is_plain_name): what a script refuses, the
    launcher refuses before it makes a folder of it. The repository is searched last, after an installed package."""
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))
    from cleanrl_q_utils.flag_errors import is_plain_name

    return is_plain_name


@dataclass
class Job:
    env_id: str
    seed: int
    command: list[str]
    workdir: str | None = None
    """the run's own working directory (its runs/ and console.log); None: the launcher's directory, as before"""
    log_path: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    """environment variables added to the command's (WANDB_RUN_GROUP)"""
    returncode: int | None = None
    seconds: float = 0.0
    attempts: int = 0
    final_return: float | None = None
    note: str = ""
    """what happened instead of a run: "finished before", "already running", "lost: NodeDiedError", ..."""
    run_dir: str | None = None
    """the run's folder, from the `run directory:` line of its start-up block (relative to the launcher's directory
    when it is below it)"""
    error_line: str = ""
    """the last line of the run's output that says what went wrong: an `error: ...` line or an exception's last line"""

    @property
    def label(self) -> str:
        return f"{self.env_id} seed {self.seed}"

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def status(self) -> str:
        if self.returncode is None:
            return self.note or "not run"
        if self.returncode == 0:
            return "ok" + (f" ({self.note})" if self.note else "")
        return f"{'stopped' if self.returncode in STOP_CODES else 'FAILED'} (exit {self.returncode})"

    @property
    def why(self) -> str:
        """One line on why a run did not succeed: its last error line, else how its process ended."""
        if self.returncode in (None, 0):
            return ""
        if self.error_line:
            return self.error_line
        if self.returncode < 0:
            return f"killed by signal {signal_name(-self.returncode)}"
        if self.returncode > 128 and self.returncode - 128 in signal.valid_signals():
            return f"exit status {self.returncode} (128 + {signal_name(self.returncode - 128)})"
        return f"exit status {self.returncode}, no error line in its output"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


# The start-up block's line `  run directory: PATH  (watch it: ...)`: PATH may hold spaces (a folder above the run).
RUN_DIRECTORY = re.compile(r"^\s*run directory: (.+?)(?:  \(watch it: .*)?$")
# The last line of a Python traceback (`ValueError: ...`, `KeyboardInterrupt`), or one of the scripts' `error:` lines.
ERROR_LINE = re.compile(r"^(error: |[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b)")


def shown_path(path: Path) -> str:
    """The path relative to the launcher's directory when it is below it, else absolute."""
    path = path.absolute()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def read_output_line(job: Job, line: str) -> None:
    """Keeps what the summary needs from a line of the run's output: its run folder and its last error line."""
    found = RUN_DIRECTORY.match(line)
    if found is not None:
        job.run_dir = shown_path(Path(job.workdir or ".", found[1]))
    elif ERROR_LINE.match(line):
        job.error_line = line.strip()


def say(text: str = "", stream=None) -> None:
    """Prints a line of the launcher's own. Output that cannot be written (a closed pipe, a closed terminal: EPIPE,
    EIO) must not stop the launcher while runs depend on it: the stream is pointed at /dev/null and all goes on."""
    stream = sys.stdout if stream is None else stream
    if stream is None:  # started with its output closed (`>&-`): Python has no stream to write to
        return
    try:
        stream.write(text + "\n")
        stream.flush()
    except OSError:
        silence(stream)


def silence(stream) -> None:
    """Sends what is still to be written to the stream, and what comes later, to /dev/null (so that the flush at exit
    cannot fail either)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def fail(message: str) -> NoReturn:
    """Stops the launcher, before any run started, with one line."""
    say(f"error: {message}", sys.stderr)
    sys.exit(2)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as every other error of the launcher
        fail(message)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Splits argv at the first `--` into launcher options and the command to launch."""
    if "--" not in argv and not {"-h", "--help"} & set(argv):
        fail("missing `-- <command...>`: put the training command after a lone `--`")
    split = argv.index("--") if "--" in argv else len(argv)
    command = argv[split + 1 :]
    parser = Parser(
        prog="launch.py",
        description="Run `<command> --env-id E --seed S` for every env id and seed: locally, on Ray or on Slurm.",
        usage="%(prog)s --env-ids ID [ID ...] --seeds S [S ...] [--backend {local,ray,slurm}] [options] -- command...",
    )
    parser.add_argument("--env-ids", nargs="+", required=True, help="environment ids, passed as --env-id")
    parser.add_argument("--seeds", nargs="+", type=int, required=True, help="seeds, passed as --seed")
    parser.add_argument("--backend", choices=BACKENDS, default="local", help="where the runs execute (default: local)")
    parser.add_argument(
        "--workers", type=int, default=1, help="local: how many runs execute at the same time (ray and slurm: as many as "
        "the resources allow)"
    )  # fmt: skip
    parser.add_argument("--log-dir", type=Path, default=None, help="also save each run's output to DIR/<env>__<seed>.log")
    parser.add_argument("--dry-run", action="store_true", help="print what would run (for slurm the sbatch script)")
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help=f"run each pair in OUTPUT_DIR/<exp>/<env>__<seed>/ (ray, slurm: default {DEFAULT_OUTPUT_DIR}; local: "
        "default the current directory, without retries)",
    )
    parser.add_argument(
        "--max-retries", type=int, default=None, help="retries of a failed run, each resuming its checkpoint (default: "
        "0 local, 2 ray and slurm)"
    )  # fmt: skip
    parser.add_argument("--checkpoint-every", type=int, default=None, help="passed on to the command as --checkpoint-every")
    parser.add_argument(
        "--resume-args",
        default=None,
        help="flags added when a run resumes its checkpoint (default: --resume-fresh-envs on ray and slurm, whose resume "
        "costs the same at any step; none locally). --resume-args= resumes by fast-forwarding the environments through the "
        "logged actions (exact)",
    )
    parser.add_argument("--wandb-group", default=None, help="W&B group of the runs (WANDB_RUN_GROUP), with --track")
    parser.add_argument("--cpus-per-run", type=int, default=1, help="ray, slurm: CPU cores of one run (default 1)")
    parser.add_argument("--gpus-per-run", type=float, default=0, help="ray, slurm: GPUs of one run (default 0)")
    parser.add_argument("--mem-gb", type=float, default=None, help="ray, slurm: RAM of one run in GB")
    parser.add_argument("--ray-address", default=None, help="ray: the cluster, e.g. auto or HOST:6379 (default: start one)")
    parser.add_argument("--partition", default=None, help="slurm: the partition")
    parser.add_argument("--time", default="1-00:00:00", help="slurm: time limit of one job (MINUTES or D-HH:MM:SS)")
    parser.add_argument(
        "--slurm-option", action="append", default=[], metavar="KEY=VALUE", help="slurm: any other sbatch option, e.g. "
        "account=rl (repeatable)"
    )  # fmt: skip
    args = parser.parse_args(argv[:split])
    if not command:
        fail("the command after `--` is empty")
    for flag in ("workers", "max_retries", "checkpoint_every", "cpus_per_run"):
        value, least = getattr(args, flag), 0 if flag in ("max_retries", "checkpoint_every") else 1
        if value is not None and value < least:
            fail(f"--{flag.replace('_', '-')}={value}: must be at least {least}")
    for flag in ("env_ids", "seeds"):
        values = getattr(args, flag)
        if len(set(values)) != len(values):
            twice = next(value for value in values if values.count(value) > 1)
            fail(f"--{flag.replace('_', '-')}={' '.join(map(str, values))}: {twice} is given twice (each run once)")
    if args.gpus_per_run < 0:
        fail(f"--gpus-per-run={args.gpus_per_run}: must be at least 0")
    if args.mem_gb is not None and args.mem_gb <= 0:
        fail(f"--mem-gb={args.mem_gb}: must be more than 0")
    if args.backend != "local" and args.output_dir is None:
        args.output_dir = Path(DEFAULT_OUTPUT_DIR)
    if args.max_retries is None:
        args.max_retries = 0 if args.backend == "local" else 2
    if args.max_retries > 0 and args.output_dir is None:
        fail(f"--max-retries={args.max_retries}: needs --output-dir, where a retry finds the run's checkpoint")
    args.time_min = slurm_minutes(args.time)
    if args.resume_args is not None:
        try:
            shlex.split(args.resume_args)
        except ValueError as error:  # an unbalanced quote
            fail(f"--resume-args={args.resume_args}: {str(error).lower()}; quote it as a shell would")
    check_names(command, args.env_ids, args.seeds)
    for flag, folder in (("--output-dir", args.output_dir), ("--log-dir", args.log_dir)):
        if folder is not None and folder.exists() and not folder.is_dir():
            fail(f"{flag}={folder}: is a file, not a folder; name a folder (it is created if missing)")
    if not args.dry_run:  # a dry run writes nothing, so it needs no writable folder
        check_writable(args.output_dir, "--output-dir")
        if args.log_dir is not None:
            check_writable(args.log_dir, "--log-dir")
    return args, command


def check_names(command: list[str], env_ids: list[str], seeds: list[int]) -> None:
    """The launcher makes folders and files of the experiment name and of each env id and seed: each must be one plain
    name, which keeps every path it derives from them below --output-dir (or --log-dir)."""
    is_plain_name = load_name_rule()
    exp_name = experiment_name(command)
    if not is_plain_name(exp_name, 100):
        fail(f"--exp-name={exp_name} (in the command): {EXP_NAME_RULE}, at most 100 bytes")
    for env_id in env_ids:
        for seed in seeds:
            if not is_plain_name(job_folder_name(env_id, seed)):
                fail(f"--env-ids={env_id}: must give a folder name `<env id>__<seed>` of at most 255 bytes")
    folders = {}  # a '/' in an env id becomes '-' in its folder's name: two ids must not share a folder
    for env_id in env_ids:
        other = folders.setdefault(job_folder_name(env_id, 0), env_id)
        if other != env_id:
            shared = job_folder_name(env_id, 0).removesuffix("__0")
            fail(f"--env-ids={' '.join(env_ids)}: {other} and {env_id} would share the run folders {shared}__<seed>")


def check_writable(folder: Path | None, flag: str) -> None:
    """Stops before launching anything when the runs could not write their folders (a read-only folder)."""
    where = Path.cwd() if folder is None else folder
    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as error:
        name = "the working directory" if folder is None else f"{flag}={folder}"
        fail(f"{name}: the runs cannot write there ({error.strerror}); choose a folder you can write to")


def slurm_minutes(limit: str) -> int:
    """Minutes (rounded up) of a Slurm time limit: MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS or
    DAYS-HOURS[:MINUTES[:SECONDS]]."""
    if not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", limit):
        fail(f"--time={limit}: must be MINUTES, HH:MM:SS or D-HH:MM:SS")
    days, clock = limit.split("-") if "-" in limit else ("0", limit)
    parts = [int(part) for part in clock.split(":")]
    if "-" in limit:
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:
        hours, minutes, seconds = 0, parts[0], (parts + [0])[1]
    return int(days) * 1440 + hours * 60 + minutes + (seconds > 0)


def experiment_name(command: list[str]) -> str:
    """The command's --exp-name (the last one given, which is the one the script's parser keeps), else the script's
    name: the scripts' default exp_name."""
    names = []
    for i, arg in enumerate(command):
        if arg in ("--exp-name", "--exp_name") and i + 1 < len(command):
            names.append(command[i + 1])
        if arg.startswith(("--exp-name=", "--exp_name=")):
            names.append(arg.split("=", 1)[1])
    scripts = [Path(arg).stem for arg in command if arg.endswith(".py")]
    return names[-1] if names else scripts[0] if scripts else "run"


def job_folder_name(env_id: str, seed: int) -> str:
    """The name of a run's folder below <output-dir>/<exp>/ and of its log in --log-dir (without .log)."""
    return f"{env_id.replace('/', '-')}__{seed}"


def make_jobs(env_ids: list[str], seeds: list[int], command: list[str], args: argparse.Namespace | None = None) -> list[Job]:
    """One job per (env id, seed), seed-major. With args.output_dir, each job gets its own working directory, and
    the command's files (the script) are given by absolute path, as the run starts there."""
    extra, output_dir = [], None
    if args is not None and args.checkpoint_every is not None:
        extra = ["--checkpoint-every", str(args.checkpoint_every)]
    if args is not None and args.output_dir is not None:
        output_dir = args.output_dir.resolve() / experiment_name(command)
        command = [os.path.abspath(arg) if not arg.startswith("-") and os.path.isfile(arg) else arg for arg in command]
    env = {"WANDB_RUN_GROUP": args.wandb_group} if args is not None and args.wandb_group else {}
    jobs = []
    for seed in seeds:
        for env_id in env_ids:
            job = Job(env_id, seed, [*command, "--env-id", env_id, "--seed", str(seed), *extra], env=dict(env))
            if output_dir is not None:
                job.workdir = str(output_dir / job_folder_name(env_id, seed))
                job.log_path = f"{job.workdir}/console.log"
            if args is not None and args.log_dir is not None:
                job.log_path = str(args.log_dir.resolve() / f"{job_folder_name(env_id, seed)}.log")
            jobs.append(job)
    return jobs


def check_job_paths(jobs: list[Job], args: argparse.Namespace) -> None:
    """Every path the launcher will create or write, resolved (symbolic links followed), must lie below --output-dir
    (the run folders, their files, submitit's folder) or --log-dir (the logs): a link left in the output folder must not
    lead the launcher's writes elsewhere. Checked before anything is created."""
    for root, flag, paths in (
        (args.output_dir, "--output-dir", [path for job in jobs if job.workdir for path in job_paths(job.workdir)]),
        (args.log_dir, "--log-dir", [Path(job.log_path) for job in jobs if job.log_path and args.log_dir is not None]),
        (args.output_dir, "--output-dir", [Path(args.output_dir, "submitit")] if args.backend == "slurm" else []),
    ):
        for path in paths:
            if not path.resolve().is_relative_to(root.resolve()):
                fail(f"{flag}={root}: {path} leads to {path.resolve()}, outside it; remove that link")
    for job in jobs:
        if job.workdir and Path(job.workdir).exists() and not Path(job.workdir).is_dir():
            fail(f"--output-dir={args.output_dir}: {job.workdir} is a file, not a run folder; move it away")


def job_paths(workdir: str) -> list[Path]:
    """The paths in a run's folder that the launcher creates, writes or renames in."""
    folder = Path(workdir)
    return [folder.parent, folder, *(folder / name for name in ("runs", "console.log", ".lock", "finished", RECORD))]


def read_record(workdir: str) -> dict | None:
    """The run folder's record of its command (and result), None where there is none (a folder made before the
    launcher kept one) or it cannot be read."""
    try:
        record = json.loads(Path(workdir, RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("command"), list) else None


def write_record(workdir: str, record: dict) -> None:
    """Writes the record beside a temporary copy and renames it over the old one: a kill meanwhile leaves one whole."""
    path = Path(workdir, RECORD)
    temporary = path.with_name(f".{RECORD}.{os.getpid()}.{threading.get_ident()}")
    try:
        temporary.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(temporary, path)
    except OSError as error:  # a full disk: the run itself matters more than its record
        temporary.unlink(missing_ok=True)
        say(f"warning: could not write {path}: {error.strerror}", sys.stderr)


def other_command(job: Job) -> list[str] | None:
    """The command recorded in the job's folder where it is not the job's command (the folder holds another run)."""
    record = read_record(job.workdir) if job.workdir else None
    return record["command"] if record is not None and record["command"] != job.command else None


def check_commands(jobs: list[Job], output_dir: Path) -> None:
    """A run folder holds one run of one command: a folder whose run was started by another command is refused
    before anything runs, so that neither its result is taken for the new command's nor its checkpoint resumed by it."""
    for job in jobs:
        recorded = other_command(job)
        if recorded is not None:
            fail(
                f"--output-dir={output_dir}: {job.workdir} holds a run of another command ({shlex.join(recorded)}); "
                "to run this command, use a new --output-dir or --exp-name, or delete that folder"
            )


# ----- one run, with retries: what every backend executes for a job ---------------------------------------------------


def run_dirs(workdir: str) -> list[Path]:
    """The run directories the script made under workdir/runs (set aside ones end in .failed)."""
    runs = Path(workdir, "runs")
    return sorted(p for p in runs.iterdir() if p.is_dir() and not p.name.endswith(".failed")) if runs.is_dir() else []


def find_checkpoint(workdir: str) -> Path | None:
    """The newest checkpoint.pt of the job's run (the job's directory holds one run, resumed in place)."""
    checkpoints = [d / "checkpoint.pt" for d in run_dirs(workdir) if (d / "checkpoint.pt").is_file()]
    return max(checkpoints, key=lambda p: p.stat().st_mtime) if checkpoints else None


def import_run_reading():
    """benchmark/run_reading.py, the module beside this one: the launcher reads a run as the report's tables do. Imported
    here, not at the top, as a Ray or Slurm worker runs the launcher's functions without running its top."""
    folder = str(Path(__file__).resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)
    import run_reading

    return run_reading


def final_return(workdir: str) -> float | None:
    """The final return of the run in the job's directory (see run_final_return)."""
    runs = run_dirs(workdir)
    return run_final_return(runs[-1]) if runs else None


def run_final_return(run_dir: Path | str) -> float | None:
    """The run's final return as benchmark/report.py's tables give it: the mean true score of its last 100 training
    episodes, where what an interrupted attempt logged after its last checkpoint is not counted twice."""
    if not Path(run_dir).is_dir():
        return None
    run_reading = import_run_reading()
    try:
        run = run_reading.read_run(Path(run_dir), quiet=True)
    except ValueError:  # a run the report leaves out as damaged has no final return either
        return None
    return None if run is None else run_reading.final_score(run.returns, LAST_EPISODES)


class Attempt:
    """One execution of a command: its output goes to the console (prefixed) and the log; `stop` signals it."""

    def __init__(self, command: list[str], job: Job, backend: str):
        libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child, between fork and exec, only calls it

        def child_setup():
            # A launcher killed outright (SIGKILL) still has its runs stop with a checkpoint. 1: PR_SET_PDEATHSIG, sent
            # when the thread that started the run ends, and again as the run passes to other threads that end; a run
            # takes a repeated SIGTERM for the stop under way (SIGINT would not do: a second one exits at once).
            if backend == "local":
                libc.prctl(1, signal.SIGTERM)
            if backend == "slurm":  # Slurm's warning signal (USR2) reaches every process of the job: the run must not
                signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # die of it; SlurmRun.checkpoint stops it with SIGTERM
            if backend == "ray":  # the run dies with the task's process (kill -9, a lost node), so that a retried task
                libc.prctl(1, signal.SIGKILL)  # never runs next to a left-over copy of the run

        # PYTHONUNBUFFERED: a Python child writing to a pipe would otherwise hold its progress lines back.
        self.process = subprocess.Popen(
            command,
            cwd=job.workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            errors="replace",
            env={**os.environ, "PYTHONUNBUFFERED": "1", **job.env},
            preexec_fn=child_setup,
            # Locally the runs have a session of their own: a Ctrl-C in the terminal (or a signal to the launcher's
            # process group) reaches the launcher alone, which passes it on once (see Stopper).
            start_new_session=backend == "local",
        )
        self.pump = threading.Thread(target=self._pump, args=(job,), daemon=True)
        self.pump.start()

    def _pump(self, job: Job) -> None:
        job.error_line = ""  # of this attempt
        for line in self.process.stdout:
            read_output_line(job, line)
            echo(job, line)
        self.process.wait()

    def wait(self) -> int:
        while self.pump.is_alive():  # in short joins, so that this thread stays free to answer signals
            self.pump.join(0.5)
        # The pump waited for the process, but a join cut by an exception (Ray's KeyboardInterrupt) can leave the
        # thread reported as ended before it is: wait for the process itself.
        return self.process.wait()

    def signal(self, signum: int) -> None:
        try:
            self.process.send_signal(signum)  # nothing when the process has been waited for
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """SIGTERM, as a scheduler would: the run writes its checkpoint and exits."""
        if self.process.poll() is None:
            self.signal(signal.SIGTERM)
        self.wait()


class Stopper:
    """The local launcher's answer to SIGINT, SIGTERM and SIGHUP: every signal is passed on to every running run, once
    (the runs have sessions of their own, so a terminal's Ctrl-C reaches only the launcher); no run starts after the
    first. A run answers the first by finishing its step, writing its checkpoint and exiting with 128 + the signal's
    number; a second Ctrl-C, passed on as well, makes it exit at once with its last checkpoint (a repeated SIGTERM or
    SIGHUP changes nothing). The handler only records the signal: the main thread passes it on (`forward`), as does
    the thread that starts a run, under a lock, so that a run started while a signal arrives gets it exactly once."""

    def __init__(self):
        self.signals: list[int] = []
        self.lock = threading.Lock()
        self.running: dict[Attempt, int] = {}  # attempt -> how many of `signals` it has been sent

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if sig != signal.SIGHUP or signal.getsignal(sig) != signal.SIG_IGN:  # under nohup a hangup is ignored
                signal.signal(sig, self.on_signal)

    def on_signal(self, signum, frame) -> None:
        self.signals.append(signum)

    @property
    def requested(self) -> bool:
        return bool(self.signals)

    def started(self, attempt: Attempt) -> None:
        with self.lock:
            self.running[attempt] = 0
        self.forward()

    def ended(self, attempt: Attempt) -> None:
        with self.lock:
            self.running.pop(attempt, None)

    def forward(self) -> None:
        with self.lock:
            signals = list(self.signals)
            for attempt, sent in self.running.items():
                for signum in signals[sent:]:
                    attempt.signal(signum)
                self.running[attempt] = len(signals)


def echo(job: Job, text: str) -> None:
    # One write call per line: lines of runs echoed at the same time do not mix (and no lock is needed, which a Ray
    # task or a Slurm job could not be sent with). A console that cannot be written stops nothing (see `say`).
    if sys.stdout is not None:
        try:
            sys.stdout.write(f"[{job.env_id} {job.seed}] {text}")
            sys.stdout.flush()
        except OSError:
            silence(sys.stdout)
    if job.log_path is not None:
        try:
            with open(job.log_path, "a") as log:
                log.write(text)
        except OSError as error:  # a full disk, a folder removed: the run goes on, its output on the console only
            say(f"warning: [{job.env_id} {job.seed}] could not write {job.log_path} ({error.strerror}); its output goes "
                "to the console only", sys.stderr)  # fmt: skip
            job.log_path = None


def set_aside(run_dir: Path) -> None:
    """Renames a run folder without checkpoint to *.failed, under a name not taken (two attempts that fail in the same
    second make run folders of the same name)."""
    target, number = run_dir.with_name(run_dir.name + ".failed"), 1
    while target.exists() or target.is_symlink():
        number += 1
        target = run_dir.with_name(f"{run_dir.name}.{number}.failed")
    run_dir.rename(target)


def run_with_retries(
    job: Job,
    max_retries: int = 0,
    resume_args: tuple[str, ...] = (),
    backend: str = "local",
    started: Callable[[Attempt], None] = lambda attempt: None,
    stopper: Stopper | None = None,
) -> Job:
    """Runs the job's command in its working directory until it succeeds, is stopped by a signal, or has failed
    1 + max_retries times. Every start after the first checkpoint resumes it (`--resume PATH`, then resume_args),
    also a start by a new process (a requeued Slurm job, a Ray task retried after its node died); a run directory
    left without checkpoint is set aside (renamed *.failed) and the run starts over. The folder's record (launch.json)
    keeps the command and, once it ended, the result; a folder recorded for another command is left alone. With a
    stopper (the local backend), nothing starts once the launcher was asked to stop. Returns the job with its exit
    code, attempts, seconds and final return."""
    start, lock = time.time(), None
    if stopper is not None and stopper.requested:
        job.note = STOPPED_BEFORE_START
        return job
    if job.workdir is not None:
        Path(job.workdir).mkdir(parents=True, exist_ok=True)
        if other_command(job) is not None:  # checked before the launch too; here for a launch begun meanwhile
            job.note = f"refused: {job.workdir} holds a run of another command"
            return job
        if Path(job.workdir, "finished").exists():
            job.returncode, job.note, job.final_return = 0, "finished before", final_return(job.workdir)
            job.run_dir = next((shown_path(path) for path in run_dirs(job.workdir)[-1:]), None)
            return job
        lock = open(Path(job.workdir, ".lock"), "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            job.note = f"already running (another launcher holds {job.workdir}/.lock)"
            return job
        except OSError:  # a file system without locks: go on unguarded
            pass
        if other_command(job) is not None:  # written by a launcher that held the lock between the checks
            lock.close()
            job.note = f"refused: {job.workdir} holds a run of another command"
            return job
        write_record(job.workdir, {"command": job.command})
    try:
        if job.log_path is not None:  # a new log for a new run; a resumed one (a retry, a requeued job) appends to it
            if job.workdir is None or find_checkpoint(job.workdir) is None:
                try:
                    open(job.log_path, "w").close()
                except OSError as error:
                    say(f"warning: [{job.env_id} {job.seed}] cannot write {job.log_path} ({error.strerror})", sys.stderr)
                    job.log_path = None
        for attempt in range(1 + max_retries):
            if stopper is not None and stopper.requested:
                job.note = job.note if job.attempts else STOPPED_BEFORE_START
                break
            command, checkpoint = job.command, find_checkpoint(job.workdir) if job.workdir else None
            if checkpoint is not None:
                command = [*job.command, "--resume", str(checkpoint), *resume_args]
            elif job.workdir is not None:
                for stale in run_dirs(job.workdir):
                    set_aside(stale)
            if attempt > 0 or checkpoint is not None:
                echo(job, f"== attempt {attempt + 1} of {1 + max_retries}: {shlex.join(command)}\n")
            job.attempts += 1
            try:
                running = Attempt(command, job, backend)
            except OSError as error:  # the program itself could not be started
                echo(job, f"could not start: {error}\n")
                job.returncode = 127
                break
            started(running)
            if stopper is not None:
                stopper.started(running)
            try:
                job.returncode = running.wait()
            except KeyboardInterrupt:  # Ray's cancel of the task (the launcher was stopped): the run stops likewise
                running.stop()
                job.returncode = running.wait()
                break
            if stopper is not None:
                stopper.ended(running)
            if job.returncode == 0 or job.returncode in STOP_CODES:
                break
        if job.workdir is not None:
            if job.ok:
                Path(job.workdir, "finished").touch()
            job.final_return = final_return(job.workdir)
            result = dict(status=job.status, returncode=job.returncode, attempts=job.attempts, final_return=job.final_return)
            write_record(job.workdir, {"command": job.command, "result": result})
        elif job.run_dir is not None:  # the run wrote runs/ in the launcher's directory, beside the other runs
            job.final_return = run_final_return(job.run_dir)
    finally:
        job.seconds += time.time() - start
        if lock is not None:
            lock.close()
    return job


# ----- the three backends ------------------------------------------------------------------------------------------


def run_local(jobs: list[Job], args: argparse.Namespace, options: dict, stopper: Stopper) -> list[Job]:
    say(f"Launching {len(jobs)} runs, {args.workers} at a time")
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(run_with_retries, job, **options, stopper=stopper) for job in jobs]
        told = 0
        while True:
            done, pending = wait(futures, timeout=0.1, return_when=FIRST_EXCEPTION)
            stopper.forward()
            for signum in stopper.signals[told:]:
                told += 1
                running = len(stopper.running)
                if told == 1:
                    say(f"\n{signal_name(signum)}: passed on to the {running} running runs, which stop with a checkpoint; "
                        f"waiting for them, starting no new run (exit {128 + signum} then)")  # fmt: skip
                elif signum == signal.SIGINT:
                    say(f"\nSIGINT again: passed on, the {running} running runs exit at once with their last checkpoint")
                else:
                    say(f"\n{signal_name(signum)} again: the stop goes on, waiting for {running} runs")
            if not pending or any(future.exception() for future in done):
                break
        for future in futures:
            future.result()  # a fault of the launcher itself is raised here, after the other runs ended
    return jobs


class ClusterInterrupt:
    """SIGINT, SIGTERM and SIGHUP to the ray or slurm launcher: the first one interrupts the waiting as Ctrl-C always
    did (KeyboardInterrupt); later ones are recorded and change nothing, so that no traceback cuts the clean-up,
    except a second Ctrl-C while `again` is set (Ray's runs being stopped)."""

    def __init__(self):
        self.signals: list[int] = []
        self.again = False

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if sig != signal.SIGHUP or signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, self.on_signal)

    def on_signal(self, signum, frame) -> None:
        self.signals.append(signum)
        if len(self.signals) == 1 or (self.again and signum == signal.SIGINT):
            raise KeyboardInterrupt


def import_extra(backend: str):
    """The backend's package, or one line saying how to install it."""
    try:
        return __import__(EXTRA[backend])
    except ImportError:
        fail(f'--backend {backend} needs the cluster extra: pip install -e ".[cluster]"')


def check_ray_address(address: str | None) -> None:
    """A HOST:PORT (or ray://HOST:PORT) that nothing answers at fails here in seconds, not in ray.init's minutes."""
    if address in (None, "auto", "local"):
        return
    match = re.fullmatch(r"(?:ray://)?\[?([^\]\s]+?)\]?:(\d+)", address)
    if match is None:
        fail(f"--ray-address={address}: must be auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((match[1], int(match[2])), timeout=5).close()
    except OSError as error:
        fail(f"--ray-address={address}: no Ray cluster answers there ({error}); start one with `ray start --head`")


def ray_options(args: argparse.Namespace) -> dict:
    options = dict(num_cpus=args.cpus_per_run, num_gpus=args.gpus_per_run, max_retries=args.max_retries)
    return options | ({"memory": int(args.mem_gb * 1e9)} if args.mem_gb else {})


def run_ray(jobs: list[Job], args: argparse.Namespace, options: dict, interrupt: ClusterInterrupt) -> list[Job]:
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # echo every line of every run, as the local backend
    ray = import_extra("ray")
    check_ray_address(args.ray_address)
    try:
        ray.init(address=args.ray_address, logging_level="WARNING")
    except (ConnectionError, ValueError, RuntimeError) as error:
        hint = (
            "" if os.environ.get("RAY_AUTH_MODE") else " (a cluster with token authentication also needs RAY_AUTH_MODE=token)"
        )
        fail(f"--ray-address={args.ray_address}: {str(error).splitlines()[0]}{hint}")
    interrupt.install()  # ray.init puts a handler of its own on SIGTERM, which ends the process with a stack dump
    # Ray retries a task whose worker or node died (max_retries); the task itself retries a run that failed.
    remote = ray.remote(run_with_retries).options(**ray_options(args))
    say(f"Launching {len(jobs)} runs on Ray ({ray.cluster_resources().get('CPU', 0):.0f} CPUs in the cluster)")
    refs, done = [remote.remote(job, **options) for job in jobs], list(jobs)
    pending = list(refs)
    try:
        while pending:
            (ref,), pending = ray.wait(pending, num_returns=1)
            index = refs.index(ref)
            try:
                done[index] = ray.get(ref)
            except Exception as error:  # the task's retries are spent: its node died or the task failed
                done[index].note = f"lost: {type(error).__name__}"
                echo(done[index], f"lost: {str(error).splitlines()[0]}\n")
    except KeyboardInterrupt:
        interrupt.again = True
        stop_ray_runs(ray, [refs.index(ref) for ref in pending], refs, done)
        interrupt.again = False
    finally:
        ray.shutdown()
    return done


def stop_ray_runs(ray, indices: list[int], refs: list, done: list[Job]) -> None:
    """Cancels the unfinished tasks: a queued one never starts; in a running one Ray raises KeyboardInterrupt, and
    run_with_retries stops its run with SIGTERM and waits for the checkpoint. A second Ctrl-C kills the tasks' workers,
    and with them the runs (their last checkpoint stays)."""
    say("\nInterrupted: the running runs stop with a checkpoint and no new one starts; waiting for them (a second "
        "Ctrl-C kills them at once)")  # fmt: skip
    for index in indices:
        ray.cancel(refs[index])
    for index in indices:
        while True:
            try:
                done[index] = ray.get(refs[index])
            except KeyboardInterrupt:  # a second Ctrl-C
                say("\nSIGINT again: killing the runs; they resume from their last checkpoint when this command runs again")
                for other in indices:
                    ray.cancel(refs[other], force=True)
                continue
            except Exception as error:  # cancelled before it started, or killed
                done[index].note = CANCELLED if "Cancel" in type(error).__name__ else f"lost: {type(error).__name__}"
            break


class SlurmRun:
    """One run as a submitit job. When Slurm warns of preemption or of the time limit (USR2, `--signal`), submitit
    calls `checkpoint`: the run is stopped with SIGTERM, writes its checkpoint, and the returned submission is
    requeued; started again, `run_with_retries` resumes the checkpoint."""

    def __init__(self, job: Job, options: dict):
        self.job, self.options, self.attempt = job, options, None

    def __call__(self) -> Job:
        return run_with_retries(self.job, **self.options, started=self._started)

    def _started(self, attempt: Attempt) -> None:
        self.attempt = attempt

    def checkpoint(self):
        import submitit

        if self.attempt is not None:
            self.attempt.stop()
        return submitit.helpers.DelayedSubmission(SlurmRun(self.job, self.options))

    def __getstate__(self):
        return {"job": self.job, "options": self.options, "attempt": None}


def slurm_parameters(args: argparse.Namespace, jobs: list[Job]) -> dict:
    """submitit's SlurmExecutor parameters (sbatch's names) of the job array."""
    extra = dict(option.split("=", 1) for option in args.slurm_option if "=" in option)
    if len(extra) != len(args.slurm_option):
        fail(f"--slurm-option={args.slurm_option}: each must be KEY=VALUE, e.g. account=rl")
    if args.gpus_per_run != int(args.gpus_per_run):
        fail(f"--gpus-per-run={args.gpus_per_run}: Slurm gives whole GPUs")
    params = dict(
        job_name=f"launch-{experiment_name(jobs[0].command)}",
        partition=args.partition,
        time=args.time_min,
        cpus_per_task=args.cpus_per_run,
        gpus_per_node=int(args.gpus_per_run) if args.gpus_per_run else None,
        mem=f"{args.mem_gb:g}GB" if args.mem_gb else None,
        signal_delay_s=120,  # USR2 two minutes before the limit: time to write a checkpoint
        stderr_to_stdout=True,
        additional_parameters=extra or None,
    )
    return {key: value for key, value in params.items() if value is not None}


def sbatch_script(args: argparse.Namespace, jobs: list[Job]) -> str:
    """The sbatch file submitit writes for the array (its own generator; shown by --dry-run)."""
    from submitit.slurm.slurm import _make_sbatch_string

    folder = args.output_dir.resolve() / "submitit" / "%j"
    command = f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    return _make_sbatch_string(command=command, folder=folder, map_count=len(jobs), **slurm_parameters(args, jobs))


def run_slurm(jobs: list[Job], args: argparse.Namespace, options: dict) -> list[Job]:
    submitit = import_extra("slurm")
    try:
        executor = submitit.SlurmExecutor(folder=args.output_dir.resolve() / "submitit" / "%j", max_num_timeout=MAX_TIMEOUTS)
    except RuntimeError as error:
        fail(f"--backend slurm: {error}")
    executor.update_parameters(**slurm_parameters(args, jobs))
    with executor.batch():
        submitted = [executor.submit(SlurmRun(job, options)) for job in jobs]
    say(f"Submitted {len(jobs)} runs as Slurm array {submitted[0].job_id.split('_')[0]}; waiting for them")
    say("(Ctrl-C stops the waiting, not the jobs; logs in each run's console.log and in submitit/)")
    return wait_for_submitit(jobs, submitted)


def wait_for_submitit(jobs: list[Job], submitted: list) -> list[Job]:
    """The finished jobs, in order; a job that raised, or that submitit gave up on, is marked lost."""
    done = list(jobs)
    for index, handle in enumerate(submitted):
        try:
            done[index] = handle.result()
        except KeyboardInterrupt:
            say("\nStopped waiting; the jobs go on")
            for job in done[index:]:
                job.note = "left running on Slurm"
            break
        except Exception as error:
            done[index].note = f"lost: {type(error).__name__}"
            echo(done[index], f"lost: {str(error).strip().splitlines()[-1]}\n")
    return done


# ----- dry run, summary, main --------------------------------------------------------------------------------------


def print_dry_run(jobs: list[Job], args: argparse.Namespace) -> None:
    if args.backend == "ray":
        say(f"ray: {len(jobs)} tasks on {args.ray_address or 'a new local cluster'}, each {ray_options(args)}")
    if args.backend == "slurm":
        import_extra("slurm")
        say(f"slurm: one array of {len(jobs)} jobs, submitit parameters {slurm_parameters(args, jobs)}")
        say(sbatch_script(args, jobs))
    for job in jobs:
        where = f"(in {job.workdir}) " if job.workdir else ""
        env = "".join(f"{key}={shlex.quote(value)} " for key, value in job.env.items())
        say(f"{where}{env}{shlex.join(job.command)}")


def print_summary(jobs: list[Job]) -> None:
    say("\nSummary")
    say(f"  {'run':<36} {'status':<24} {'tries':>5} {'wall time':>12} {'final return':>13}  run folder")
    for job in jobs:
        score = "-" if job.final_return is None else f"{job.final_return:.2f}"
        folder = job.run_dir or "-"
        say(f"  {job.label:<36} {job.status:<24} {job.attempts:>5} {job.seconds / 60:8.2f} min {score:>13}  {folder}")
        if job.why:
            say(f"      why: {job.why}")
    stopped = sum(job.returncode in STOP_CODES or job.note in (STOPPED_BEFORE_START, CANCELLED) for job in jobs)
    failed = sum(not job.ok for job in jobs) - stopped
    counts = [f"{stopped} stopped" if stopped else "", f"{failed} failed" if failed else ""]
    say(", ".join([f"{len(jobs) - failed - stopped}/{len(jobs)} runs succeeded", *filter(None, counts)]))
    if any(job.final_return is not None for job in jobs):
        say(f"final return: mean {import_run_reading().RETURN_TAG} of the last {LAST_EPISODES} training episodes")


def main(argv: list[str] | None = None) -> int:
    """0 when every run succeeded, 1 when one did not, 2 when nothing could start, 128 + N when signal N stopped it."""
    # Installed first: a signal during the checks below stops the launcher before any run starts, without a traceback.
    stopper = Stopper()
    stopper.install()
    args, command = parse_args(sys.argv[1:] if argv is None else argv)
    jobs = make_jobs(args.env_ids, args.seeds, command, args)
    check_job_paths(jobs, args)
    if args.output_dir is not None:
        check_commands(jobs, args.output_dir)
    if args.dry_run:
        print_dry_run(jobs, args)  # piped into `head`, which has read all it wants: the rest goes to /dev/null
        return 0
    if stopper.requested:
        say(f"{signal_name(stopper.signals[0])}: stopped before any run started", sys.stderr)
        return 128 + stopper.signals[0]
    resume_args = args.resume_args if args.resume_args is not None else "" if args.backend == "local" else FRESH_RESUME
    options = dict(max_retries=args.max_retries, resume_args=tuple(shlex.split(resume_args)), backend=args.backend)
    if args.backend == "local":
        interrupt = stopper
        jobs = run_local(jobs, args, options, stopper)
    else:
        interrupt = ClusterInterrupt()
        interrupt.install()
        try:
            jobs = run_ray(jobs, args, options, interrupt) if args.backend == "ray" else run_slurm(jobs, args, options)
        except KeyboardInterrupt:  # before the waiting began (connecting, submitting)
            say("\nInterrupted before the runs were waited for")
    print_summary(jobs)
    if interrupt.signals:
        return 128 + interrupt.signals[0]
    return 0 if all(job.ok for job in jobs) else 1


if __name__ == "__main__":
    from cleanrl_q_utils.stop_signals import quiet_when_gone

    # A console that is gone (`| tee` ended by Ctrl-C, a closed terminal) must not stop the echo of the runs'
    # output: the runs would block on their full pipes and the summary would be lost.
    quiet_when_gone()
    sys.exit(main())
