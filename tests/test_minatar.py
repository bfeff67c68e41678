"""MinAtar games (the `minatar` extra) in the five scripts of vector observations: the envs, the torso, the
configuration a MinAtar id brings, the run folder, resume, video, and one learning check."""

import sys
import time

import numpy as np
import pytest
import torch
from benchmark_runs import load_benchmark_module

from cleanrl import dqn_dueling_per, iqn, iqn_atari, pqn, r2d2, recurrent_iqn
from cleanrl_q_utils import checkpoint_files, command_line, flag_checks, minatar

from helpers import run_dir_of
from interrupts import interrupt_at_step, run_until_stopped
from learning import last_mean, passes_with_one_of
from tiny import tiny

pytest.importorskip("minatar", reason='MinAtar is an optional extra: pip install -e ".[minatar]"')


def tensorboard_scalars(run_dir, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir))
    accumulator.Reload()
    return [event.value for event in accumulator.Scalars(tag)]


@pytest.mark.parametrize("module", [pqn, dqn_dueling_per, iqn, r2d2, recurrent_iqn], ids=lambda m: m.__name__.split(".")[-1])
def test_every_vector_script_trains_on_a_minatar_game(module, monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    args = module.Args(**tiny(module, env_id="MinAtar/Breakout-v0"), save_model=True, eval_episodes=2)
    scores = module.main(args)
    out = capsys.readouterr().out
    assert "torso: convolutional (16 filters 3x3" in out and "10x10x4" in out
    assert len(scores) > 0 and np.all(np.isfinite(scores))
    run_dir = run_dir_of(tmp_path)
    assert run_dir.name.startswith("MinAtar-Breakout-v0__")  # one folder, the id's slash written as a dash
    assert len(tensorboard_scalars(run_dir, "eval/episodic_return")) == 2
    loss_tag = "losses/quantile_loss" if module in (iqn, recurrent_iqn) else "losses/td_loss"
    assert np.all(np.isfinite(tensorboard_scalars(run_dir, loss_tag)))


def test_a_minatar_id_brings_its_configuration_and_given_flags_win(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["pqn.py", "--env-id", "MinAtar/Asterix-v0", "--update-epochs", "3"])
    given = pqn.Args(env_id="MinAtar/Asterix-v0", update_epochs=3)
    args = command_line.with_minatar_defaults(given, pqn.MINATAR_DEFAULTS)
    assert args.update_epochs == 3  # given: wins
    assert (
        args.num_steps == pqn.MINATAR_DEFAULTS["num_steps"] and args.total_timesteps == pqn.MINATAR_DEFAULTS["total_timesteps"]
    )
    assert "MinAtar configuration: " in capsys.readouterr().out
    # Given with the value that is also the script's default: still given, still wins.
    monkeypatch.setattr(sys, "argv", ["pqn.py", "--env-id", "MinAtar/Asterix-v0", "--num-envs", "128"])
    assert command_line.with_minatar_defaults(pqn.Args(env_id="MinAtar/Asterix-v0"), {"num_envs": 64}).num_envs == 128
    # Other ids, resumed runs and evaluations keep their flags.
    monkeypatch.setattr(sys, "argv", ["pqn.py"])
    for args in (
        pqn.Args(),
        pqn.Args(env_id="MinAtar/Asterix-v0", resume="x.pt"),
        pqn.Args(env_id="MinAtar/Asterix-v0", eval_only=True),
    ):
        assert command_line.with_minatar_defaults(args, pqn.MINATAR_DEFAULTS) == args


def test_recurrent_iqns_minatar_configuration_copies_its_target_every_20k_agent_steps(monkeypatch, tmp_path, capsys):
    """--target-network-frequency counts agent steps, rounded down to whole updates (one per 80 steps here); the
    start-up block says what it became. The MinAtar configuration's value was once 250, written as if it counted
    updates: a copy every 3 updates."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["recurrent_iqn.py"])
    recurrent_iqn.main(recurrent_iqn.Args(env_id="MinAtar/Breakout-v0", total_timesteps=160, learning_starts=80))
    assert "updates: one every 80 agent steps; a target copy every 250 updates (20000 agent steps)" in capsys.readouterr().out


def test_without_the_extra_a_minatar_id_is_refused_in_one_line_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "minatar", None)  # what an environment without the package gives
    monkeypatch.setitem(sys.modules, "minatar.gym", None)
    with pytest.raises(SystemExit) as stop:
        flag_checks.check_env_id("MinAtar/Breakout-v0", atari=False)
    message = str(stop.value)
    assert message.startswith("error: --env-id=MinAtar/Breakout-v0:") and 'pip install -e ".[minatar]"' in message
    assert "\n" not in message


def test_unknown_minatar_ids_and_atari_scripts_are_refused_in_one_line():
    with pytest.raises(SystemExit, match=r"^error: --env-id=MinAtar/Pong-v0: not a MinAtar id; there are .*Breakout"):
        flag_checks.check_env_id("MinAtar/Pong-v0", atari=False)
    with pytest.raises(SystemExit, match=r"^error: --env-id=MinAtar/Breakout-v0: a MinAtar game: this script needs an Atari"):
        iqn_atari.validate_args(iqn_atari.Args(env_id="MinAtar/Breakout-v0"))


def test_minatar_envs_are_seeded_when_built_and_reset_on_the_next_step():
    """As envpool: the games are seeded when built (the same seed plays the same games), and the step after a game's
    end only resets it (reward 0, no end), which every script masks out as envpool's reset step."""
    first = minatar.make_envs("MinAtar/Breakout-v0", 2, seed=3)
    second = minatar.make_envs("MinAtar/Breakout-v0", 2, seed=3)
    assert np.array_equal(first.reset()[0], second.reset()[0])
    rng = np.random.default_rng(0)
    ended_at = None
    for step in range(2000):
        actions = rng.integers(6, size=2)
        obs_a, reward, terminated, truncated, _ = first.step(actions)
        assert np.array_equal(obs_a, second.step(actions)[0])
        if ended_at is not None:  # the step after an end
            assert reward[0] == 0 and not terminated[0] and not truncated[0]
            break
        if terminated[0]:
            ended_at = step
    assert ended_at is not None and obs_a.dtype == bool and obs_a.shape == (2, 10, 10, 4)


def test_a_resumed_minatar_run_is_the_uninterrupted_one(monkeypatch, tmp_path):
    """The games are rebuilt by replaying the logged actions (sticky actions and all): bit for bit the same run."""
    flags = tiny(pqn, env_id="MinAtar/SpaceInvaders-v0", total_timesteps=4096, checkpoint_every=2048)
    for folder in ("whole", "resumed"):
        (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path / "whole")
    whole = pqn.main(pqn.Args(**flags))
    monkeypatch.chdir(tmp_path / "resumed")
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, pqn, k=80)  # in the 3rd of 4 rollouts of 32 steps: stops at step 2048
        run_until_stopped(pqn.main, pqn.Args(**flags))
    run_dir = run_dir_of(tmp_path / "resumed")
    time.sleep(1.0)  # TensorBoard orders event files by their second
    resumed = pqn.main(pqn.Args(**flags, resume=str(run_dir / "checkpoint.pt")))
    assert resumed == whole and len(whole) > 10
    ends = [
        checkpoint_files.read_checkpoint(str(next((tmp_path / f / "runs").iterdir()) / "checkpoint.pt"))
        for f in ("whole", "resumed")
    ]
    assert ends[0]["global_step"] == ends[1]["global_step"] == 4096
    for name, weight in ends[0]["state"]["q_network"].items():
        assert torch.equal(weight, ends[1]["state"]["q_network"][name]), name


