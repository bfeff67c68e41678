"""benchmark/sb3_baselines.py: tiny SB3 runs whose TensorBoard logs must hold the true score of every episode played,
at the agent step where it ended, in a run directory that benchmark/report.py reads. Skipped without the sb3 extra."""

from pathlib import Path

import numpy as np
import pytest
import torch
from benchmark_runs import load_benchmark_module

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")


sb3_baselines = load_benchmark_module("sb3_baselines")
report = load_benchmark_module("report")


def scalars(run_dir: str, tag: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one scalar tag, in logging order."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    accumulator = ea.EventAccumulator(run_dir, size_guidance={ea.SCALARS: 0})
    accumulator.Reload()
    events = accumulator.Scalars(tag)
    return np.array([e.step for e in events]), np.array([e.value for e in events])


def train(tmp_path, algo: str, env_id: str, steps: int) -> str:
    argv = ["--algo", algo, "--env-id", env_id, "--seed", "1", "--total-timesteps", str(steps)]
    threads = torch.get_num_threads()
    try:
        return sb3_baselines.main(sb3_baselines.parse_args([*argv, "--eval-episodes", "2", "--runs-dir", str(tmp_path)]))
    finally:
        torch.set_num_threads(threads)  # main sets one thread; later tests in this process keep their own


def test_cartpole_returns_equal_lengths_and_end_at_the_steps_played(tmp_path):
    run_dir = train(tmp_path, "dqn", "CartPole-v1", 2_000)
    steps, returns = scalars(run_dir, "charts/episodic_return")
    length_steps, lengths = scalars(run_dir, "charts/episodic_length")
    assert len(returns) >= 20  # random play: episodes of about 22 steps
    np.testing.assert_array_equal(returns, lengths)  # CartPole pays 1 per step, so a true score is the episode's length
    np.testing.assert_array_equal(steps, length_steps)
    # One environment: the k-th episode ends at the agent step that sums the lengths of the first k episodes.
    np.testing.assert_array_equal(steps, np.cumsum(lengths))
    assert 2_000 - 500 < steps[-1] <= 2_000 + 255  # SB3 collects train_freq = 256 steps at a time
    assert len(scalars(run_dir, "charts/SPS")[1]) == len(returns)
    assert len(scalars(run_dir, "eval/episodic_return")[1]) == 2

    run = report.load_runs([tmp_path])[0]
    assert (run.env_id, run.exp_name, run.seed) == ("CartPole-v1", "sb3_dqn", 1)
    np.testing.assert_array_equal(run.returns, returns)


def test_acrobot_returns_are_minus_one_per_step_but_the_last(tmp_path):
    run_dir = train(tmp_path, "qrdqn", "Acrobot-v1", 1_500)
    steps, returns = scalars(run_dir, "charts/episodic_return")
    _, lengths = scalars(run_dir, "charts/episodic_length")
    assert len(returns) >= 2  # random play mostly hits the 500-step time limit
    # -1 per step; the step that reaches the goal pays 0, a time-out at 500 steps pays -1 like any other.
    expected = np.where(lengths == 500, -500.0, -(lengths - 1.0))
    np.testing.assert_array_equal(returns, expected)
    np.testing.assert_array_equal(steps, np.cumsum(lengths))
    assert report.load_runs([tmp_path])[0].exp_name == "sb3_qrdqn"


def test_rl_zoo_budgets_are_the_default_and_bad_flags_stop_in_one_line(capsys):
    assert sb3_baselines.parse_args(["--algo", "dqn", "--env-id", "CartPole-v1"]).total_timesteps == 50_000
    assert sb3_baselines.parse_args(["--algo", "qrdqn", "--env-id", "Acrobot-v1"]).total_timesteps == 100_000
    for argv in (["--algo", "ppo"], ["--algo", "dqn", "--env-id", "Pong-v5"], ["--algo", "dqn", "--total-timesteps", "0"]):
        with pytest.raises(SystemExit) as stop:
            sb3_baselines.parse_args(argv)
        assert stop.value.code == 2
    assert "--total-timesteps=0: must be > 0" in capsys.readouterr().err


@pytest.mark.parametrize("algo", ["dqn", "qrdqn"])
def test_minatar_runs_use_the_scripts_torso_and_log_like_them(algo, tmp_path):
    pytest.importorskip("minatar")
    run_dir = train(tmp_path, algo, "MinAtar/Breakout-v0", 6_000)  # learning from step 5,000, as Young & Tian
    assert Path(run_dir).name.startswith("MinAtar-Breakout-v0__sb3_")
    steps, returns = scalars(run_dir, "charts/episodic_return")
    assert len(returns) >= 20 and np.all(returns >= 0)  # a brick pays 1; random play scores about 0.5 a game
    run = report.load_runs([tmp_path])[0]
    assert (run.env_id, run.exp_name) == ("MinAtar/Breakout-v0", f"sb3_{algo}")
    kwargs = sb3_baselines.HYPERPARAMS[(algo, "MinAtar/Breakout-v0")]["policy_kwargs"]
    assert kwargs["features_extractor_class"] is sb3_baselines.MinAtarTorso and kwargs["net_arch"] == [128]
