"""Damaged, hostile and mistaken inputs of benchmark/report.py and benchmark/threshold_table.py: each is refused or
left out in one line, with a non-zero exit where nothing can be reported, never a traceback, a nan or inf in a table,
a file left half-written or memory spent on a file's say-so. Records are written by hand in tmp_path."""

import gzip
import os
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from benchmark_runs import load_benchmark_module

REPO = Path(__file__).resolve().parents[1]
report = load_benchmark_module("report")
run_reading = load_benchmark_module("run_reading")
threshold_table = load_benchmark_module("threshold_table")

HEADER = "# runtime_s=60.0 total_timesteps=1000"


def write_record(folder: Path, rows: list[str], name: str = "CartPole-v1__pqn__1__1700000001", header: str = HEADER):
    """An episode record as write_episodes lays it out, with `rows` (`kind,step,return`) as given."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.episodes.csv.gz"
    path.write_bytes(gzip.compress("\n".join([header, "kind,step,return", *rows, ""]).encode()))
    return path


def honest_rows(episodes: int = 20, score: float = 10.0) -> list[str]:
    """Training episodes of one score, every 100 steps: every mean of them is `score`."""
    return [f"train,{100 * (i + 1)},{score!r}" for i in range(episodes)]


def run_report(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of report.main in this process."""
    try:
        status = report.main(argv)
    except SystemExit as stop:
        status = stop.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def assert_one_error_line(err: str, start: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), err
    assert "Traceback" not in err


def repeated_gzip_member(text: bytes, times: int) -> bytes:
    """A gzip file that inflates to `text` repeated `times` times, built in milliseconds: gzip files may be a
    sequence of members, and the member is compressed once."""
    return gzip.compress(text, compresslevel=1) * times


