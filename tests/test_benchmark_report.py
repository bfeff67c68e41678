"""Tests of benchmark/report.py and benchmark/launch.py: on synthetic TensorBoard logs with known values (the
arithmetic), and on the run folders and console output of real short runs of cleanrl/pqn.py (what the tools read)."""

import gzip
import subprocess
import sys
import time
from pathlib import Path

import benchmark_runs
import numpy as np
import pytest
from benchmark_runs import SHORT_PQN, finished_return, load_benchmark_module, script_env
from torch.utils.tensorboard import SummaryWriter

REPO = Path(__file__).resolve().parents[1]


pqn_sweep = benchmark_runs.pqn_sweep  # the fixture, made once per test session
report = load_benchmark_module("report")
run_reading = load_benchmark_module("run_reading")
launch = load_benchmark_module("launch")


def write_run(runs_dir, env_id, exp_name, seed, returns, runtime_s, steps=None, eval_returns=()):
    """Logs `returns` as training episodes finishing at `steps`, the last one `runtime_s` after the writer opened."""
    run_dir = runs_dir / f"{env_id}__{exp_name}__{seed}__{1700000000 + seed}"
    steps = np.arange(1, len(returns) + 1) * 100 if steps is None else steps
    start = time.time()
    writer = SummaryWriter(str(run_dir))
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n|seed|%d|" % seed)
    for i, (step, value) in enumerate(zip(steps, returns)):
        wall_time = start + runtime_s * (i + 1) / len(returns)
        writer.add_scalar("charts/episodic_return", value, int(step), walltime=wall_time)
        writer.add_scalar("losses/td_loss", 0.5, int(step), walltime=wall_time - 1e-3)
    # evaluation episodes logged after training with small step numbers must not erase the training curve
    for i, value in enumerate(eval_returns):
        writer.add_scalar("eval/episodic_return", value, i, walltime=start + runtime_s - 1.0)
    writer.close()
    return run_dir


def cartpole_returns(seed):
    """50 early episodes at 0, then 100 episodes of 100*seed + (0..9 repeated): last-100 mean = 100*seed + 4.5."""
    return [0.0] * 50 + [100.0 * seed + (i % 10) for i in range(100)]


def atari_returns(final_score):
    """20 early episodes far below, then 100 episodes alternating final_score -+ 2: last-100 mean = final_score."""
    return [-1000.0] * 20 + [final_score + (2.0 if i % 2 else -2.0) for i in range(100)]


# Human-normalized scores chosen per (game, seed); scores are built from the table's random/human numbers.
ATARI_HNS = {"Breakout-v5": (1.0, 2.0), "Pong-v5": (0.0, 1.0), "MsPacman-v5": (0.5, 3.0)}
RANDOM_HUMAN = {"Breakout-v5": (1.7, 30.5), "Pong-v5": (-20.7, 14.6), "MsPacman-v5": (307.3, 6951.6)}


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    runs = tmp_path_factory.mktemp("logs") / "runs"
    for seed in (1, 2, 3):
        write_run(runs, "CartPole-v1", "pqn", seed, cartpole_returns(seed), runtime_s=60.0 * seed, eval_returns=[7.0] * 3)
    for env_id, hns in ATARI_HNS.items():
        random_score, human_score = RANDOM_HUMAN[env_id]
        for seed, target in zip((1, 2), hns):
            score = random_score + target * (human_score - random_score)
            write_run(runs, env_id, "pqn_atari_envpool", seed, atari_returns(score), runtime_s=120.0)
    (runs / "not_a_run_name").mkdir()  # ignored: not named like a run
    return runs


def test_parse_run_name():
    assert run_reading.parse_run_name("Breakout-v5__pqn_atari_envpool_lstm__3__1700000123") == {
        "env_id": "Breakout-v5",
        "exp_name": "pqn_atari_envpool_lstm",
        "seed": 3,
        "timestamp": 1700000123,
        "suffix": 1,
    }
    assert run_reading.parse_run_name("CartPole-v1__pqn__2__1700000123_3")["suffix"] == 3
    assert run_reading.parse_run_name("CartPole-v1__pqn__1") is None
    assert run_reading.parse_run_name("wandb") is None


