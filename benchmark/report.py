"""Turn the TensorBoard logs of benchmark runs into the result tables and learning curves of the docs.

    python benchmark/report.py --runs-dir runs --env-ids CartPole-v1 Acrobot-v1 MountainCar-v0 \
        --exp-names pqn --output-dir benchmark/results

Reads every run directory under `--runs-dir` whose name follows `{env_id}__{exp_name}__{seed}__{timestamp}`, with
a `_2`, `_3`, ... suffix for runs started in the same second (the run name of every script), offline from its event
files, and every episode record `<run name>.episodes.csv.gz` there: a run's episodes as `--export-episodes` writes
them, a few hundred kB that can be kept in the repository when the run folders are not, and reported beside new runs.
The sweep reported is what `--exp-names`, `--env-ids`, `--seeds` and `--total-timesteps` ask for (all runs
found when none is given); of several runs of one exp_name, env id and seed, the newest is reported. Every run found
that is left out (another sweep's, an earlier one of the same seed, one without episodes) is named, with why, at the
end of the report file; the console counts them in one line. Runs are grouped by (exp_name, env_id); each
run's final performance is the mean of its last 100 `charts/episodic_return` values (the true game scores of
its last 100 training episodes), and a group reports the mean and standard deviation of that number over its
seeds (a group of one seed, which has no spread, its score marked `(1 seed)`). Writes to `--output-dir`, and says
where first, on stdout (then the tables):

- `<name>.md`: final performance and wall-clock runtime per env, one column per exp_name; for Atari ids
  (found in atari57_random_human_scores.csv) also human-normalized scores with the median and the
  interquartile mean (IQM) over games and seeds, with 95% stratified-bootstrap confidence intervals (rliable);
- `<name>_curves.png`: learning curves, one panel per env, one line per exp_name: the mean over seeds of each run's
  trailing mean return, with a band of +- one standard deviation over seeds (the figure says so); x-axis = env
  steps, labelled "agent steps (not frames)" for Atari ids: one agent step is several frames (the frame skip).

What the report leaves out or mixes is also said in one `warning:` line each on stderr: requested env ids or
exp_names without runs, the number of runs left out, seeds with few episodes, runs of different lengths in one
curve, and curves it cannot draw.

A damaged or hostile run is left out, named in one `warning:` line with what is wrong and listed with the runs left
out, and never turned into a number of the tables: an episode record that is not what `write_episodes` writes, that
inflates beyond `EPISODE_RECORD_MAX_BYTES` (64 MiB, some 30 times the largest record kept) or holds a line longer
than any it writes; a run folder whose event files are not regular files, are damaged (a record that fails its
checksum or is longer than the file: a last record cut short by a run killed while writing is no damage), or would
need more memory to read than is available; and a run of either kind without training episodes, with NaN, infinite
or implausibly large scores (beyond +-1e15) or run time, or with a negative step. The Atari score table
(`--scores-csv`) is read only when an Atari id (`-v5`) is reported, and is refused in one line when it is not a
`game,random,human` table of finite scores. Every file is written whole or not at all (a temporary file renamed over
it).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import io
import logging
import math
import os
import re
import struct
import sys
import tempfile
import warnings
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the run plumbing, when run as a script from a checkout

RETURN_TAG = "charts/episodic_return"
EVAL_TAG = "eval/episodic_return"
RUN_NAME = re.compile(r"^(?P<env_id>.+?)__(?P<exp_name>.+)__(?P<seed>-?\d+)__(?P<timestamp>\d+)(?:_(?P<suffix>\d+))?$")
HYPERPARAMETERS_TAG = "hyperparameters/text_summary"
HUMAN_RANDOM_CSV = Path(__file__).with_name("atari57_random_human_scores.csv")
EPISODES_SUFFIX = ".episodes.csv.gz"
"""the file name ending of an episode record (`write_episodes`)"""
MIXED_LENGTHS = 0.9
"""runs of one group are of mixed lengths when the shortest ends before this fraction of the longest (the last
episodes of runs of equal length end a little apart anyway)"""
EPISODE_RECORD_MAX_BYTES = 64 * 2**20
"""most bytes an episode record may inflate to: at the 17 bytes of a typical row, about 4 million episodes (the
largest record kept holds 125,000 in 2 MB); a record beyond it is refused before its memory is spent"""
EPISODE_RECORD_MAX_LINE = 256
"""most bytes of a line of an episode record (`write_episodes` writes at most about 60)"""
EVENT_MEMORY_FACTOR = 6
"""memory the TensorBoard reader needs per byte of event file (about 4 measured, for scalars), with a margin"""
EVENT_RECORD_MAX_BYTES = 64 * 2**20
"""most bytes a truncated last record of an event file may declare: the reader asks for the whole record at once"""
MOST_MAGNITUDE = 1e15
"""no game scores that much, and means and deviations of larger numbers can overflow to inf"""
MOST_RUNTIME_S = 1e9
"""about 30 years: a run time beyond it is a damaged record"""
SCORES_CSV_MAX_BYTES = 2**20
"""most bytes of the Atari score table (the one kept has 57 rows in 2 kB)"""
MOST_COUNT = 10**9
"""upper end of --last-episodes and --smoothing-window: beyond the episodes of any run, and within numpy's integers"""
MOST_POINTS = 10_000
"""upper end of --num-points: far more points than a panel has pixels across"""
MOST_PANELS = 150
"""most env ids in one figure of curves (Atari's 57 games fit twice): more would be an image past what matplotlib
draws (2**16 pixels a side), after minutes of laying it out"""
MOST_BOOTSTRAP_REPS = 1_000_000
"""upper end of --bootstrap-reps: 20 times the default, about a minute per exp_name"""


def warn(message: str) -> None:
    """One line on stderr, so that a table or plot with something missing is not read as complete."""
    print(f"warning: {message}", file=sys.stderr)


