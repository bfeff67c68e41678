"""benchmark/sb3_baselines.py: tiny SB3 runs whose TensorBoard logs must hold the true score of every episode played,
at the agent step where it ended, in a run directory that benchmark/report.py reads. Skipped without the sb3 extra."""

import copy
import os
import shlex
import signal
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from benchmark_runs import load_benchmark_module

from cleanrl_q_utils import command_line

from helpers import checkpoint_of

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


def main(args) -> str:
    threads = torch.get_num_threads()
    try:
        return sb3_baselines.main(args)
    finally:
        torch.set_num_threads(threads)  # main sets one thread; later tests in this process keep their own


def train(algo: str, env_id: str, steps: int, **flags) -> str:
    """Trains in the working directory (the run folder goes to runs/) and returns the run folder."""
    return main(sb3_baselines.Args(algo=algo, env_id=env_id, seed=1, total_timesteps=steps, eval_episodes=2, **flags))


def test_cartpole_returns_equal_lengths_and_end_at_the_steps_played(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = train("dqn", "CartPole-v1", 2_000)
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


def test_acrobot_returns_are_minus_one_per_step_but_the_last(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = train("qrdqn", "Acrobot-v1", 1_500)
    steps, returns = scalars(run_dir, "charts/episodic_return")
    _, lengths = scalars(run_dir, "charts/episodic_length")
    assert len(returns) >= 2  # random play mostly hits the 500-step time limit
    # -1 per step; the step that reaches the goal pays 0, a time-out at 500 steps pays -1 like any other.
    expected = np.where(lengths == 500, -500.0, -(lengths - 1.0))
    np.testing.assert_array_equal(returns, expected)
    np.testing.assert_array_equal(steps, np.cumsum(lengths))
    assert run_reading.load_runs([tmp_path])[0].exp_name == "sb3_qrdqn"


def command_line_args(monkeypatch, *argv: str):
    """The Args that the command line `python benchmark/sb3_baselines.py *argv` parses to."""
    monkeypatch.setattr(sys, "argv", [sb3_baselines.__file__, *argv])
    return command_line.parse(sb3_baselines.Args)


def test_rl_zoo_budgets_are_the_default_and_bad_flags_stop_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for algo, env_id, budget in [("dqn", "CartPole-v1", 50_000), ("qrdqn", "Acrobot-v1", 100_000)]:
        args = command_line_args(monkeypatch, "--algo", algo, "--env-id", env_id, "--seed", "1", "--no-track")
        args = sb3_baselines.run_args(args, resumed=False)
        assert (args.total_timesteps, args.exp_name, args.track) == (budget, f"sb3_{algo}", False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    for flags, message in [
        ([], "error: --algo=None: one of dqn, qrdqn (required)"),
        (["--algo", "ppo"], "error: --algo=ppo: one of dqn, qrdqn (required)"),
        (["--algo", "dqn", "--env-id", "Pong-v5"], "error: --env-id=Pong-v5: one of Acrobot-v1, CartPole-v1, MinAtar/"),
        (["--algo", "dqn", "--total-timesteps", "0"], "error: --total-timesteps=0: must be a whole number >= 1"),
        (["--algo", "dqn", "--seed", "-1"], "error: --seed=-1: must be in [0, 2147418112)"),
        (["--algo", "dqn", "--eval-episodes", "-1"], "error: --eval-episodes=-1: must be >= 0"),
        (["--algo", "dqn", "--exp-name", "a b"], "error: --exp-name=a b: must be a plain name"),
        (["--algo", "dqn", "--track"], "error: --track: no Weights & Biases login found"),
        (["--algo", "dqn", "--resume", str(tmp_path)], f"error: --resume={tmp_path}: not a file"),
        (["--algo", "dqn", "--resume-fresh-envs"], "error: --resume-fresh-envs=True: only with --resume PATH"),
    ]:
        with pytest.raises(SystemExit) as stop:
            main(command_line_args(monkeypatch, *flags))
        assert str(stop.value.code).startswith(message) and "\n" not in str(stop.value.code), stop.value.code
    assert not (tmp_path / "runs").exists()  # refused before anything was made


@pytest.mark.parametrize("algo", ["dqn", "qrdqn"])
def test_minatar_runs_use_the_scripts_torso_and_log_like_them(algo, tmp_path, monkeypatch):
    pytest.importorskip("minatar")
    monkeypatch.chdir(tmp_path)
    run_dir = train(algo, "MinAtar/Breakout-v0", 6_000)  # learning from step 5,000, as Young & Tian
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


def snapshot(model) -> dict:
    """A copy of what a resume must bring back of SB3's model: networks, optimizer, replay, counters."""
    buffer = model.replay_buffer
    return copy.deepcopy(
        dict(
            policy=model.policy.state_dict(),
            optimizer=model.policy.optimizer.state_dict()["state"],
            replay={name: getattr(buffer, name) for name in sb3_baselines.REPLAY_ARRAYS},
            counters=(buffer.pos, model._n_updates, model._n_calls, model.exploration_rate),
        )
    )


@pytest.mark.parametrize("algo", ["dqn", "qrdqn"])
def test_a_stopped_run_resumes_from_its_checkpoint_as_if_it_had_not_stopped(algo, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    made = []

    class RecordedModel(sb3_baselines.ALGOS[algo]):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setitem(sb3_baselines.ALGOS, algo, RecordedModel)
    make_env = sb3_baselines.make_env
    monkeypatch.setattr(sb3_baselines, "make_env", lambda env_id: StopAt(make_env(env_id), 1_300))
    with pytest.raises(SystemExit) as stop:
        main(sb3_baselines.Args(algo=algo, total_timesteps=3000, checkpoint_every=0, eval_episodes=0))
    assert stop.value.code == 128 + signal.SIGINT
    # SB3 collects 256 steps at a time (RL Zoo's train_freq): the checkpoint is written where that collection ends.
    path = checkpoint_of()
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("stopped at step 1536/3000 ") for line in lines)
    (asked,) = [i for i, line in enumerate(lines) if line.endswith("continue the run with:")]
    resume_line = shlex.split(lines[asked + 1])  # pasted into a shell: exactly these words
    assert resume_line == ["python", os.path.abspath(sb3_baselines.__file__), "--resume", os.path.abspath(path)]
    monkeypatch.setattr(sb3_baselines, "make_env", make_env)
    format = sb3_baselines.CHECKPOINT_FORMAT
    resumed, checkpoint = command_line.resume(sb3_baselines.Args(resume=str(path)), sb3_baselines.__file__, format)
    assert (resumed.algo, resumed.total_timesteps, checkpoint["global_step"]) == (algo, 3000, 1536)

    # The stopped run took its 128 gradient steps on the last collection after writing the checkpoint; a resume
    # takes them first, with the same random draws: the networks and the optimizer come out bit for bit the same.
    restored, train_on_last_collection = [], sb3_baselines.train_on_last_collection

    def recorded(model):
        train_on_last_collection(model)
        restored.append(snapshot(model))

    monkeypatch.setattr(sb3_baselines, "train_on_last_collection", recorded)
    run_dir = main(sb3_baselines.Args(resume=str(path)))
    stopped, (restored,) = snapshot(made[0]), restored
    assert made[0].num_timesteps == 1537  # the step after the checkpoint was taken but not stored
    for name, value in stopped["policy"].items():
        assert torch.equal(value, restored["policy"][name]), name
    for index, state in stopped["optimizer"].items():
        assert all(torch.equal(value, restored["optimizer"][index][key]) for key, value in state.items())
    for name, array in stopped["replay"].items():
        np.testing.assert_array_equal(array, restored["replay"][name])
    # pos, updates (learning from 1,000), target-copy clock, epsilon
    assert restored["counters"] == stopped["counters"] and stopped["counters"][:3] == (1536, 3 * 128, 1536)

    assert run_dir == str(path.parent)  # the run went on in its own folder
    steps, returns = scalars(run_dir, "charts/episodic_return")
    _, lengths = scalars(run_dir, "charts/episodic_length")
    np.testing.assert_array_equal(returns, lengths)
    # The game in progress at the stop is dropped; the resumed run counts on from the checkpoint's step.
    before, after = steps <= 1536, steps > 1536
    np.testing.assert_array_equal(steps[before], np.cumsum(lengths[before]))
    np.testing.assert_array_equal(steps[after], 1536 + np.cumsum(lengths[after]))
    assert steps[after][-1] >= 3000 - 500


def test_a_resume_keeps_the_runs_flags_and_never_runs_code_from_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    crafted = tmp_path / "checkpoint.pt"
    torch.save({"args": RunsCode(str(marker))}, crafted)  # a pickled object whose loading would run code
    with pytest.raises(SystemExit) as stop:
        main(sb3_baselines.Args(resume=str(crafted)))
    assert stop.value.code != 0 and not marker.exists()
    assert "not a readable checkpoint" in str(stop.value)

    run_dir = train("dqn", "CartPole-v1", 300, checkpoint_every=256)
    path, format = str(Path(run_dir) / "checkpoint.pt"), sb3_baselines.CHECKPOINT_FORMAT
    with pytest.raises(SystemExit, match=r"^error: --seed=2: cannot change on resume \(the checkpoint has 1\)"):
        command_line.resume(sb3_baselines.Args(resume=path, seed=2), sb3_baselines.__file__, format)
    args, _ = command_line.resume(sb3_baselines.Args(resume=path, eval_episodes=0), sb3_baselines.__file__, format)
    assert (args.eval_episodes, args.seed, args.total_timesteps) == (0, 1, 300)


def test_two_ctrl_c_while_a_run_starts_exit_130_and_leave_no_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def interrupted_twice(args, device):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(sb3_baselines, "make_model", interrupted_twice)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as stop:
        train("dqn", "CartPole-v1", 300)
    assert stop.value.code == 128 + signal.SIGINT
    assert list((tmp_path / "runs").iterdir()) == [] and signal.getsignal(signal.SIGINT) == before


class RunsCode:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))