def test_read_run_keeps_every_episode_in_order(runs_dir):
    (path,) = [p for p in run_reading.find_run_dirs([runs_dir]) if p.name.startswith("CartPole-v1__pqn__2__")]
    run = run_reading.read_run(path)
    assert (run.env_id, run.exp_name, run.seed) == ("CartPole-v1", "pqn", 2)
    np.testing.assert_array_equal(run.returns, cartpole_returns(2))
    np.testing.assert_array_equal(run.steps, np.arange(1, 151) * 100)
    assert run.runtime_s == pytest.approx(120.0, abs=1.0)
    np.testing.assert_array_equal(run.eval_returns, [7.0] * 3)  # the evaluation logged after training, kept apart


def test_a_run_resumed_after_a_crash_counts_each_episode_once(tmp_path):
    """A run killed after its checkpoint at step 500 had logged episodes up to step 800; resumed, it logs from step 501
    again (the scripts' writer purges from there). Those orphaned episodes must not be counted twice, neither by the
    report nor by the launcher's final return, which must be the report's."""
    run_dir = tmp_path / "runs" / "CartPole-v1__pqn__1__1700000001"
    killed = SummaryWriter(str(run_dir))
    for step in range(100, 900, 100):
        killed.add_scalar("charts/episodic_return", -1.0, step)  # the orphans: steps 600-800
    killed.close()
    time.sleep(1.1)  # event files are read in name order, which starts with the second their writer opened
    resumed = SummaryWriter(str(run_dir), purge_step=501)
    for step in range(600, 1600, 100):
        resumed.add_scalar("charts/episodic_return", float(step), step)
    resumed.close()
    run = run_reading.read_run(run_dir)
    np.testing.assert_array_equal(run.steps, np.arange(100, 1600, 100))
    np.testing.assert_array_equal(run.returns, [-1.0] * 5 + [float(step) for step in range(600, 1600, 100)])
    assert run_reading.final_score(run.returns, 100) == pytest.approx((-5 + sum(range(600, 1600, 100))) / 15)
    assert launch.final_return(str(tmp_path)) == run_reading.final_score(run.returns, 100)


def test_final_performance_table(runs_dir):
    runs = run_reading.load_runs([runs_dir])
    assert len(runs) == 3 + 6
    groups = report.group_runs(runs, last_episodes=100)
    cartpole = groups[("pqn", "CartPole-v1")]
    assert cartpole.seeds == [1, 2, 3]
    # per seed: 100*seed + 4.5; over seeds: mean 204.5, population std sqrt((100^2 + 0 + 100^2) / 3) = 81.6497
    np.testing.assert_allclose(cartpole.final_scores, [104.5, 204.5, 304.5])
    assert cartpole.mean == pytest.approx(204.5)
    assert cartpole.std == pytest.approx(81.64965809)
    np.testing.assert_allclose(cartpole.runtimes_min, [1.0, 2.0, 3.0], atol=0.02)
    np.testing.assert_array_equal(cartpole.final_steps, [15000, 15000, 15000])

    markdown = report.performance_markdown(groups, ["pqn", "pqn_atari_envpool"], ["CartPole-v1", "Pong-v5"])
    assert "| CartPole-v1 | 204.50 ± 81.65 | - |" in markdown
    assert "| CartPole-v1 | 2.0 | - |" in markdown  # runtime, minutes
    assert "| CartPole-v1 | 3 (1, 2, 3); 15,000 | - |" in markdown
    # Pong: seeds at hns 0 and 1 are the random (-20.7) and human (14.6) scores: mean -3.05, std 17.65
    assert "| Pong-v5 | - | -3.05 ± 17.65 |" in markdown