def count(number: int, noun: str) -> str:
    """`1 seed`, `3 seeds`."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


@dataclass
class Run:
    """One training run: its identity and the episodes it logged."""

    env_id: str
    exp_name: str
    seed: int
    path: Path
    steps: np.ndarray
    """env step at which each training episode finished, in completion order"""
    returns: np.ndarray
    """true game score of each training episode (`charts/episodic_return`)"""
    runtime_s: float
    """wall-clock seconds from the first to the last event the run wrote"""
    eval_returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """scores of the evaluation episodes played after training (`eval/episodic_return`), if any"""
    total_timesteps: int | None = None
    """the run's --total-timesteps, from the hyperparameters it logged (None: not logged)"""


@dataclass
class Group:
    """All seeds of one exp_name on one env."""

    exp_name: str
    env_id: str
    seeds: list[int]
    final_scores: np.ndarray
    """per seed: mean return of the run's last `last_episodes` episodes"""
    runtimes_min: np.ndarray
    """per seed: wall-clock minutes"""
    final_steps: np.ndarray
    """per seed: env step of the last logged episode"""
    eval_means: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """per seed: mean score of the evaluation episodes played after training (NaN for a run without any)"""

    @property
    def mean(self) -> float:
        return float(np.mean(self.final_scores))

    @property
    def std(self) -> float:
        """Population standard deviation over seeds (numpy's default, ddof=0)."""
        return float(np.std(self.final_scores))


def parse_run_name(name: str) -> dict | None:
    """Splits `{env_id}__{exp_name}__{seed}__{timestamp}[_{suffix}]`; None when the name does not follow the pattern.
    The suffix (2, 3, ...; 1 without one) orders runs started in the same second."""
    match = RUN_NAME.match(name)
    if match is None:
        return None
    return {
        "env_id": re.sub(r"^MinAtar-", "MinAtar/", match["env_id"]),  # run folders write MinAtar/Game-v0 with a dash
        "exp_name": match["exp_name"],
        "seed": int(match["seed"]),
        "timestamp": int(match["timestamp"]),
        "suffix": int(match["suffix"] or 1),
    }


def logged_total_timesteps(accumulator) -> int | None:
    """--total-timesteps from the `|total_timesteps|N|` row of the hyperparameters table the run logged, if any."""
    if HYPERPARAMETERS_TAG not in accumulator.Tags().get("tensors", []):
        return None
    from tensorboard.util import tensor_util

    text = tensor_util.make_ndarray(accumulator.Tensors(HYPERPARAMETERS_TAG)[-1].tensor_proto).ravel()[0]
    text = text.decode(errors="replace") if isinstance(text, bytes) else str(text)
    match = re.search(r"^\|total_timesteps\|(\d{1,20})\|$", text, re.M)
    return None if match is None else int(match[1])


def read_run(path: Path, quiet: bool = False) -> Run | None:
    """Reads one run directory's event files, or an episode record; None (with a warning unless quiet) when it
    logged no training episode; ValueError, saying why, when it is damaged (see `check_run`)."""
    if path.name.endswith(EPISODES_SUFFIX):
        run = read_episodes(path)
    else:
        run = read_event_files(path)
    if run is None:
        if not quiet:
            warn(f"{path}: no {RETURN_TAG} logged; skipped")
        return None
    check_run(run)
    return run


def read_event_files(path: Path) -> Run | None:
    """The `Run` of a run directory, read offline from its event files; None when it logged no training episode."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    check_event_files(path)
    identity = parse_run_name(path.name)
    try:
        # size 0 keeps every scalar (the default keeps a random sample of 10k, which would bias the last-100 mean).
        # Purging drops what a run killed after its last checkpoint had logged past it, which the resumed run logged
        # again (counted twice otherwise, with steps going back); it purges by tag, so the eval scores logged after
        # training with their own small step numbers leave the training data alone.
        accumulator = ea.EventAccumulator(
            str(path),
            size_guidance={ea.SCALARS: 0, ea.TENSORS: 1, ea.IMAGES: 1, ea.AUDIO: 1, ea.HISTOGRAMS: 1},
            purge_orphaned_data=True,
        )
        with checksum_failures() as failures:
            accumulator.Reload()
        if failures:
            raise ValueError(
                f"{path}: TensorBoard stops reading a file at a damaged record ({failures[0]}), so the episodes after it "
                "would be missing"
            )
        tags = accumulator.Tags()["scalars"]
        if RETURN_TAG not in tags or not accumulator.Scalars(RETURN_TAG):
            return None
        episodes = accumulator.Scalars(RETURN_TAG)
        last_wall_time = max(event.wall_time for tag in tags for event in accumulator.Scalars(tag))
        return Run(
            env_id=identity["env_id"],
            exp_name=identity["exp_name"],
            seed=identity["seed"],
            path=path,
            steps=np.array([event.step for event in episodes], dtype=np.int64),
            returns=np.array([event.value for event in episodes], dtype=np.float64),
            runtime_s=float(last_wall_time - accumulator.FirstEventTimestamp()),
            eval_returns=np.array(
                [event.value for event in accumulator.Scalars(EVAL_TAG)] if EVAL_TAG in tags else [], dtype=np.float64
            ),
            total_timesteps=logged_total_timesteps(accumulator),
        )
    except ValueError as error:
        if str(error).startswith(f"{path}: "):  # said above
            raise
        raise ValueError(f"{path}: cannot read its event files (ValueError: {error})") from None
    except Exception as error:  # TensorBoard's parser on a damaged or hostile file: said in one line, not a traceback
        raise ValueError(f"{path}: cannot read its event files ({type(error).__name__}: {error})") from None


@contextlib.contextmanager
def checksum_failures():
    """Collects, as a list, the checksum failures that TensorBoard's reader meets: it stops reading a file at the first
    and only says so in a debug message (a record cut short at the end, by a run killed while writing, is not one)."""
    failures = []

    class Collect(logging.Handler):
        def emit(self, record):
            if record.args and "crc32 check" in str(record.args[-1]):
                failures.append(str(record.args[-1]).split("' ")[-1])

    logger, handler = logging.getLogger("tensorboard"), Collect(logging.DEBUG)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # its other debug messages go nowhere
    try:
        yield failures
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def check_event_files(path: Path) -> None:
    """ValueError, saying why, for a run directory whose event files TensorBoard's reader cannot read within bounds:
    one that is not a regular file (a fifo would block the reader), a record that declares more bytes than the file
    holds (the reader asks for them all at once: a hostile length is terabytes), or files that would need more memory
    to read than is available."""
    from cleanrl_q_utils.flag_errors import available_memory_bytes

    event_files = sorted(path.glob("*tfevents*"))  # the files TensorBoard's reader takes
    for event_file in event_files:
        if not event_file.is_file():
            raise ValueError(f"{path}: {event_file.name} is not a regular file")
    total, available = sum(event_file.stat().st_size for event_file in event_files), available_memory_bytes()
    if total * EVENT_MEMORY_FACTOR > available:
        raise ValueError(
            f"{path}: its event files hold {total / 1e9:,.1f} GB, which need about {total * EVENT_MEMORY_FACTOR / 1e9:,.1f}"
            f" GB to read, and {available / 1e9:,.1f} GB are available"
        )
    for event_file in event_files:
        check_event_records(event_file)


def check_event_records(event_file: Path) -> None:
    """ValueError for an event file with a record that declares more bytes than the file holds, unless it is a last
    record of modest length cut short by a run killed while writing. The records' lengths are read and the rest is
    skipped: a few percent of the time TensorBoard's reader then takes."""
    size = event_file.stat().st_size
    try:
        with open(event_file, "rb") as file:
            offset = 0
            while len(head := file.read(8)) == 8:  # fewer: the end, or a last record cut short
                (length,) = struct.unpack("<Q", head)
                if offset + 16 + length > size and length > EVENT_RECORD_MAX_BYTES:
                    raise ValueError(
                        f"{event_file.parent}: {event_file.name}: the record at byte {offset:,} declares {length:,} "
                        f"bytes, more than the file's {size:,}"
                    )
                offset += 16 + length  # length, its checksum, the record, its checksum
                file.seek(offset)
    except OSError as error:
        raise ValueError(f"{event_file.parent}: cannot read {event_file.name} ({error.strerror or error})") from None


