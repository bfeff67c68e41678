"""Run reading: what the benchmark tools know of a run and how they read it, in one place.

Holds the run name (`{env_id}__{exp_name}__{seed}__{timestamp}[_{suffix}]`) and its parsing; finding the run folders
and episode records below a folder; reading a run folder's TensorBoard event files offline, or an episode record (the
format report.py's `write_episodes` writes), into a `Run`; the bounds that keep a damaged or hostile file from costing
memory or time, and the checks that leave such a run out, said in one `warning:` line; choosing the runs of a sweep
(the newest of each exp_name, env id and seed) and saying which were left out and why; and a run's final return (the
mean of its last training episodes).

report.py, threshold_table.py and launch.py import it, so that a run is read the same way by each. It imports only the
standard library and numpy at its top, and TensorBoard's reader and cleanrl_q_utils.flag_errors where a run folder is
read; never a script of benchmark/, so any of them can import it.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import re
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = str(Path(__file__).resolve().parents[1])
if REPO not in sys.path:  # the run plumbing, for a launcher's Ray or Slurm worker that imports only this module
    sys.path.append(REPO)

RETURN_TAG = "charts/episodic_return"
EVAL_TAG = "eval/episodic_return"
RUN_NAME = re.compile(r"^(?P<env_id>.+?)__(?P<exp_name>.+)__(?P<seed>-?\d+)__(?P<timestamp>\d+)(?:_(?P<suffix>\d+))?$")
HYPERPARAMETERS_TAG = "hyperparameters/text_summary"
EPISODES_SUFFIX = ".episodes.csv.gz"
"""the file name ending of an episode record (`write_episodes`)"""
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


def final_score(returns: np.ndarray, last_episodes: int) -> float:
    """Mean true score of the last `last_episodes` training episodes (all of them if the run had fewer)."""
    return float(np.mean(returns[-last_episodes:]))