def test_a_cell_of_one_seed_says_so_and_seeds_that_agree_keep_their_zero_spread():
    """One seed has no spread: its cell reads `X (1 seed)`, never `X ± 0.00`, which would read as seeds that agree;
    two seeds with equal scores keep `± 0.00`. The rule is the number of seeds, in every table with a spread."""

    def group(env_id, scores, eval_means):
        seeds = list(range(1, len(scores) + 1))
        ones = np.ones(len(seeds))
        return report.Group("pqn", env_id, seeds, np.array(scores), ones, 1000 * ones, np.array(eval_means))

    groups = {
        ("pqn", "CartPole-v1"): group("CartPole-v1", [52.46], [34.2]),
        ("pqn", "Acrobot-v1"): group("Acrobot-v1", [500.0, 500.0], [7.0, 7.0]),
        ("pqn", "MountainCar-v0"): group("MountainCar-v0", [-150.0, -130.0, -110.0], [np.nan, -120.0, np.nan]),
    }
    markdown = report.performance_markdown(groups, ["pqn"], ["CartPole-v1", "Acrobot-v1", "MountainCar-v0"])
    returns, rest = markdown.split("Evaluation after training")
    evaluation = rest.split("Wall-clock")[0]
    assert "| CartPole-v1 | 52.46 (1 seed) |" in returns and "| Acrobot-v1 | 500.00 ± 0.00 |" in returns
    assert "| MountainCar-v0 | -130.00 ± 16.33 |" in returns
    assert "| CartPole-v1 | 34.20 (1 seed) |" in evaluation and "| Acrobot-v1 | 7.00 ± 0.00 |" in evaluation
    assert "| MountainCar-v0 | -120.00 (1 of 3 seeds) |" in evaluation  # one evaluated seed of three: no spread either

    matrices = {"one": (["Breakout-v5"], np.array([[1.25]])), "two": (["Breakout-v5"], np.array([[0.5], [0.5]]))}
    aggregates = {name: {"median": (1.0, 0.0, 2.0), "iqm": (1.0, 0.0, 2.0)} for name in matrices}
    assert "| Breakout-v5 | 1.250 (1 seed) | 0.500 ± 0.000 |" in report.atari_markdown(matrices, aggregates)


def test_an_episode_record_reads_back_as_the_run_it_was_written_from(runs_dir, tmp_path):
    """The record of a run (what the repository keeps of a benchmark run) holds every field the report uses, bitwise,
    and is the same bytes when written twice."""
    (path,) = [p for p in run_reading.find_run_dirs([runs_dir]) if p.name.startswith("CartPole-v1__pqn__2__")]
    run = run_reading.read_run(path)
    run.returns[3] = 0.1 + 1e-9  # a value with no short decimal form; the written ones are float32
    run.total_timesteps = 15000
    record = report.write_episodes(run, tmp_path / "records")
    assert record.name == path.name + ".episodes.csv.gz"
    again = run_reading.read_run(record)
    assert (again.env_id, again.exp_name, again.seed, again.path) == ("CartPole-v1", "pqn", 2, record)
    for field in ("steps", "returns", "eval_returns"):
        np.testing.assert_array_equal(getattr(again, field), getattr(run, field))
        assert getattr(again, field).dtype == getattr(run, field).dtype
    assert (again.runtime_s, again.total_timesteps) == (run.runtime_s, 15000)
    first = record.read_bytes()
    assert report.write_episodes(again, tmp_path / "records").read_bytes() == first
    not_a_record = tmp_path / "other" / record.name
    not_a_record.parent.mkdir()
    not_a_record.write_bytes(gzip.compress(b"step,return\n1,2\n"))
    with pytest.raises(ValueError, match="not an episode record"):
        run_reading.read_run(not_a_record)
    (tmp_path / "other" / "CartPole-v1__pqn__3__1.episodes.csv.gz").write_bytes(b"not gzip")
    runs, left_out = run_reading.select_runs([tmp_path / "other"])
    assert runs == [] and [reason.split(" (")[0] for _, reason in left_out] == ["not an episode record"] * 2


def test_a_report_from_episode_records_is_the_report_from_the_run_folders(runs_dir, tmp_path):
    """--export-episodes writes the records of the reported runs; reported from the records alone, the tables are the
    same, and a record beside its own run folder is not counted twice."""
    from_folders, from_records = tmp_path / "a", tmp_path / "b"
    common = ["--exp-names", "pqn", "--no-plot"]
    argv = ["--runs-dir", str(runs_dir), "--output-dir", str(from_folders), "--export-episodes", str(tmp_path / "rec")]
    assert report.main(argv + common) == 0
    assert len(list((tmp_path / "rec").glob("*.episodes.csv.gz"))) == 3
    assert report.main(["--runs-dir", str(tmp_path / "rec"), "--output-dir", str(from_records)] + common) == 0
    tables = (from_folders / "results.md").read_text().split("Episode records")[0].strip()
    assert tables == (from_records / "results.md").read_text().strip()
    assert "| CartPole-v1 | 204.50 ± 81.65 |" in tables
    both = run_reading.find_run_dirs([runs_dir, tmp_path / "rec"])
    assert not any(path.name.endswith(".episodes.csv.gz") for path in both)