def check_run(run: Run) -> None:
    """ValueError, saying why, for a run whose numbers no honest run logs: a table would print them as nan or inf, or
    as a result they do not mean."""
    for what, values in (("training episode returns", run.returns), ("evaluation returns", run.eval_returns)):
        bad = ~np.isfinite(values) | (np.abs(values) > MOST_MAGNITUDE)
        if bad.any():
            raise ValueError(
                f"{run.path}: {what} hold {count(int(bad.sum()), 'value')} that no game scores "
                f"(NaN, infinite or beyond ±{MOST_MAGNITUDE:g}), the first {float(values[bad][0])!r}"
            )
    if len(run.steps) and run.steps.min() < 0:
        raise ValueError(f"{run.path}: a training episode ends at a negative step ({int(run.steps.min())})")
    if not 0 <= run.runtime_s <= MOST_RUNTIME_S:  # NaN fails too
        raise ValueError(f"{run.path}: its run time {run.runtime_s!r} s is not in [0, {MOST_RUNTIME_S:g}]")
    if run.total_timesteps is not None and run.total_timesteps < 1:
        raise ValueError(f"{run.path}: its --total-timesteps {run.total_timesteps} is not at least 1")


def run_name_of(path: Path) -> str:
    """The run name of a run directory or of an episode record."""
    return path.name.removesuffix(EPISODES_SUFFIX)


def write_episodes(run: Run, folder: Path) -> Path:
    """Writes `run` as `<folder>/<run name>.episodes.csv.gz`, which `read_run` reads back as the same `Run`: a comment
    line with the wall-clock runtime and --total-timesteps, then `kind,step,return` rows, `train` for each training
    episode (the step it ended at) and `eval` for each evaluation episode (its index). Values are written with
    `repr`, so they read back bitwise; the gzip header holds no time, so the same run gives the same bytes. The file
    is written whole or not at all."""
    from cleanrl_q_utils.checkpoint_files import write_atomically

    rows = [f"train,{step},{value!r}" for step, value in zip(run.steps.tolist(), run.returns.tolist())]
    rows += [f"eval,{index},{value!r}" for index, value in enumerate(run.eval_returns.tolist())]
    header = f"# runtime_s={run.runtime_s!r} total_timesteps={run.total_timesteps}"
    path = folder / f"{run_name_of(run.path)}{EPISODES_SUFFIX}"
    folder.mkdir(parents=True, exist_ok=True)

    def write(file):
        with gzip.GzipFile(fileobj=file, mode="wb", mtime=0, filename="") as packed:
            packed.write("\n".join([header, "kind,step,return", *rows, ""]).encode())

    write_atomically(str(path), write)
    return path


def record_lines(packed, most_bytes: int | None = None):
    """The lines of a decompressing file, read a bounded line at a time: ValueError once they pass `most_bytes`
    (EPISODE_RECORD_MAX_BYTES if None) or a line passes EPISODE_RECORD_MAX_LINE, before more is inflated (a few kB of
    gzip can inflate to gigabytes)."""
    most_bytes = EPISODE_RECORD_MAX_BYTES if most_bytes is None else most_bytes
    total, number = 0, 0
    while line := packed.readline(EPISODE_RECORD_MAX_LINE + 1):
        number += 1
        total += len(line)
        if total > most_bytes:
            raise ValueError(f"it inflates beyond {most_bytes / 2**20:g} MiB, more than a run's episodes need")
        if len(line) > EPISODE_RECORD_MAX_LINE:
            raise ValueError(f"line {number} is longer than {EPISODE_RECORD_MAX_LINE} bytes")
        yield number, line.decode("ascii").rstrip("\r\n")