def test_a_minatar_evaluation_with_capture_video_writes_a_video_of_its_episode(monkeypatch, tmp_path):
    pytest.importorskip("moviepy")
    monkeypatch.chdir(tmp_path)
    model = pqn.QNetwork((10, 10, 4), 6)
    args = pqn.Args(env_id="MinAtar/Breakout-v0", capture_video=True, eval_episodes=1)
    scores = pqn.evaluate(model.state_dict(), args, torch.device("cpu"), str(tmp_path / "videos"))
    videos = list((tmp_path / "videos").glob("*.mp4"))
    assert len(scores) == 1 and len(videos) == 1 and videos[0].stat().st_size > 1000


def test_the_report_reads_minatar_run_folders():
    run_reading = load_benchmark_module("run_reading")
    assert run_reading.parse_run_name("MinAtar-Breakout-v0__pqn__3__1700000000_2")["env_id"] == "MinAtar/Breakout-v0"


def test_random_play_scores_whole_games_repeatably_and_refuses_other_ids(monkeypatch):
    random_play = load_benchmark_module("minatar_random_play")
    scores = random_play.random_play_scores("MinAtar/Breakout-v0", 30, seed=0)
    assert len(scores) == 30 and np.all(scores >= 0) and np.all(scores == np.round(scores))  # a brick is worth 1
    assert 0 < scores.mean() < 2  # random play breaks a brick now and then; the learning runs in the docs reach 14+
    assert np.array_equal(scores, random_play.random_play_scores("MinAtar/Breakout-v0", 30, seed=0))
    assert not np.array_equal(scores, random_play.random_play_scores("MinAtar/Breakout-v0", 30, seed=1))
    # a wrong id is refused before the games before it are played
    monkeypatch.setattr(sys, "argv", ["minatar_random_play.py", "--env-ids", "MinAtar/Breakout-v0", "CartPole-v1"])
    with pytest.raises(SystemExit) as exit_info:
        random_play.main()
    assert exit_info.value.code == 2
    monkeypatch.setattr(sys, "argv", ["minatar_random_play.py", "--env-ids", "MinAtar/Breakout-v0", "MinAtar/Pong-v0"])
    with pytest.raises(SystemExit, match=r"^error: --env-id=MinAtar/Pong-v0: not a MinAtar id; there are"):
        random_play.main()


# pqn.py's MinAtar configuration cut to 409,600 steps (100 rollouts; about 80 s on an idle 2-core CPU), MinAtar
# Breakout, last-100 training mean. Measured on a 2-core AMD EPYC CPU (PyTorch 2.13, one thread per run, another run
# beside it), seeds 1-8: 8.61, 9.94, 9.69, 7.68, 6.75, 6.48, 7.87, 8.19. With learning disabled (--learning-rate 1e-12)
# seeds 1 and 2 end at 0.03 and 0.48; random play scores about 0.5, Young & Tian's DQN about 10 after 5M steps.
@pytest.mark.learning
def test_pqn_learns_minatar_breakout(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["pqn.py"])

    def run(seed: int) -> float:
        args = pqn.Args(env_id="MinAtar/Breakout-v0", total_timesteps=409_600, seed=seed)
        return last_mean(pqn.main(args), 100)

    passes_with_one_of([1, 2], run, 5.0)