def test_atari_game_names_match_the_score_table():
    table = report.load_human_random_scores()
    assert len(table) == 57
    assert table["breakout"] == (1.7, 30.5)
    for env_id, game in [
        ("MsPacman-v5", "ms_pacman"),
        ("SpaceInvaders-v5", "space_invaders"),
        ("BeamRider-v5", "beam_rider"),
        ("Pong-v5", "pong"),
        ("Breakout-v5", "breakout"),
        ("UpNDown-v5", "up_n_down"),
        ("KungFuMaster-v5", "kung_fu_master"),
        ("MontezumaRevenge-v5", "montezuma_revenge"),
    ]:
        assert report.atari_game_name(env_id) == game
        assert game in table
    assert report.atari_game_name("CartPole-v1") not in table
    # MinAtar's Breakout is not Atari's: its scores are not normalized by Atari's human and random ones.
    assert all(report.atari_game_name(f"MinAtar/{game}-v0") not in table for game in ("Breakout", "SpaceInvaders"))


def test_human_normalized_scores_and_aggregates(runs_dir):
    groups = report.group_runs(run_reading.load_runs([runs_dir]), last_episodes=100)
    env_ids = ["CartPole-v1", "Breakout-v5", "Pong-v5", "MsPacman-v5"]
    matrices = report.human_normalized_matrices(
        groups, ["pqn", "pqn_atari_envpool"], env_ids, report.load_human_random_scores()
    )
    assert list(matrices) == ["pqn_atari_envpool"]  # CartPole is not an Atari game
    games, matrix = matrices["pqn_atari_envpool"]
    assert games == ["Breakout-v5", "Pong-v5", "MsPacman-v5"]
    # rows = seeds 1, 2; columns = games; e.g. Breakout seed 2 scored 1.7 + 2 * (30.5 - 1.7) = 59.3 -> 2.0
    np.testing.assert_allclose(matrix, [[1.0, 0.0, 0.5], [2.0, 1.0, 3.0]], atol=1e-5)

    aggregates = report.aggregate_with_confidence(matrices, reps=2000, seed=0)["pqn_atari_envpool"]
    # median over games of the per-game means (1.5, 0.5, 1.75) = 1.5
    # IQM of the 6 scores: sorted 0, 0.5, 1, 1, 2, 3; drop one at each end; mean(0.5, 1, 1, 2) = 1.125
    median, median_low, median_high = aggregates["median"]
    iqm, iqm_low, iqm_high = aggregates["iqm"]
    assert median == pytest.approx(1.5, abs=1e-5)
    assert iqm == pytest.approx(1.125, abs=1e-5)
    # resampling 2 runs per game: the median of game means lies in [0, 2.5] (Pong at most 1 ... MsPacman at most 3)
    assert 0.0 <= median_low < median < median_high <= 3.0
    assert 0.0 <= iqm_low < iqm < iqm_high <= 3.0

    markdown = report.atari_markdown(matrices, {"pqn_atari_envpool": aggregates})
    assert "| Breakout-v5 | 1.500 ± 0.500 |" in markdown
    assert "| MsPacman-v5 | 1.750 ± 1.250 |" in markdown
    assert "| **Median** (95% CI) | **1.500** [" in markdown
    assert "| **IQM** (95% CI) | **1.125** [" in markdown


def test_smoothed_curve_keeps_last_episode_per_step():
    run = run_reading.Run("E", "x", 1, Path("."), np.array([10, 10, 20, 40]), np.array([1.0, 3.0, 5.0, 7.0]), 0.0)
    steps, values = report.smoothed_curve(run, window=2)
    # trailing 2-episode means: 1, 2, 4, 6; at step 10 the later episode (mean 2) counts
    np.testing.assert_array_equal(steps, [10, 20, 40])
    np.testing.assert_allclose(values, [2.0, 4.0, 6.0])