def read_episodes(path: Path) -> Run | None:
    """The `Run` of an episode record written by `write_episodes`, None when it holds no training episode; ValueError,
    saying why, for any other file."""
    train_steps, train_returns, eval_returns = array("q"), array("d"), array("d")
    try:
        if not path.is_file():
            raise ValueError("not a regular file")
        if path.stat().st_size > EPISODE_RECORD_MAX_BYTES:  # a record's gzip is far smaller than its text
            raise ValueError(f"it is larger than {EPISODE_RECORD_MAX_BYTES / 2**20:g} MiB, more than a run's episodes need")
        with gzip.open(path, "rb") as packed:
            lines = record_lines(packed)
            (_, header), (_, columns) = next(lines, (1, "")), next(lines, (2, ""))
            fields = dict(item.partition("=")[::2] for item in header.removeprefix("#").split())
            if columns != "kind,step,return" or set(fields) != {"runtime_s", "total_timesteps"}:
                raise ValueError("its header is not that of write_episodes")
            runtime_s = float(fields["runtime_s"])
            total_timesteps = None if fields["total_timesteps"] == "None" else int(fields["total_timesteps"])
            for number, row in lines:
                kind, step, value = row.split(",")
                if kind == "train":
                    train_steps.append(int(step))
                    train_returns.append(float(value))
                elif kind == "eval":
                    eval_returns.append(float(value))
                else:
                    raise ValueError(f"line {number}: {kind!r} is neither train nor eval")
    except (OSError, EOFError, UnicodeDecodeError, ValueError, OverflowError, zlib.error) as error:
        raise ValueError(f"{path}: not an episode record ({error})") from None
    if not train_returns:
        return None
    identity = parse_run_name(run_name_of(path))
    return Run(
        env_id=identity["env_id"],
        exp_name=identity["exp_name"],
        seed=identity["seed"],
        path=path,
        steps=np.frombuffer(train_steps, dtype=np.int64).copy(),
        returns=np.frombuffer(train_returns, dtype=np.float64).copy(),
        runtime_s=runtime_s,
        eval_returns=np.frombuffer(eval_returns, dtype=np.float64).copy(),
        total_timesteps=total_timesteps,
    )


def find_run_dirs(runs_dirs: list[Path]) -> list[Path]:
    """Directories below `runs_dirs` that hold event files and are named like a run, and the episode records there;
    a record of a run whose directory is found too is left aside (it holds the same episodes)."""
    found, records = set(), set()
    for root in runs_dirs:
        for event_file in root.rglob("events.out.tfevents.*"):
            if parse_run_name(event_file.parent.name) is not None:
                found.add(event_file.parent)
        for record in root.rglob(f"*{EPISODES_SUFFIX}"):
            if parse_run_name(run_name_of(record)) is not None:
                records.add(record)
    names = {path.name for path in found}
    return sorted(found | {record for record in records if run_name_of(record) not in names})


def select_runs(
    runs_dirs: list[Path],
    exp_names: list[str] | None = None,
    env_ids: list[str] | None = None,
    seeds: list[int] | None = None,
    total_timesteps: int | None = None,
) -> tuple[list[Run], list[tuple[Path, str]]]:
    """(the runs of the sweep asked for, [(run directory, why it is left out)] for every other run found).

    A run belongs to the sweep when its exp_name, env id and seed are among those asked (any, when not given), it
    logged --total-timesteps `total_timesteps` (when given) and it logged episodes. Of several runs of one exp_name,
    env id and seed (an earlier sweep's left in the same runs/), the newest is the sweep's."""
    left_out, candidates = [], []
    for path in find_run_dirs(runs_dirs):
        identity = parse_run_name(run_name_of(path))
        if exp_names and identity["exp_name"] not in exp_names:
            left_out.append((path, f"exp_name {identity['exp_name']} not asked for"))
        elif env_ids and identity["env_id"] not in env_ids:
            left_out.append((path, f"env id {identity['env_id']} not asked for"))
        elif seeds and identity["seed"] not in seeds:
            left_out.append((path, f"seed {identity['seed']} not asked for"))
        else:
            try:
                run = read_run(path, quiet=True)
            except ValueError as error:  # a damaged or hostile run: named with what is wrong, not a traceback
                why = str(error).removeprefix(f"{path}: ")
                warn(f"{path}: left out: {why}")
                left_out.append((path, why))
                continue
            if run is None:
                left_out.append((path, f"no {RETURN_TAG} logged"))
            elif total_timesteps is not None and run.total_timesteps != total_timesteps:
                logged = "no --total-timesteps logged" if run.total_timesteps is None else f"{run.total_timesteps:,} steps"
                left_out.append((path, f"{logged}, not {total_timesteps:,}"))
            else:
                candidates.append((identity["timestamp"], identity["suffix"], run))
    newest: dict[tuple[str, str, int], Run] = {}
    for _, _, run in sorted(candidates, key=lambda item: item[:2], reverse=True):
        key = (run.exp_name, run.env_id, run.seed)
        if key in newest:
            left_out.append((run.path, f"an earlier run of this exp_name, env id and seed than {newest[key].path.name}"))
        else:
            newest[key] = run
    runs = sorted(newest.values(), key=lambda run: str(run.path))
    return runs, sorted(left_out)


def load_runs(runs_dirs: list[Path], exp_names: list[str] | None = None, env_ids: list[str] | None = None) -> list[Run]:
    """The runs of `select_runs`, without the list of those left out."""
    return select_runs(runs_dirs, exp_names, env_ids)[0]


def left_out_markdown(left_out: list[tuple[Path, str]]) -> str:
    """The runs found but not reported, one line each with why: a reader sees what the tables do not hold."""
    lines = [f"- `{path}`: {reason}" for path, reason in left_out]
    return "\n".join([f"Left out: {count(len(left_out), 'run')} found under --runs-dir but not of this report.", "", *lines])


def final_score(returns: np.ndarray, last_episodes: int) -> float:
    """Mean true score of the last `last_episodes` training episodes (all of them if the run had fewer)."""
    return float(np.mean(returns[-last_episodes:]))