def test_a_record_that_inflates_beyond_the_bound_is_refused(tmp_path):
    # 100 MiB of valid rows of 250 bytes (a float written with many zeros) from 1 MiB of gzip
    row = ("train,1,1." + "0" * 239 + "\n").encode()
    head = f"{HEADER}\nkind,step,return\n".encode()
    path = tmp_path / "CartPole-v1__pqn__1__1700000001.episodes.csv.gz"
    path.write_bytes(gzip.compress(head) + repeated_gzip_member(row * (2**20 // len(row)), 100))
    with pytest.raises(ValueError, match="inflates beyond 64 MiB") as refused:
        run_reading.read_run(path)
    assert str(refused.value).startswith(f"{path}: not an episode record (")


def test_a_record_of_one_endless_line_is_refused_before_its_memory_is_spent(tmp_path):
    path = tmp_path / "CartPole-v1__pqn__1__1700000001.episodes.csv.gz"
    path.write_bytes(
        gzip.compress(f"{HEADER}\nkind,step,return\ntrain,1,".encode()) + repeated_gzip_member(bytes(2**20), 1024)
    )
    tracemalloc.start()
    with pytest.raises(ValueError, match="line 3 is longer than 256 bytes"):
        run_reading.read_run(path)
    assert tracemalloc.get_traced_memory()[1] < 4 * 2**20  # of the 1 GiB it inflates to
    tracemalloc.stop()


def test_a_record_file_larger_than_the_bound_is_refused_unread(tmp_path):
    path = write_record(tmp_path, honest_rows())
    with open(path, "r+b") as file:
        file.truncate(run_reading.EPISODE_RECORD_MAX_BYTES + 1)  # sparse: made at once, and never read
    with pytest.raises(ValueError, match="it is larger than 64 MiB"):
        run_reading.read_run(path)


def test_the_inflation_bound_counts_every_byte_of_the_record(tmp_path, monkeypatch):
    path = write_record(tmp_path, honest_rows(100))
    assert len(run_reading.read_run(path).returns) == 100
    monkeypatch.setattr(run_reading, "EPISODE_RECORD_MAX_BYTES", len(gzip.decompress(path.read_bytes())) - 1)
    with pytest.raises(ValueError, match="inflates beyond"):
        run_reading.read_run(path)


@pytest.mark.parametrize(
    "rows, header, why",
    [
        (["train,100,nan", "train,200,1.0"], HEADER, "training episode returns hold 1 value that no game scores"),
        (["train,100,inf"], HEADER, "training episode returns hold 1 value that no game scores"),
        (["train,100,1e300", "train,200,-1e300"], HEADER, "training episode returns hold 2 values that no game scores"),
        (["train,100,1.0", "eval,0,-inf"], HEADER, "evaluation returns hold 1 value that no game scores"),
        (["train,100,1.0"], "# runtime_s=nan total_timesteps=1000", "its run time nan s is not in [0, 1e+09]"),
        (["train,100,1.0"], "# runtime_s=inf total_timesteps=1000", "its run time inf s is not in [0, 1e+09]"),
        (["train,100,1.0"], "# runtime_s=-5.0 total_timesteps=1000", "its run time -5.0 s is not in [0, 1e+09]"),
        (["train,-100,1.0"], HEADER, "a training episode ends at a negative step (-100)"),
        (["train,100,1.0"], "# runtime_s=1.0 total_timesteps=0", "its --total-timesteps 0 is not at least 1"),
        (["train,99999999999999999999999,1.0"], HEADER, "not an episode record (int too big to convert)"),
        (["train,100,1.0", "test,1,2.0"], HEADER, "not an episode record (line 4: 'test' is neither train nor eval)"),
    ],
)
def test_a_record_with_numbers_no_run_logs_is_left_out_in_one_line(tmp_path, capsys, rows, header, why):
    """The damaged seed is named with what is wrong; the honest seed beside it is reported, and no table holds nan or
    inf."""
    damaged = write_record(tmp_path / "runs", rows, header=header)
    write_record(tmp_path / "runs", honest_rows(), name="CartPole-v1__pqn__2__1700000002")
    status, out, err = run_report(
        ["--runs-dir", str(tmp_path / "runs"), "--output-dir", str(tmp_path / "out"), "--no-plot"], capsys
    )
    assert status == 0, err
    assert err.splitlines()[0].startswith(f"warning: {damaged}: left out: {why}")
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert "| CartPole-v1 | 1 (2); 2,000 |" in markdown  # seed 2 alone
    assert f"- `{damaged}`: {why}" in markdown
    tables = markdown.split("Left out")[0].lower()
    assert "nan" not in tables and "inf" not in tables


def test_a_record_without_training_episodes_is_left_out_and_alone_is_an_error(tmp_path, capsys):
    write_record(tmp_path / "runs", ["eval,0,5.0", "eval,1,6.0"])
    status, out, err = run_report(["--runs-dir", str(tmp_path / "runs"), "--output-dir", str(tmp_path / "out")], capsys)
    assert status == 1 and out == "" and "Traceback" not in err
    assert f"error: no run of this sweep with charts/episodic_return under {tmp_path / 'runs'}" in err.splitlines()
    assert "CartPole-v1__pqn__1__1700000001.episodes.csv.gz`: no charts/episodic_return logged" in err
    assert not (tmp_path / "out" / "results.md").exists()
    # the threshold table says the same
    argv = ["--runs-dir", str(tmp_path / "runs"), "--env-ids", "CartPole-v1", "--thresholds", "1", "--exp-names", "pqn"]
    assert threshold_table.main(argv) == 1


def test_a_folder_or_fifo_named_like_a_record_is_left_out_without_blocking(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    os.mkfifo(tmp_path / "runs" / "CartPole-v1__pqn__1__1700000001.episodes.csv.gz")
    (tmp_path / "runs" / "CartPole-v1__pqn__3__1700000003.episodes.csv.gz").mkdir()
    write_record(tmp_path / "runs", honest_rows(), name="CartPole-v1__pqn__2__1700000002")
    runs, left_out = run_reading.select_runs([tmp_path / "runs"])
    assert [run.seed for run in runs] == [2]
    assert [why for _, why in left_out] == ["not an episode record (not a regular file)"] * 2


def write_event_run(folder: Path, returns: list[float], name: str = "CartPole-v1__pqn__1__1700000001") -> Path:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder / name))
    for i, value in enumerate(returns):
        writer.add_scalar("charts/episodic_return", value, 100 * (i + 1))
    writer.close()
    return folder / name


def test_an_event_file_record_of_a_hostile_length_is_refused_before_it_is_allocated(tmp_path, capsys):
    """TensorBoard's reader asks for a record's declared length at once: 2**40 bytes would stop it with MemoryError."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    run_dir = write_event_run(tmp_path / "runs", [1.0, 2.0, 3.0])
    (event_file,) = run_dir.glob("events.out.tfevents.*")
    honest_size = event_file.stat().st_size
    length = struct.pack("<Q", 2**40)
    with open(event_file, "ab") as file:
        file.write(length + struct.pack("<I", masked_crc32c(length)) + b"x" * 100)
    with pytest.raises(ValueError, match=f"the record at byte {honest_size:,} declares 1,099,511,627,776 bytes"):
        run_reading.read_run(run_dir)
    write_event_run(tmp_path / "runs", [5.0] * 3, name="CartPole-v1__pqn__2__1700000002")
    status, out, err = run_report(
        ["--runs-dir", str(tmp_path / "runs"), "--output-dir", str(tmp_path / "out"), "--no-plot"], capsys
    )
    assert status == 0 and err.startswith(f"warning: {run_dir}: left out: {event_file.name}: the record at byte")
    assert "| CartPole-v1 | 5.00 (1 seed) |" in out


def test_an_event_file_cut_short_while_writing_is_read_up_to_its_last_whole_record(tmp_path):
    run_dir = write_event_run(tmp_path / "runs", [1.0, 2.0, 3.0])
    (event_file,) = run_dir.glob("events.out.tfevents.*")
    event_file.write_bytes(event_file.read_bytes()[:-10])  # a run killed in the middle of its last record
    np.testing.assert_array_equal(run_reading.read_run(run_dir).returns, [1.0, 2.0])


def test_an_event_file_damaged_in_its_middle_is_left_out_not_read_in_part(tmp_path):
    """TensorBoard's reader stops at the first record that fails its checksum: the run would lose its later episodes."""
    run_dir = write_event_run(tmp_path / "runs", [float(i) for i in range(50)])
    (event_file,) = run_dir.glob("events.out.tfevents.*")
    data = bytearray(event_file.read_bytes())
    data[data.index(b"episodic_return", len(data) // 2)] ^= 1  # a letter of a tag in the middle of the file
    event_file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="TensorBoard stops reading a file at a damaged record \\(failed event crc32 check"):
        run_reading.read_run(run_dir)


def test_a_run_whose_event_files_would_not_fit_in_memory_is_left_out(tmp_path, monkeypatch):
    from cleanrl_q_utils import flag_errors

    run_dir = write_event_run(tmp_path / "runs", [1.0, 2.0])
    size = sum(path.stat().st_size for path in run_dir.glob("events*"))
    monkeypatch.setattr(flag_errors, "available_memory_bytes", lambda: size * run_reading.EVENT_MEMORY_FACTOR - 1)
    with pytest.raises(ValueError, match="which need about .* GB to read, and .* GB are available"):
        run_reading.read_run(run_dir)
    monkeypatch.setattr(flag_errors, "available_memory_bytes", lambda: size * run_reading.EVENT_MEMORY_FACTOR)
    assert len(run_reading.read_run(run_dir).returns) == 2


def test_an_event_file_that_is_a_fifo_is_left_out_without_blocking(tmp_path):
    run_dir = write_event_run(tmp_path / "runs", [1.0])
    os.mkfifo(run_dir / "events.out.tfevents.2.host")
    with pytest.raises(ValueError, match="events.out.tfevents.2.host is not a regular file"):
        run_reading.read_run(run_dir)


def test_an_event_run_of_nan_scores_is_left_out(tmp_path):
    run_dir = write_event_run(tmp_path / "runs", [1.0, float("nan")])
    runs, left_out = run_reading.select_runs([tmp_path / "runs"])
    assert runs == [] and left_out == [(run_dir, "training episode returns hold 1 value that no game scores "
                                                 "(NaN, infinite or beyond ±1e+15), the first nan")]  # fmt: skip


def atari_and_cartpole(folder: Path) -> None:
    write_record(folder, honest_rows(), name="Breakout-v5__pqn__1__1700000001")
    write_record(folder, honest_rows(), name="CartPole-v1__pqn__1__1700000002")


@pytest.mark.parametrize(
    "table, why",
    [
        ("name,random,human\nbreakout,1.7,30.5\n", "its columns are ['name', 'random', 'human'], not game, random and human"),
        ("game,random,human\nbreakout,1.7\n", "line 2: human score None is not a finite number"),
        ("game,random,human\nbreakout,1.7,nan\n", "line 2: human score 'nan' is not a finite number"),
        ("game,random,human\nbreakout,x,30\n", "line 2: random score 'x' is not a finite number"),
        ("game,random,human\nbreakout,1.7,1.7\n", "line 2: breakout's human score is its random score"),
        ("game,random,human\nbreakout,1,2\nbreakout,1,3\n", "line 3: breakout is in it twice"),
        ("game,random,human\nbreakout,0,1e-320\n", "breakout's random and human scores (0.0, 1e-320) normalise pqn's"),
        ("game,random,human\n" + "x" * 2**20, "over 1024 kB, more than a table of games needs"),
        (b"game,random,human\nbreakout,\xff,1\n", "cannot read it ("),
        (None, "no such file"),
    ],
)
def test_a_wrong_scores_table_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys, table, why):
    atari_and_cartpole(tmp_path / "runs")
    scores = tmp_path / "scores.csv"
    if table is not None:
        scores.write_bytes(table if isinstance(table, bytes) else table.encode())
    argv = ["--runs-dir", str(tmp_path / "runs"), "--output-dir", str(tmp_path / "out"), "--scores-csv", str(scores)]
    status, out, err = run_report([*argv, "--last-episodes", "5"], capsys)
    assert status == 2 and out == ""
    assert_one_error_line(err, f"error: --scores-csv={scores}: {why}")
    assert list((tmp_path / "out").iterdir()) == []


def test_the_scores_table_is_not_read_without_an_atari_run(tmp_path, capsys):
    write_record(tmp_path / "runs", honest_rows())
    argv = ["--runs-dir", str(tmp_path / "runs"), "--output-dir", str(tmp_path / "out"), "--scores-csv", str(tmp_path / "no")]
    status, out, err = run_report([*argv, "--last-episodes", "5"], capsys)
    assert status == 0 and err == ""
    assert "| CartPole-v1 | 10.00 (1 seed) |" in out and "Human-normalized" not in out
    assert (tmp_path / "out" / "results_curves.png").exists()


@pytest.mark.parametrize(
    "flag, value, allowed",
    [
        ("--num-points", str(10**12), "must be between 1 and 10,000"),
        ("--smoothing-window", str(10**30), "must be between 1 and 1,000,000,000"),
        ("--last-episodes", str(10**30), "must be between 1 and 1,000,000,000"),
        ("--bootstrap-reps", str(10**9), "must be between 1 and 1,000,000"),
        ("--bootstrap-reps", "0", "must be between 1 and 1,000,000"),
        ("--total-timesteps", "0", "must be at least 1"),
    ],
)
def test_a_count_flag_out_of_range_is_refused_before_any_run_is_read(tmp_path, capsys, monkeypatch, flag, value, allowed):
    monkeypatch.setattr(report, "select_runs", lambda *args: pytest.fail("runs read before the flags were checked"))
    status, out, err = run_report(["--output-dir", str(tmp_path / "out"), flag, value], capsys)
    assert status == 2
    assert err == f"error: {flag}={value}: {allowed}\n"


@pytest.mark.parametrize("flag", ["--output-dir", "--export-episodes"])
def test_an_output_folder_that_is_a_file_is_refused_in_one_line(tmp_path, capsys, flag):
    (tmp_path / "a_file").write_text("kept")
    status, out, err = run_report(["--output-dir", str(tmp_path / "out"), flag, str(tmp_path / "a_file")], capsys)
    assert status == 2
    assert err == f"error: {flag}={tmp_path / 'a_file'}: not a folder; choose a folder you can write to\n"
    assert (tmp_path / "a_file").read_text() == "kept"


def test_a_name_too_long_for_the_file_system_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(report, "select_runs", lambda *args: pytest.fail("runs read before --name was checked"))
    most = os.pathconf(tmp_path, "PC_NAME_MAX") - len("._curves.png.xxxxxxxx.tmp")
    status, out, err = run_report(["--output-dir", str(tmp_path / "out"), "--name", "n" * (most + 1)], capsys)
    assert status == 2
    assert_one_error_line(err, f"error: --name={'n' * (most + 1)}: must be a file name stem (no /) of at most {most} bytes")
    assert not (tmp_path / "out").exists()


def test_the_longest_name_allowed_makes_its_files(tmp_path, capsys):
    write_record(tmp_path / "runs", honest_rows())
    name = "n" * (os.pathconf(tmp_path, "PC_NAME_MAX") - len("._curves.png.xxxxxxxx.tmp"))
    status, _, err = run_report(["--runs-dir", str(tmp_path / "runs"), "--output-dir", str(tmp_path), "--name", name], capsys)
    assert status == 0, err
    assert (tmp_path / f"{name}.md").exists() and (tmp_path / f"{name}_curves.png").exists()


def test_a_run_whose_record_name_would_be_too_long_stops_the_export_before_any_file(tmp_path, capsys):
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    run_dir = write_event_run(tmp_path / "runs", [1.0, 2.0], name="CartPole-v1__" + "p" * (name_max - 30) + "__1__1700000001")
    argv = [
        "--runs-dir",
        str(tmp_path / "runs"),
        "--output-dir",
        str(tmp_path / "out"),
        "--export-episodes",
        str(tmp_path / "rec"),
    ]
    status, out, err = run_report(argv, capsys)
    assert status == 2
    assert_one_error_line(err, f"error: --export-episodes={tmp_path / 'rec'}: the record of {run_dir} would have too long")
    assert list((tmp_path / "out").iterdir()) == [] and list((tmp_path / "rec").iterdir()) == []


def test_more_env_ids_than_a_figure_holds_stop_before_any_file_is_written(tmp_path, capsys):
    for index in range(report.MOST_PANELS + 1):
        write_record(tmp_path / "runs", honest_rows(2), name=f"Game{index}-v0__pqn__1__1700000001")
    argv = ["--runs-dir", str(tmp_path / "runs"), "--output-dir", str(tmp_path / "out"), "--last-episodes", "2"]
    status, out, err = run_report(argv, capsys)
    assert status == 2 and out == ""
    assert_one_error_line(err, f"error: --env-ids: {report.MOST_PANELS + 1} env ids to plot, more than the")
    assert list((tmp_path / "out").iterdir()) == []
    assert run_report([*argv, "--no-plot"], capsys)[0] == 0


def test_a_plot_that_fails_while_written_leaves_no_file_behind(tmp_path, capsys, monkeypatch):
    import matplotlib.figure

    def write_half_then_fail(figure, file, **kwargs):
        file.write(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", write_half_then_fail)
    write_record(tmp_path / "runs", honest_rows())
    argv = ["--runs-dir", str(tmp_path / "runs"), "--output-dir", str(tmp_path / "out"), "--last-episodes", "5"]
    status, out, err = run_report(argv, capsys)
    assert status == 2 and out.startswith("report.py: 1 run reported; writing ") and len(out.splitlines()) == 1  # no table
    assert_one_error_line(err, "error: cannot write a file: No space left on device")
    assert list((tmp_path / "out").iterdir()) == []  # neither the half png, its temporary file, nor the markdown


def test_a_reader_that_closes_the_pipe_is_no_error(tmp_path):
    write_record(tmp_path / "runs", honest_rows())
    command = [sys.executable, str(REPO / "benchmark" / "report.py"), "--runs-dir", str(tmp_path / "runs")]
    command += ["--output-dir", str(tmp_path / "out"), "--no-plot", "--last-episodes", "5"]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the report prints
    result = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write_end)
    assert result.returncode == 0 and result.stderr == ""
    assert "| CartPole-v1 | 10.00 (1 seed) |" in (tmp_path / "out" / "results.md").read_text()


def threshold_argv(runs: Path, *more: str) -> list[str]:
    return ["--runs-dir", str(runs), "--env-ids", "CartPole-v1", "--thresholds", "10", "--exp-names", "pqn", *more]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_threshold_table_refuses_a_threshold_that_is_not_finite(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as stop:
        threshold_table.main(["--env-ids", "CartPole-v1", f"--thresholds={value}", "--exp-names", "pqn"])
    assert stop.value.code == 2
    assert_one_error_line(capsys.readouterr().err, f"error: --thresholds={float(value)}: must be finite numbers")


def test_threshold_table_refuses_a_window_beyond_any_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        threshold_table.main(threshold_argv(tmp_path, "--last-episodes", str(10**30)))
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"error: --last-episodes={10**30}: must be between 1 and 1,000,000,000\n"


def test_threshold_table_leaves_out_damaged_runs_and_says_what_it_has_no_runs_of(tmp_path, capsys):
    damaged = write_record(tmp_path / "runs", ["train,100,nan"] * 3)
    write_record(tmp_path / "runs", honest_rows(5), name="CartPole-v1__pqn__2__1700000002")
    argv = ["--runs-dir", str(tmp_path / "runs"), "--env-ids", "CartPole-v1", "Acrobot-v1", "--thresholds", "10", "-100"]
    assert threshold_table.main([*argv, "--exp-names", "pqn", "dqn", "--last-episodes", "10"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"warning: {damaged}: left out: training episode returns hold 3 values that no game scores "
        "(NaN, infinite or beyond ±1e+15), the first nan",
        f"warning: requested exp_name dqn has no runs under {tmp_path / 'runs'}; left out",
        "warning: pqn on CartPole-v1: seeds [2] logged fewer than 10 episodes: their return is the mean of all they "
        "logged, and they reach no threshold",
        f"warning: requested env id Acrobot-v1 has no runs under {tmp_path / 'runs'}; no table",
    ]
    rows = [line for line in captured.out.splitlines() if line.startswith("| pqn |")]
    assert rows == ["| pqn | 2 | 10.0 | - | never | 1.0 |"]
    assert "Acrobot" not in captured.out and "nan" not in captured.out.split("Left out")[0]


def test_the_launcher_gives_a_damaged_run_no_final_return(tmp_path):
    launch = load_benchmark_module("launch")
    assert launch.run_final_return(write_event_run(tmp_path / "a", [1.0, 3.0])) == 2.0
    assert launch.run_final_return(write_event_run(tmp_path / "b", [1.0, float("nan")])) is None