def test_learning_curve_on_common_grid():
    a = run_reading.Run("E", "x", 1, Path("."), np.array([0, 10, 20]), np.array([0.0, 10.0, 20.0]), 0.0)
    b = run_reading.Run("E", "x", 2, Path("."), np.array([5, 15, 25]), np.array([30.0, 30.0, 30.0]), 0.0)
    grid, mean, std = report.learning_curve([a, b], num_points=3, window=1)
    # grid spans only what both runs cover: 5 .. 20; run a is linear (value = step), run b constant 30
    np.testing.assert_allclose(grid, [5.0, 12.5, 20.0])
    np.testing.assert_allclose(mean, [17.5, 21.25, 25.0])
    np.testing.assert_allclose(std, [12.5, 8.75, 5.0])


def test_report_cli_writes_markdown_and_plot(runs_dir, tmp_path):
    out = tmp_path / "results"
    argv = ["--runs-dir", str(runs_dir), "--output-dir", str(out), "--name", "pqn", "--bootstrap-reps", "500"]
    assert report.main(argv) == 0
    markdown = (out / "pqn.md").read_text()
    assert "| CartPole-v1 | 204.50 ± 81.65 | - |" in markdown
    # The evaluation after training: every CartPole seed played 3 episodes of 7; the Atari runs played none.
    assert "Evaluation after training" in markdown and "| CartPole-v1 | 7.00 ± 0.00 | - |" in markdown
    assert "| Breakout-v5 | - | - |" in markdown.split("Evaluation after training")[1].split("Wall-clock")[0]
    assert "**IQM** (95% CI)" in markdown
    png = (out / "pqn_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert report.main(["--runs-dir", str(tmp_path / "empty"), "--output-dir", str(out)]) == 1


def test_names_of_runs_started_in_the_same_second_are_read(tmp_path, monkeypatch):
    """run_folder.new_run_name gives the second run of a name in one second the suffix _2, the third _3."""
    from types import SimpleNamespace

    from cleanrl_q_utils import run_folder

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "time", lambda: 1700000000.5)
    args = SimpleNamespace(env_id="CartPole-v1", exp_name="pqn", seed=4)
    names = [run_folder.new_run_name(args) for _ in range(3)]
    assert names[1:] == [names[0] + "_2", names[0] + "_3"]
    assert [run_reading.parse_run_name(name)["suffix"] for name in names] == [1, 2, 3]
    assert {run_reading.parse_run_name(name)["seed"] for name in names} == {4}


def test_report_of_a_real_sweep_counts_suffixed_runs_and_names_what_it_leaves_out(pqn_sweep, tmp_path, capsys):
    runs_dir, finished, folders, left_out = pqn_sweep
    out = tmp_path / "results"
    argv = ["--runs-dir", str(runs_dir), "--output-dir", str(out), "--name", "sweep", "--no-plot"]
    argv += ["--exp-names", "pqn", "--env-ids", "CartPole-v1", "--seeds", "1", "2", "3", "--total-timesteps", "8192"]
    assert report.main(argv) == 0
    captured = capsys.readouterr()
    markdown = (out / "sweep.md").read_text()
    console = captured.out.splitlines()
    assert console[0] == f"report.py: 2 runs reported; writing {out / 'sweep.md'}"  # where, before anything else
    assert markdown.split("Left out")[0].strip() in captured.out  # the tables, as written
    # seeds 1 and 2 (its folder suffixed _2); each run's final score is the return(100) the script printed at its end
    runs, _ = run_reading.select_runs([runs_dir], ["pqn"], ["CartPole-v1"], [1, 2, 3], 8192)
    assert sorted(run.path for run in runs) == sorted([folders["newer"], folders["suffixed"]])
    scores = {run.seed: run_reading.final_score(run.returns, 100) for run in runs}
    assert scores == pytest.approx(finished, abs=0.006)
    mean, std = np.mean(list(finished.values())), np.std(list(finished.values()))
    row = next(line for line in markdown.splitlines() if line.startswith("| CartPole-v1 | ") and "±" in line)
    cell_mean, cell_std = (float(x) for x in row.split("|")[2].split("±"))
    assert cell_mean == pytest.approx(mean, abs=0.011) and cell_std == pytest.approx(std, abs=0.011)
    assert "| CartPole-v1 | 2 (1, 2); 8," in markdown
    # every other run found is named with why in the written report; stdout and stderr only count them, in one line each
    assert "Left out: 3 runs found under --runs-dir but not of this report." in markdown
    for path, why in left_out.items():
        assert f"- `{path}`: {why}" in markdown and str(path) not in captured.out
    assert [line for line in console if "left out" in line.lower()] == [
        f"Left out: 3 runs found under --runs-dir but not of this report, listed in `{out / 'sweep.md'}`"
    ]
    assert "warning: 3 runs found under --runs-dir left out (not of this sweep): listed in the report" in captured.err


