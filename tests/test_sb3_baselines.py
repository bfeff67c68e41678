"""benchmark/sb3_baselines.py: tiny SB3 runs whose TensorBoard logs must hold the true score of every episode played,
at the agent step where it ended, in a run directory that benchmark/report.py reads. Skipped without the sb3 extra."""

import os
import shlex
import signal
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from benchmark_runs import load_benchmark_module

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")


sb3_baselines = load_benchmark_module("sb3_baselines")
run_reading = load_benchmark_module("run_reading")


def scalars(run_dir: str, tag: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one scalar tag, in logging order."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    accumulator = ea.EventAccumulator(run_dir, size_guidance={ea.SCALARS: 0})
    accumulator.Reload()
    events = accumulator.Scalars(tag)
    return np.array([e.step for e in events]), np.array([e.value for e in events])


def train(tmp_path, algo: str, env_id: str, steps: int, *flags: str) -> str:
    argv = ["--algo", algo, "--env-id", env_id, "--seed", "1", "--total-timesteps", str(steps), *flags]
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

    run = run_reading.load_runs([tmp_path])[0]
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
    assert run_reading.load_runs([tmp_path])[0].exp_name == "sb3_qrdqn"


def test_rl_zoo_budgets_are_the_default_and_bad_flags_stop_in_one_line(tmp_path, monkeypatch):
    assert sb3_baselines.parse_args(["--algo", "dqn", "--env-id", "CartPole-v1"]).total_timesteps == 50_000
    assert sb3_baselines.parse_args(["--algo", "qrdqn", "--env-id", "Acrobot-v1"]).total_timesteps == 100_000
    for argv in (["--algo", "ppo"], ["--algo", "dqn", "--env-id", "Pong-v5"]):  # argparse's own: usage and status 2
        with pytest.raises(SystemExit) as stop:
            sb3_baselines.parse_args(argv)
        assert stop.value.code == 2
    (tmp_path / "a-file").touch()
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    for flags, message in [
        (["--total-timesteps", "0"], "error: --total-timesteps=0: must be a whole number >= 1"),
        (["--seed", "-1"], "error: --seed=-1: must be in [0, 2147418112)"),
        (["--eval-episodes", "-1"], "error: --eval-episodes=-1: must be >= 0"),
        (["--runs-dir", str(tmp_path / "a-file")], f"error: --runs-dir={tmp_path / 'a-file'}: not a folder"),
        (["--track"], "error: --track: no Weights & Biases login found"),
        (["--resume", str(tmp_path)], f"error: --resume={tmp_path}: not a file"),
    ]:
        with pytest.raises(SystemExit) as stop:
            sb3_baselines.parse_args(["--algo", "dqn", *flags])
        assert str(stop.value.code).startswith(message) and "\n" not in str(stop.value.code), stop.value.code


@pytest.mark.parametrize("algo", ["dqn", "qrdqn"])
def test_minatar_runs_use_the_scripts_torso_and_log_like_them(algo, tmp_path):
    pytest.importorskip("minatar")
    run_dir = train(tmp_path, algo, "MinAtar/Breakout-v0", 6_000)  # learning from step 5,000, as Young & Tian
    assert Path(run_dir).name.startswith("MinAtar-Breakout-v0__sb3_")
    steps, returns = scalars(run_dir, "charts/episodic_return")
    assert len(returns) >= 20 and np.all(returns >= 0)  # a brick pays 1; random play scores about 0.5 a game
    run = run_reading.load_runs([tmp_path])[0]
    assert (run.env_id, run.exp_name) == ("MinAtar/Breakout-v0", f"sb3_{algo}")
    kwargs = sb3_baselines.HYPERPARAMS[(algo, "MinAtar/Breakout-v0")]["policy_kwargs"]
    assert kwargs["features_extractor_class"] is sb3_baselines.MinAtarTorso and kwargs["net_arch"] == [128]


class StopAt(gym.Wrapper):
    """Sends the process a SIGINT at a given step of the game, as Ctrl-C would."""

    def __init__(self, env, stop_step: int):
        super().__init__(env)
        self.steps, self.stop_step = 0, stop_step

    def step(self, action):
        self.steps += 1
        if self.steps == self.stop_step:
            os.kill(os.getpid(), signal.SIGINT)
        return self.env.step(action)


@pytest.mark.parametrize("algo", ["dqn", "qrdqn"])
def test_a_stopped_run_resumes_from_its_checkpoint_as_if_it_had_not_stopped(algo, tmp_path, monkeypatch, capsys):
    made = []

    class RecordedModel(sb3_baselines.ALGOS[algo]):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setitem(sb3_baselines.ALGOS, algo, RecordedModel)
    make_env = sb3_baselines.make_env
    monkeypatch.setattr(sb3_baselines, "make_env", lambda env_id: StopAt(make_env(env_id), 1_300))
    argv = ["--algo", algo, "--env-id", "CartPole-v1", "--total-timesteps", "3000", "--checkpoint-every", "0"]
    threads = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as stop:
            sb3_baselines.main(sb3_baselines.parse_args([*argv, "--eval-episodes", "0", "--runs-dir", str(tmp_path)]))
        assert stop.value.code == 128 + signal.SIGINT
        # SB3 collects 256 steps at a time (RL Zoo's train_freq): the checkpoint is written where that collection ends.
        (path,) = tmp_path.glob("*/checkpoint.pt")
        out = capsys.readouterr().out
        assert "stopped at step 1536 with a checkpoint" in out
        resume_line = shlex.split(out.splitlines()[-1])  # pasted into a shell: exactly these words
        assert resume_line == ["python", os.path.abspath(sb3_baselines.__file__), "--resume", os.path.abspath(path)]
        monkeypatch.setattr(sb3_baselines, "make_env", make_env)
        resumed = sb3_baselines.parse_args(["--resume", str(path)])
        assert (resumed.algo, resumed.total_timesteps, resumed.checkpoint["global_step"]) == (algo, 3000, 1536)

        # The stopped run took its 128 gradient steps on the last collection after writing the checkpoint; a resume
        # takes them first, with the same random draws: the networks and the optimizer come out bit for bit the same.
        stopped, restored = made[0], sb3_baselines.make_model(resumed)
        sb3_baselines.restore(restored, resumed.checkpoint, resumed.seed)
        for name, value in stopped.policy.state_dict().items():
            assert torch.equal(value, restored.policy.state_dict()[name]), name
        optimizer_state = restored.policy.optimizer.state_dict()["state"]
        for index, state in stopped.policy.optimizer.state_dict()["state"].items():
            assert all(torch.equal(value, optimizer_state[index][key]) for key, value in state.items())
        for name in sb3_baselines.REPLAY_ARRAYS:  # the step after the checkpoint was taken but not stored
            np.testing.assert_array_equal(getattr(stopped.replay_buffer, name), getattr(restored.replay_buffer, name))
        assert restored.replay_buffer.pos == stopped.replay_buffer.pos == 1536
        assert (
            (restored._n_updates, restored._n_calls) == (stopped._n_updates, stopped._n_calls) == (3 * 128, 1536)
        )  # learning from 1,000
        assert restored.exploration_rate == stopped.exploration_rate
        assert stopped.num_timesteps == 1537
        restored.env.close()

        run_dir = sb3_baselines.main(resumed)
    finally:
        torch.set_num_threads(threads)
    assert run_dir == str(path.parent)  # the run went on in its own folder
    steps, returns = scalars(run_dir, "charts/episodic_return")
    _, lengths = scalars(run_dir, "charts/episodic_length")
    np.testing.assert_array_equal(returns, lengths)
    # The game in progress at the stop is dropped; the resumed run counts on from the checkpoint's step.
    before, after = steps <= 1536, steps > 1536
    np.testing.assert_array_equal(steps[before], np.cumsum(lengths[before]))
    np.testing.assert_array_equal(steps[after], 1536 + np.cumsum(lengths[after]))
    assert steps[after][-1] >= 3000 - 500


def test_a_resume_keeps_the_runs_flags_and_never_runs_code_from_the_file(tmp_path, capsys):
    marker = tmp_path / "ran"
    crafted = tmp_path / "checkpoint.pt"
    torch.save({"args": RunsCode(str(marker))}, crafted)  # a pickled object whose loading would run code
    with pytest.raises(SystemExit) as stop:
        sb3_baselines.parse_args(["--resume", str(crafted)])
    assert stop.value.code != 0 and not marker.exists()
    assert "not a readable checkpoint" in str(stop.value)

    run_dir = train(tmp_path / "runs", "dqn", "CartPole-v1", 300, "--checkpoint-every", "256")
    path = str(Path(run_dir) / "checkpoint.pt")
    with pytest.raises(SystemExit, match=r"^error: --seed=2: cannot change on resume \(the run has 1\)$"):
        sb3_baselines.parse_args(["--resume", path, "--seed", "2"])
    assert sb3_baselines.parse_args(["--resume", path, "--eval-episodes", "0"]).eval_episodes == 0


def test_two_ctrl_c_while_a_run_starts_exit_130_and_leave_no_run_folder(tmp_path, monkeypatch):
    def interrupted_twice(args):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(sb3_baselines, "make_model", interrupted_twice)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as stop:
        train(tmp_path, "dqn", "CartPole-v1", 300)
    assert stop.value.code == 128 + signal.SIGINT
    assert list(tmp_path.iterdir()) == [] and signal.getsignal(signal.SIGINT) == before


class RunsCode:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))