def group_runs(runs: list[Run], last_episodes: int = 100) -> dict[tuple[str, str], Group]:
    """Groups runs by (exp_name, env_id), seeds in increasing order."""
    by_key: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        by_key.setdefault((run.exp_name, run.env_id), []).append(run)
    groups = {}
    for (exp_name, env_id), members in by_key.items():
        members.sort(key=lambda run: run.seed)
        seeds = [run.seed for run in members]
        if len(set(seeds)) != len(seeds):
            warn(f"{exp_name} on {env_id}: seed logged more than once {seeds}; every run is counted")
        short = [run.seed for run in members if len(run.returns) < last_episodes]
        if short:
            warn(f"{exp_name} on {env_id}: seeds {short} logged fewer than {last_episodes} episodes")
        final_steps = np.array([run.steps[-1] for run in members])
        if final_steps.min() < MIXED_LENGTHS * final_steps.max():
            early = [run.seed for run, end in zip(members, final_steps) if end < MIXED_LENGTHS * final_steps.max()]
            warn(
                f"{exp_name} on {env_id}: runs of different lengths (last episode at {final_steps.min():,} to "
                f"{final_steps.max():,} env steps; seeds {early} end early): the curve stops where the shortest run "
                "ends, and the final scores come from different points of training"
            )
        groups[(exp_name, env_id)] = Group(
            exp_name=exp_name,
            env_id=env_id,
            seeds=seeds,
            final_scores=np.array([final_score(run.returns, last_episodes) for run in members]),
            runtimes_min=np.array([run.runtime_s / 60 for run in members]),
            final_steps=final_steps,
            eval_means=np.array([run.eval_returns.mean() if len(run.eval_returns) else np.nan for run in members]),
        )
    return groups


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def mean_and_spread(values: np.ndarray, decimals: int) -> str:
    """`mean ± std` over seeds (ddof=0). One seed has no spread to show: `± 0.00` would read as seeds that agree, so
    its cell says `(1 seed)` instead; several seeds that agree keep their `± 0.00`."""
    if len(values) == 1:
        return f"{values[0]:.{decimals}f} (1 seed)"
    return f"{np.mean(values):.{decimals}f} ± {np.std(values):.{decimals}f}"


def performance_markdown(groups: dict, exp_names: list[str], env_ids: list[str], last_episodes: int = 100) -> str:
    """Final return (mean +- std over seeds), runtime and the seeds/steps behind each cell."""

    def cell(exp_name, env_id, fmt):
        group = groups.get((exp_name, env_id))
        return "-" if group is None else fmt(group)

    header = ["Environment", *exp_names]
    returns = [
        [env_id, *(cell(e, env_id, lambda g: mean_and_spread(g.final_scores, 2)) for e in exp_names)] for env_id in env_ids
    ]
    runtimes = [
        [env_id, *(cell(e, env_id, lambda g: f"{np.mean(g.runtimes_min):.1f}") for e in exp_names)] for env_id in env_ids
    ]
    provenance = [
        [
            env_id,
            *(
                cell(e, env_id, lambda g: f"{len(g.seeds)} ({', '.join(map(str, g.seeds))}); {int(np.max(g.final_steps)):,}")
                for e in exp_names
            ),
        ]
        for env_id in env_ids
    ]

    def evaluation(group: Group) -> str:
        evaluated = group.eval_means[~np.isnan(group.eval_means)]
        if not len(evaluated):
            return "-"
        if len(evaluated) == len(group.seeds):
            return mean_and_spread(evaluated, 2)
        if len(evaluated) == 1:  # one "(...)" that says both: no spread, and which share of the seeds
            return f"{evaluated[0]:.2f} (1 of {len(group.seeds)} seeds)"
        return f"{mean_and_spread(evaluated, 2)} ({len(evaluated)} of {len(group.seeds)} seeds)"

    evaluations = [[env_id, *(cell(e, env_id, evaluation) for e in exp_names)] for env_id in env_ids]
    evaluated = any(np.any(~np.isnan(group.eval_means)) for group in groups.values())
    evaluation_section = [
        "Evaluation after training (`--save-model`): mean ± std over seeds of each run's mean evaluation score.",
        markdown_table(header, evaluations),
    ]
    return "\n\n".join(
        [
            f"Episodic return: mean ± std over seeds of each run's last-{last_episodes}-episode mean "
            "(true game score of training episodes; std with ddof=0).",
            markdown_table(header, returns),
            *(evaluation_section if evaluated else []),
            "Wall-clock runtime in minutes, mean over seeds (first to last event of each run).",
            markdown_table(header, runtimes),
            "Seeds (ids) and env steps of the last logged episode, per cell.",
            markdown_table(header, provenance),
        ]
    )


def load_human_random_scores(path: Path = HUMAN_RANDOM_CSV) -> dict[str, tuple[float, float]]:
    """game (snake_case) -> (random score, human score); ValueError, saying why, for a file that is not such a table
    (other columns, a score that is not a finite number, a game twice, a human score equal to the random one, which
    would normalise by zero) or is over SCORES_CSV_MAX_BYTES."""
    try:
        if not path.is_file():
            raise ValueError("not a regular file" if path.exists() else "no such file")
        with open(path, "rb") as file:
            data = file.read(SCORES_CSV_MAX_BYTES + 1)
        if len(data) > SCORES_CSV_MAX_BYTES:
            raise ValueError(f"over {SCORES_CSV_MAX_BYTES // 1024} kB, more than a table of games needs")
        reader = csv.DictReader(io.StringIO(data.decode()))
        if not {"game", "random", "human"} <= set(reader.fieldnames or []):
            raise ValueError(f"its columns are {reader.fieldnames}, not game, random and human")
        table = {}
        for row in reader:
            where = f"line {reader.line_num}"
            game, random_score, human_score = row["game"], table_score(row, "random", where), table_score(row, "human", where)
            if random_score == human_score:
                raise ValueError(f"{where}: {game}'s human score is its random score (it would normalise by zero)")
            if game in table:
                raise ValueError(f"{where}: {game} is in it twice")
            table[game] = (random_score, human_score)
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ValueError(f"cannot read it ({getattr(error, 'strerror', None) or error})") from None
    return table