def test_report_without_filters_reports_every_newest_run(pqn_sweep, tmp_path, capsys):
    runs_dir, _, _, left_out = pqn_sweep
    runs, left = run_reading.select_runs([runs_dir])
    assert sorted((run.exp_name, run.seed) for run in runs) == [("pqn", 1), ("pqn", 2), ("pqn", 3), ("pqn_lr_sweep", 1)]
    (older,) = [path for path, why in left_out.items() if why.startswith("an earlier run")]
    assert [path for path, _ in left] == [older]


@pytest.mark.parametrize("value", ["0", "-5"])
def test_report_refuses_a_non_positive_last_episodes(value, tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmark" / "report.py"), "--last-episodes", value, "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == f"error: --last-episodes={value}: must be between 1 and 1,000,000,000\n"


def test_report_into_a_read_only_folder_is_one_line(pqn_sweep):
    runs_dir = pqn_sweep[0]
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmark" / "report.py"), "--runs-dir", str(runs_dir), "--output-dir", "/sys/x"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: --output-dir=/sys/x: cannot write there (")


def warning_lines(capsys) -> list[str]:
    """The report's stderr, which must be whole `warning:` lines."""
    lines = capsys.readouterr().err.splitlines()
    assert all(line.startswith("warning: ") for line in lines), lines
    return lines


def run_of(seed, steps, returns=None, exp_name="x", env_id="E"):
    steps = np.asarray(steps)
    returns = np.arange(len(steps), dtype=np.float64) if returns is None else np.asarray(returns, dtype=np.float64)
    return run_reading.Run(env_id, exp_name, seed, Path("."), steps, returns, 0.0)


def test_report_warns_about_requested_ids_without_runs(runs_dir, tmp_path, capsys):
    argv = ["--runs-dir", str(runs_dir), "--output-dir", str(tmp_path), "--no-plot"]
    argv += ["--env-ids", "CartPole-v1", "Hopper-v4", "--exp-names", "pqn", "dqn"]
    assert report.main(argv) == 0
    lines = warning_lines(capsys)
    assert len(lines) == 3
    # the 6 Atari runs are of another exp_name and other env ids
    assert lines[0] == "warning: 6 runs found under --runs-dir left out (not of this sweep): listed in the report"
    assert lines[1] == f"warning: requested exp_name dqn has no runs under {runs_dir}; left out"
    assert lines[2] == f"warning: requested env id Hopper-v4 has no runs under {runs_dir}; left out"
    markdown = (tmp_path / "results.md").read_text()
    assert "| Environment | pqn |" in markdown and "dqn" not in markdown and "Hopper" not in markdown
    assert markdown.count("exp_name pqn_atari_envpool not asked for") == 6


def test_warns_about_runs_of_mixed_lengths(capsys):
    # last episodes a little apart (15,000 and 14,200): runs of one length, no warning
    report.group_runs([run_of(1, np.arange(1, 151) * 100), run_of(2, np.arange(1, 143) * 100)], last_episodes=10)
    assert warning_lines(capsys) == []
    # seed 2 stopped at 6,000 of 15,000 steps
    runs = [run_of(1, np.arange(1, 151) * 100), run_of(2, np.arange(1, 61) * 100), run_of(3, np.arange(1, 151) * 100)]
    report.group_runs(runs, last_episodes=10)
    (line,) = warning_lines(capsys)
    assert line.startswith("warning: x on E: runs of different lengths (last episode at 6,000 to 15,000 env steps; ")
    assert "seeds [2] end early" in line