def table_score(row: dict, column: str, where: str) -> float:
    """The finite number in `column` of a row of the score table; ValueError, saying where, for anything else."""
    try:
        value = float(row[column])
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{where}: {column} score {row[column]!r} is not a finite number")
    return value


def atari_game_name(env_id: str) -> str:
    """envpool id -> snake_case game name of the score table: `MsPacman-v5` -> `ms_pacman`. MinAtar's games share
    Atari's names but not its scores: their ids name no game of the table."""
    if env_id.startswith("MinAtar/"):
        return ""
    base = re.sub(r"-v\d+$", "", env_id.split("/")[-1])
    return re.sub(r"(?<!^)(?=[A-Z])", "_", base).lower()


def human_normalized_score(score, random_score: float, human_score: float):
    """(score - random) / (human - random): 0 = random play, 1 = the human reference."""
    return (np.asarray(score, dtype=np.float64) - random_score) / (human_score - random_score)


def human_normalized_matrices(
    groups: dict, exp_names: list[str], env_ids: list[str], scores_table: dict[str, tuple[float, float]]
) -> dict[str, tuple[list[str], np.ndarray]]:
    """exp_name -> (Atari env ids, (num_runs, num_games) human-normalized final scores); ValueError when the score
    table's numbers make them infinite.

    rliable needs the same number of runs on every game: when seeds differ, the first (lowest) seeds are kept.
    """
    matrices = {}
    for exp_name in exp_names:
        games = [env_id for env_id in env_ids if (exp_name, env_id) in groups and atari_game_name(env_id) in scores_table]
        if not games:
            continue
        num_runs = min(len(groups[(exp_name, env_id)].seeds) for env_id in games)
        columns = []
        for env_id in games:
            group = groups[(exp_name, env_id)]
            if len(group.seeds) > num_runs:
                warn(f"{exp_name} on {env_id}: using the first {num_runs} seeds for aggregate statistics")
            random_score, human_score = scores_table[atari_game_name(env_id)]
            with np.errstate(over="ignore"):  # said below in one line instead
                column = human_normalized_score(group.final_scores[:num_runs], random_score, human_score)
            if not np.isfinite(column).all():  # a human score a hair from the random one
                raise ValueError(
                    f"{atari_game_name(env_id)}'s random and human scores ({random_score!r}, {human_score!r}) "
                    f"normalise {exp_name}'s scores to infinity"
                )
            columns.append(column)
        matrices[exp_name] = (games, np.stack(columns, axis=1))
    return matrices


def aggregate_with_confidence(
    matrices: dict[str, tuple[list[str], np.ndarray]], reps: int = 50_000, seed: int = 0
) -> dict[str, dict[str, tuple[float, float, float]]]:
    """exp_name -> {"median"|"iqm": (point estimate, CI low, CI high)}, 95% stratified bootstrap over runs.

    median: median over games of the per-game mean over runs; IQM: mean of the middle 50% of all
    (run, game) scores (Agarwal et al. 2021).
    """
    from rliable import library as rly
    from rliable import metrics

    def median_and_iqm(scores):
        return np.array([metrics.aggregate_median(scores), metrics.aggregate_iqm(scores)])

    with warnings.catch_warnings():  # arch deprecates the `random_state` keyword that rliable passes on
        warnings.simplefilter("ignore", FutureWarning)
        points, intervals = rly.get_interval_estimates(
            {exp_name: matrix for exp_name, (_, matrix) in matrices.items()},
            median_and_iqm,
            reps=reps,
            random_state=np.random.RandomState(seed),
        )
    return {
        exp_name: {
            name: (float(points[exp_name][i]), float(intervals[exp_name][0, i]), float(intervals[exp_name][1, i]))
            for i, name in enumerate(["median", "iqm"])
        }
        for exp_name in points
    }


def atari_markdown(matrices: dict, aggregates: dict, last_episodes: int = 100) -> str:
    exp_names = list(matrices)
    env_ids = list(dict.fromkeys(env_id for games, _ in matrices.values() for env_id in games))
    rows = []
    for env_id in env_ids:
        row = [env_id]
        for exp_name in exp_names:
            games, matrix = matrices[exp_name]
            if env_id in games:
                column = matrix[:, games.index(env_id)]
                row.append(mean_and_spread(column, 3))
            else:
                row.append("-")
        rows.append(row)
    for name, label in [("median", "Median"), ("iqm", "IQM")]:
        row = [f"**{label}** (95% CI)"]
        for exp_name in exp_names:
            point, low, high = aggregates[exp_name][name]
            row.append(f"**{point:.3f}** [{low:.3f}, {high:.3f}]")
        rows.append(row)
    counts = ", ".join(f"{e}: {m.shape[1]} games x {m.shape[0]} runs" for e, (_, m) in matrices.items())
    return "\n\n".join(
        [
            f"Human-normalized score (0 = random, 1 = human) of each run's last-{last_episodes}-training-episode "
            f"mean; per game mean ± std over seeds; median and IQM over games and runs with 95% "
            f"stratified-bootstrap confidence intervals ({counts}).",
            markdown_table(["Environment", *exp_names], rows),
        ]
    )


def smoothed_curve(run: Run, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Trailing mean over the last `window` episodes, one point per distinct env step (the last episode there)."""
    cumulative = np.concatenate([[0.0], np.cumsum(run.returns)])
    counts = np.minimum(np.arange(1, len(run.returns) + 1), window)
    ends = np.arange(1, len(run.returns) + 1)
    trailing_mean = (cumulative[ends] - cumulative[ends - counts]) / counts
    # several envs can finish an episode at the same step: keep the last one, so steps strictly increase
    reversed_steps = run.steps[::-1]
    unique_steps, first_in_reversed = np.unique(reversed_steps, return_index=True)
    return unique_steps, trailing_mean[len(run.returns) - 1 - first_in_reversed]


def learning_curve(runs: list[Run], num_points: int = 200, window: int = 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid, mean, std) over seeds on a common grid of env steps that every run covers (no extrapolation).

    Raises ValueError, saying why, when there is no such range: a run whose episodes all ended at one env step,
    or runs that share no steps.
    """
    curves = [smoothed_curve(run, window) for run in runs]
    too_short = [run.seed for run, (steps, _) in zip(runs, curves) if len(steps) < 2]
    if too_short:
        raise ValueError(f"seeds {too_short} logged episodes at fewer than 2 distinct env steps")
    start = max(steps[0] for steps, _ in curves)
    stop = min(steps[-1] for steps, _ in curves)
    if start >= stop:
        raise ValueError(
            f"the runs share no range of env steps (the latest first episode ends at {start:,}, the earliest last at {stop:,})"
        )
    grid = np.linspace(start, stop, num_points)
    values = np.stack([np.interp(grid, steps, returns) for steps, returns in curves])
    return grid, values.mean(axis=0), values.std(axis=0)


def plot_learning_curves(
    runs: list[Run],
    exp_names: list[str],
    env_ids: list[str],
    path: Path,
    num_points: int = 200,
    window: int = 20,
    scores_table: dict[str, tuple[float, float]] | None = None,
) -> None:
    """One panel per env id; Atari ids (those in `scores_table`) count agent steps on the x-axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    num_cols = min(3, len(env_ids))
    num_rows = -(-len(env_ids) // num_cols)
    figure, axes = plt.subplots(num_rows, num_cols, figsize=(5 * num_cols, 3.6 * num_rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    scores_table = load_human_random_scores() if scores_table is None else scores_table
    for ax, env_id in zip(axes.flat, env_ids):
        drawn = 0
        for i, exp_name in enumerate(exp_names):
            members = [run for run in runs if run.exp_name == exp_name and run.env_id == env_id]
            if not members:
                continue
            try:
                grid, mean, std = learning_curve(members, num_points, window)
            except ValueError as reason:
                warn(f"{exp_name} on {env_id}: no curve drawn: {reason}")
                continue
            color = colors[i % len(colors)]
            linestyle = ("-", "--", ":", "-.")[i // len(colors) % 4]  # past the colour cycle, a name keeps its own line
            ax.plot(grid, mean, color=color, linestyle=linestyle, label=f"{exp_name} ({count(len(members), 'seed')})")
            ax.fill_between(grid, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)
            drawn += 1
        ax.set_title(env_id)
        atari = atari_game_name(env_id) in scores_table
        ax.set_xlabel("agent steps (not frames)" if atari else "env steps")
        ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))  # 200k, 1M: no overlapping labels
        ax.set_ylabel(f"episodic return ({window}-episode mean)")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no curve to draw", transform=ax.transAxes, ha="center", va="center", color="gray")
    for ax in axes.flat[len(env_ids) :]:
        ax.set_visible(False)
    figure.suptitle(
        f"line: mean over seeds of each run's trailing {window}-episode mean return\n"
        "band: ± 1 standard deviation over seeds (none for 1 seed)",
        fontsize="small",
    )
    figure.tight_layout()
    from cleanrl_q_utils.checkpoint_files import write_atomically

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(str(path), lambda file: figure.savefig(file, format="png", dpi=120))
    finally:
        plt.close(figure)


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit status 2, as for every other bad flag
        fail(message)


def fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser(prog="report.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs-dir", nargs="+", type=Path, default=[Path("runs")], help="where the run directories are (searched recursively)"
    )
    parser.add_argument("--exp-names", nargs="+", default=None, help="exp_names to report, in column order (default: all)")
    parser.add_argument("--env-ids", nargs="+", default=None, help="env ids to report, in row order (default: all, sorted)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="seeds to report (default: all)")
    parser.add_argument(
        "--total-timesteps", type=int, default=None, help="report only runs of this --total-timesteps (default: any)"
    )
    parser.add_argument("--output-dir", type=Path, default=Path("benchmark/results"), help="where the files are written")
    parser.add_argument("--name", default="results", help="file name stem: <name>.md and <name>_curves.png")
    parser.add_argument("--last-episodes", type=int, default=100, help="final performance = mean of this many last episodes")
    parser.add_argument("--smoothing-window", type=int, default=20, help="episodes in the trailing mean of the plotted curves")
    parser.add_argument("--num-points", type=int, default=200, help="points of the common env-step grid of the curves")
    parser.add_argument(
        "--bootstrap-reps", type=int, default=50_000, help="bootstrap resamples for the Atari confidence intervals"
    )
    parser.add_argument(
        "--scores-csv", type=Path, default=HUMAN_RANDOM_CSV, help="random and human scores per Atari game (read for -v5 ids)"
    )
    parser.add_argument("--no-plot", action="store_true", help="write only the markdown")
    parser.add_argument(
        "--export-episodes",
        type=Path,
        default=None,
        help="also write each reported run's episodes to DIR/<run name>.episodes.csv.gz, which --runs-dir reads back",
    )
    args = parser.parse_args(argv)
    check_counts(
        args,
        {
            "last_episodes": MOST_COUNT,
            "smoothing_window": MOST_COUNT,
            "num_points": MOST_POINTS,
            "bootstrap_reps": MOST_BOOTSTRAP_REPS,
            "total_timesteps": None,
        },
    )
    # the longest file the report makes of --name is the temporary file of <name>_curves.png
    most = name_max(args.output_dir) - len(temporary_name("_curves.png").encode())
    if not is_plain_name(args.name) or len(args.name.encode()) > most:
        fail(f"--name={args.name}: must be a file name stem (no /) of at most {most} bytes on this file system")
    check_writable(args.output_dir)
    if args.export_episodes is not None:
        check_writable(args.export_episodes, "--export-episodes")
    return args


def check_counts(args: argparse.Namespace, most: dict[str, int | None]) -> None:
    """Stops in one line at a count flag below 1 or above its upper end (None: no upper end)."""
    for flag, upper in most.items():
        value = getattr(args, flag)
        if value is not None and not 1 <= value <= (upper or value):
            allowed = "must be at least 1" if upper is None else f"must be between 1 and {upper:,}"
            fail(f"--{flag.replace('_', '-')}={value}: {allowed}")


def is_plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\x00" not in name and name not in (".", "..")


def name_max(folder: Path) -> int:
    """The longest file name, in bytes, that the file system of `folder` (or of its nearest existing parent, when it is
    yet to be made) takes; 255 where it does not say."""
    for existing in (folder, *folder.absolute().parents):
        try:
            return os.pathconf(existing, "PC_NAME_MAX")
        except (OSError, ValueError):
            continue
    return 255


def temporary_name(name: str) -> str:
    """The name of the temporary file that `write_atomically` writes before renaming it to `name` (its longest)."""
    return f".{name}.{'x' * 8}.tmp"


def fits_file_name(name: str, folder: Path) -> bool:
    """Whether a file `name`, and its temporary file, can be made in `folder`: checked before any file is written, so
    that a long run name stops the report at once, not when its last file is written."""
    return len(temporary_name(name).encode()) <= name_max(folder)


def check_writable(output_dir: Path, flag: str = "--output-dir") -> None:
    """Stops before reading any run when the report could not be written (a read-only or unmakeable folder)."""
    if output_dir.exists() and not output_dir.is_dir():
        fail(f"{flag}={output_dir}: not a folder; choose a folder you can write to")
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=output_dir):
            pass
    except (OSError, ValueError) as error:
        why = getattr(error, "strerror", None) or error
        fail(f"{flag}={output_dir}: cannot write there ({why}); choose a folder you can write to")


def needs_scores_table(env_ids: list[str]) -> bool:
    """Whether any of `env_ids` may be an Atari game of the score table: envpool's Atari ids end in -v5. The table is
    read only then, so that a report of other envs needs no table."""
    return any(env_id.endswith("-v5") and atari_game_name(env_id) for env_id in env_ids)


def print_output(text: str) -> None:
    """Prints `text` on stdout; a reader that closed the pipe (`| head`) is no error: the files are written."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes at exit


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    runs, left_out = select_runs(args.runs_dir, args.exp_names, args.env_ids, args.seeds, args.total_timesteps)
    if left_out:
        warn(f"{count(len(left_out), 'run')} found under --runs-dir left out (not of this sweep): listed in the report")
    if not runs:
        print(f"error: no run of this sweep with {RETURN_TAG} under {' '.join(map(str, args.runs_dir))}", file=sys.stderr)
        if left_out:
            print(left_out_markdown(left_out), file=sys.stderr)
        return 1
    exp_names = args.exp_names or list(dict.fromkeys(sorted(run.exp_name for run in runs)))
    for exp_name in args.exp_names or []:
        if not any(run.exp_name == exp_name for run in runs):
            warn(f"requested exp_name {exp_name} has no runs under {' '.join(map(str, args.runs_dir))}; left out")
    for env_id in args.env_ids or []:
        if not any(run.env_id == env_id for run in runs):
            warn(f"requested env id {env_id} has no runs under {' '.join(map(str, args.runs_dir))}; left out")
    exp_names = [exp_name for exp_name in exp_names if any(run.exp_name == exp_name for run in runs)]
    env_ids = args.env_ids or sorted({run.env_id for run in runs})
    env_ids = [env_id for env_id in env_ids if any(run.env_id == env_id for run in runs)]
    if not args.no_plot and len(env_ids) > MOST_PANELS:
        fail(f"--env-ids: {len(env_ids)} env ids to plot, more than the {MOST_PANELS} panels a figure holds; use --no-plot")
    if args.export_episodes is not None:
        for run in runs:
            if not fits_file_name(f"{run_name_of(run.path)}{EPISODES_SUFFIX}", args.export_episodes):
                fail(f"--export-episodes={args.export_episodes}: the record of {run.path} would have too long a file name")
    groups = group_runs(runs, args.last_episodes)

    sections = [performance_markdown(groups, exp_names, env_ids, args.last_episodes)]
    scores_table = {}
    try:
        if needs_scores_table(env_ids):
            scores_table = load_human_random_scores(args.scores_csv)
        matrices = human_normalized_matrices(groups, exp_names, env_ids, scores_table)
    except ValueError as error:
        fail(f"--scores-csv={args.scores_csv}: {error}")
    report_path, curves_path = args.output_dir / f"{args.name}.md", args.output_dir / f"{args.name}_curves.png"
    # Said before the slow part (bootstrap, curves), once nothing can stop the report but a failed write.
    written = f"{report_path}" if args.no_plot else f"{report_path} and {curves_path}"
    print_output(f"report.py: {count(len(runs), 'run')} reported; writing {written}")
    if matrices:
        aggregates = aggregate_with_confidence(matrices, reps=args.bootstrap_reps)
        sections.append(atari_markdown(matrices, aggregates, args.last_episodes))
    try:
        if not args.no_plot:
            plot_learning_curves(runs, exp_names, env_ids, curves_path, args.num_points, args.smoothing_window, scores_table)
            sections.append(f"Learning curves: `{curves_path}`")
        if args.export_episodes is not None:
            records = [write_episodes(run, args.export_episodes) for run in runs]
            sections.append(f"Episode records: {count(len(records), 'run')} in `{args.export_episodes}`")
        markdown = "\n\n".join(sections + ([left_out_markdown(left_out)] if left_out else [])) + "\n"
        write_text(report_path, markdown)
    except OSError as error:
        fail(f"cannot write {error.filename or 'a file'}: {error.strerror or error}")
    # The console gets the tables and one line for the runs left out; the report file lists them, with why.
    if left_out:
        sections.append(
            f"Left out: {count(len(left_out), 'run')} found under --runs-dir but not of this report, listed in `{report_path}`"
        )
    print_output("\n\n".join(sections))
    return 0


def write_text(path: Path, text: str) -> None:
    """Writes `text` to `path` whole or not at all."""
    from cleanrl_q_utils.checkpoint_files import write_atomically

    write_atomically(str(path), lambda file: file.write(text.encode()))


if __name__ == "__main__":
    from cleanrl_q_utils.stop_signals import quiet_when_gone

    # Output piped into `head`, which exits once it has its lines, ends the program quietly with its own status.
    quiet_when_gone()
    sys.exit(main())