def test_curves_that_cannot_be_drawn_are_named_and_left_out(tmp_path, capsys, monkeypatch):
    one_step = run_of(1, [500, 500, 500], exp_name="same_step")  # every episode ended at one env step
    early = run_of(1, [100, 200, 300], exp_name="apart")
    late = run_of(2, [400, 500, 600], exp_name="apart")  # shares no steps with seed 1
    with pytest.raises(ValueError, match="seeds \\[1\\] logged episodes at fewer than 2 distinct env steps"):
        report.learning_curve([one_step])
    with pytest.raises(ValueError, match="share no range of env steps"):
        report.learning_curve([early, late])

    good = run_of(1, np.arange(1, 51) * 100, exp_name="good")
    figures = capture_figures(monkeypatch)
    path = tmp_path / "curves.png"
    report.plot_learning_curves([one_step, early, late, good], ["same_step", "apart", "good"], ["E"], path)
    assert warning_lines(capsys) == [
        "warning: same_step on E: no curve drawn: seeds [1] logged episodes at fewer than 2 distinct env steps",
        "warning: apart on E: no curve drawn: the runs share no range of env steps "
        "(the latest first episode ends at 400, the earliest last at 300)",
    ]
    assert path.exists()
    (ax,) = figures[0].axes
    assert [text.get_text() for text in ax.get_legend().get_texts()] == ["good (1 seed)"]


def capture_figures(monkeypatch) -> list:
    """Keeps every figure that is saved, to read its labels."""
    import matplotlib.figure

    figures, savefig = [], matplotlib.figure.Figure.savefig

    def keep(figure, *args, **kwargs):
        figures.append(figure)
        return savefig(figure, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return figures


def test_figure_labels_seeds_band_and_atari_steps(tmp_path, monkeypatch):
    runs = [run_of(seed, np.arange(1, 51) * 100, exp_name="a", env_id="CartPole-v1") for seed in (1, 2)]
    runs += [run_of(1, np.arange(1, 51) * 1000, exp_name="a", env_id="Breakout-v5")]
    figures = capture_figures(monkeypatch)
    report.plot_learning_curves(runs, ["a"], ["CartPole-v1", "Breakout-v5"], tmp_path / "c.png", window=5)
    cartpole, breakout = figures[0].axes[:2]
    assert [text.get_text() for text in cartpole.get_legend().get_texts()] == ["a (2 seeds)"]
    assert [text.get_text() for text in breakout.get_legend().get_texts()] == ["a (1 seed)"]
    assert cartpole.get_xlabel() == "env steps"
    assert breakout.get_xlabel() == "agent steps (not frames)"
    caption = figures[0].get_suptitle()
    assert "mean over seeds of each run's trailing 5-episode mean return" in caption
    assert "band: ± 1 standard deviation over seeds" in caption


# The launched "training script": records the arguments it got in a file named after them.
RECORD_ARGS = (
    "import pathlib, sys; out = pathlib.Path(sys.argv[1]); "
    "out.joinpath('_'.join(sys.argv[2:])).write_text('ran'); "
    "sys.exit(3 if sys.argv[-1] == '2' and 'Acrobot' in sys.argv[-3] else 0)"
)


def run_launcher(*args):
    return subprocess.run(
        [sys.executable, str(REPO / "benchmark" / "launch.py"), *args], capture_output=True, text=True, timeout=60
    )


def test_launcher_appends_env_id_and_seed(tmp_path):
    result = run_launcher(
        "--env-ids", "CartPole-v1", "MountainCar-v0", "--seeds", "1", "2", "--workers", "2",
        "--", sys.executable, "-c", RECORD_ARGS, str(tmp_path), "--no-track",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "--no-track_--env-id_CartPole-v1_--seed_1",
        "--no-track_--env-id_CartPole-v1_--seed_2",
        "--no-track_--env-id_MountainCar-v0_--seed_1",
        "--no-track_--env-id_MountainCar-v0_--seed_2",
    ]
    assert "4/4 runs succeeded" in result.stdout


def test_launcher_exit_code_when_a_run_fails(tmp_path):
    result = run_launcher(
        "--env-ids", "CartPole-v1", "Acrobot-v1", "--seeds", "1", "2", "--workers", "1",
        "--", sys.executable, "-c", RECORD_ARGS, str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 1
    assert len(list(tmp_path.iterdir())) == 4  # a failed run does not stop the others
    assert "FAILED (exit 3)" in result.stdout and "3/4 runs succeeded, 1 failed" in result.stdout


def test_launcher_requires_a_command():
    result = run_launcher("--env-ids", "CartPole-v1", "--seeds", "1")
    assert result.returncode != 0 and "--" in result.stderr
    assert launch.make_jobs(["A"], [4], ["python", "x.py"])[0].command == ["python", "x.py", "--env-id", "A", "--seed", "4"]


def summary_rows(stdout: str) -> dict[str, list[str]]:
    """`label -> [status, tries, wall time, final return, run folder]` of the launcher's summary, plus its `why:` line."""
    lines = stdout[stdout.index("\nSummary\n") :].splitlines()[3:]
    rows, label = {}, None
    for line in lines:
        if line.startswith("      why: "):
            rows[label].append(line.removeprefix("      why: "))
        elif line.startswith("  "):
            label, rest = line[2:38].strip(), line[39:]
            tries, minutes, _, score, folder = rest[24:].split()
            rows[label] = [rest[:24].strip(), tries, minutes, score, folder]
    return rows


def test_launcher_summary_of_real_runs_in_the_working_directory(tmp_path):
    """Without --output-dir the runs write runs/ in the launcher's directory: the summary still finds each run's folder
    and final return (the script's own closing return(100)), and says in one line why a run failed."""
    command = [sys.executable, str(REPO / "cleanrl" / "pqn.py"), "--no-track", *SHORT_PQN]
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmark" / "launch.py"), "--env-ids", "CartPole-v1", "NoSuchEnv-v0", "--seeds", "1",
         "--workers", "2", "--", *command],
        cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    rows = summary_rows(result.stdout)
    ok, failed = rows["CartPole-v1 seed 1"], rows["NoSuchEnv-v0 seed 1"]
    finished = finished_return(
        "\n".join(line.split("] ", 1)[1] for line in result.stdout.splitlines() if "finished step" in line)
    )
    assert ok[0] == "ok" and float(ok[3]) == pytest.approx(finished, abs=0.006)
    (folder,) = (tmp_path / "runs").iterdir()
    assert ok[4] == f"runs/{folder.name}"
    assert failed[:1] + failed[3:5] == ["FAILED (exit 1)", "-", "-"]
    assert failed[5].startswith("error: --env-id=NoSuchEnv-v0: ")  # the script's own one-line error


def test_launcher_summary_with_an_output_dir(tmp_path):
    command = [sys.executable, str(REPO / "cleanrl" / "pqn.py"), "--no-track", *SHORT_PQN]
    launch_command = [sys.executable, str(REPO / "benchmark" / "launch.py"), "--env-ids", "CartPole-v1", "--seeds", "2"]
    result = subprocess.run(
        [*launch_command, "--output-dir", "out", "--", *command],
        cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    ok = summary_rows(result.stdout)["CartPole-v1 seed 2"]
    (folder,) = (tmp_path / "out" / "pqn" / "CartPole-v1__2" / "runs").iterdir()
    assert ok[4] == str(folder.relative_to(tmp_path))
    assert float(ok[3]) == pytest.approx(run_reading.final_score(run_reading.read_run(folder).returns, 100))


def test_launcher_says_why_a_run_failed(tmp_path):
    crash = (
        "import os, sys; e = sys.argv[-3]; "
        "exec('raise ValueError(\"boom\")') if e == 'A' else os.kill(os.getpid(), 9) if e == 'B' else sys.exit(4)"
    )
    result = run_launcher("--env-ids", "A", "B", "C", "--seeds", "1", "--", sys.executable, "-c", crash)
    assert result.returncode == 1
    rows = summary_rows(result.stdout)
    assert [rows[label][0] for label in ("A seed 1", "B seed 1", "C seed 1")] == ["FAILED (exit 1)", "FAILED (exit -9)",
                                                                                 "FAILED (exit 4)"]  # fmt: skip
    assert rows["A seed 1"][5] == "ValueError: boom"
    assert rows["B seed 1"][5] == "killed by signal SIGKILL"
    assert rows["C seed 1"][5] == "exit status 4, no error line in its output"
