"""Checkpoints, resume, signals, NaN guard and memory pre-flight of the PQN scripts."""

import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cleanrl import pqn, pqn_atari_envpool, pqn_atari_envpool_lstm
from cleanrl_q_utils.checkpoint_files import read_checkpoint

from helpers import checkpoint_of, run_dir_of
from interrupts import interrupt_at_step, run_until_stopped
from tiny import tiny

# tiny("pqn"): 4 envs x 16 steps, 64 agent steps per iteration, 32 iterations. With checkpoint_every=1024: a periodic
# checkpoint at 1024 and one at the end.


def tb_returns(run_dir: Path) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return [(event.step, event.value) for event in acc.Scalars("charts/episodic_return")]


def test_sigint_leaves_a_checkpoint_and_restores_handlers(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    handler_before = signal.getsignal(signal.SIGINT)
    interrupt_at_step(monkeypatch, pqn, k=40)  # in the 3rd iteration (steps 32..47)
    run_until_stopped(pqn.main, pqn.Args(**tiny("pqn")))
    state = read_checkpoint(checkpoint_of(tmp_path))
    assert state["global_step"] == 3 * 64 and state["state"]["iteration"] == 3
    action_log = state["state"]["action_log"]
    assert action_log.shape == (3 * 16, 4) and action_log.dtype == np.uint8
    assert signal.getsignal(signal.SIGINT) is handler_before


def test_interrupted_and_resumed_run_equals_uninterrupted(monkeypatch, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    scores_a = pqn.main(pqn.Args(**tiny("pqn", checkpoint_every=1024)))
    final_a = read_checkpoint(checkpoint_of(tmp_path / "a"))

    monkeypatch.chdir(tmp_path / "b")
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, pqn, k=250)  # around agent step 1000
        run_until_stopped(pqn.main, pqn.Args(**tiny("pqn", checkpoint_every=1024)))
    run_b = run_dir_of(tmp_path / "b")
    assert read_checkpoint(run_b / "checkpoint.pt")["global_step"] == 1024
    # TensorBoard reads event files in name order: the wall-clock second, then a per-process writer counter that
    # sorts "10" before "9". A real resume is a later process; here, wait for the next second.
    time.sleep(1.0)
    scores_b = pqn.main(pqn.Args(resume=str(run_b / "checkpoint.pt"), checkpoint_every=1024))
    final_b = read_checkpoint(run_b / "checkpoint.pt")

    assert final_b["global_step"] == final_a["global_step"] == 2048
    weights_a, weights_b = final_a["state"]["q_network"], final_b["state"]["q_network"]
    assert weights_a.keys() == weights_b.keys()
    for name, weight in weights_a.items():
        assert torch.equal(weight, weights_b[name]), name
    assert scores_a == scores_b and len(scores_a) > 10
    # The resumed run appends to the same TensorBoard log without duplicating the stretch before the checkpoint.
    assert tb_returns(run_b) == tb_returns(run_dir_of(tmp_path / "a"))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "other format"])
def test_unreadable_checkpoint_gives_one_clear_message(damage, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "checkpoint.pt"
    if damage == "truncated":
        pqn.main(pqn.Args(**tiny("pqn", total_timesteps=256, checkpoint_every=128)))
        data = checkpoint_of(tmp_path).read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"this is not a checkpoint" * 100)
    else:
        torch.save({"format": 999, "network": {}}, path)
    with pytest.raises(SystemExit, match="--resume") as error:
        pqn.main(pqn.Args(resume=str(path)))
    assert "not a readable checkpoint" in str(error.value)


def test_missing_resume_file_and_negative_checkpoint_every_are_refused(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="--resume"):
        pqn.main(pqn.Args(resume=str(tmp_path / "nope.pt")))
    with pytest.raises(SystemExit, match="--checkpoint-every"):
        pqn.validate_args(pqn.Args(checkpoint_every=-1))


def test_injected_nan_stops_with_the_step_and_last_checkpoint(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    calls = []
    original = pqn.q_lambda_returns

    def nan_on_third_call(*args):
        calls.append(1)
        returns = original(*args)
        return returns * float("nan") if len(calls) == 3 else returns

    monkeypatch.setattr(pqn, "q_lambda_returns", nan_on_third_call)
    with pytest.raises(SystemExit, match="non-finite") as error:
        pqn.main(pqn.Args(**tiny("pqn", checkpoint_every=64)))
    assert "at step 192" in str(error.value)
    assert "runs/" in str(error.value) and "checkpoint.pt" in str(error.value)
    # The broken network is never written: the checkpoint is that of the 2nd iteration.
    assert read_checkpoint(checkpoint_of(tmp_path))["global_step"] == 128


@pytest.mark.parametrize("module", [pqn, pqn_atari_envpool, pqn_atari_envpool_lstm], ids=["mlp", "cnn", "lstm"])
def test_oversized_rollout_is_refused_before_envs_are_built(module, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(module, "make_env", lambda *a, **kw: pytest.fail("an env was built"))
    huge = 10**6
    with pytest.raises(SystemExit, match="--num-envs") as error:
        module.main(module.Args(num_envs=huge, num_steps=huge))
    assert "--num-steps" in str(error.value)
    assert not (tmp_path / "runs").exists()


def test_rollout_memory_estimate_counts_observations():
    args = pqn_atari_envpool.Args(num_envs=8, num_steps=128)
    per_step = 4 * 84 * 84 + 8 + 4 + 4 + 4 + 1
    assert pqn_atari_envpool.rollout_memory_bytes(args, (4, 84, 84), np.uint8) == 8 * 128 * per_step


def test_seeded_runs_log_identical_returns(monkeypatch, tmp_path):
    scores = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        scores.append(pqn.main(pqn.Args(**tiny("pqn", total_timesteps=1024))))
    assert scores[0] == scores[1] and len(scores[0]) > 0


@pytest.mark.parametrize("module", [pqn_atari_envpool, pqn_atari_envpool_lstm], ids=["cnn", "lstm"])
def test_atari_sigint_checkpoint_and_exact_resume(module, monkeypatch, tmp_path):
    args = tiny(module, total_timesteps=2 * 64, num_steps=16, checkpoint_every=128)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    scores_a = module.main(module.Args(**args))
    final_a = read_checkpoint(checkpoint_of(tmp_path / "a"))

    monkeypatch.chdir(tmp_path / "b")
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, module, k=5)  # in the 1st iteration
        run_until_stopped(module.main, module.Args(**args))
    path = checkpoint_of(tmp_path / "b")
    assert read_checkpoint(path)["global_step"] == 64
    # The resume replays the 16 logged steps of real Atari envs and checks it reaches the stored observation.
    scores_b = module.main(module.Args(resume=str(path), checkpoint_every=128))
    final_b = read_checkpoint(path)
    assert final_b["global_step"] == 2 * 64
    for name, weight in final_a["state"]["q_network"].items():
        assert torch.equal(weight, final_b["state"]["q_network"][name]), name
    assert scores_a == scores_b


def test_tracked_resume_continues_the_same_wandb_run(offline_wandb, monkeypatch):
    args = tiny("pqn", total_timesteps=256, update_epochs=1, track=True)
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, pqn, k=5)
        run_until_stopped(pqn.main, pqn.Args(**args))
    path = checkpoint_of(offline_wandb.parent)
    run_id = read_checkpoint(path)["wandb_id"]
    pqn.main(pqn.Args(resume=str(path), track=True, checkpoint_every=256))
    final = read_checkpoint(path)
    assert final["global_step"] == 256 and final["wandb_id"] == run_id
    assert len(list(offline_wandb.glob(f"offline-run-*-{run_id}"))) == 2


def test_a_launcher_repeating_the_command_resumes_a_run_whose_total_was_rounded_up(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    flags = tiny("pqn", total_timesteps=2000, checkpoint_every=1024)  # 31.25 rollouts of 64 agent steps: 32 are run
    command = ["pqn.py", "--total-timesteps", "2000", "--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2"]
    command += ["--update-epochs", "2", "--checkpoint-every", "1024"]
    interrupt_at_step(monkeypatch, pqn, k=40)
    monkeypatch.setattr("sys.argv", command)
    run_until_stopped(pqn.main, pqn.Args(**flags))
    assert "--total-timesteps=2000 rounded up to 2048" in capsys.readouterr().out
    path = str(checkpoint_of(tmp_path))
    assert read_checkpoint(path)["args"]["total_timesteps"] == 2048
    monkeypatch.setattr("sys.argv", [*command, "--resume", path])
    pqn.main(pqn.Args(**flags, resume=path))  # the same command and --resume, as launch.py retries a run
    assert read_checkpoint(path)["global_step"] == 2048
    monkeypatch.setattr("sys.argv", [*command[:1], "--total-timesteps", "4096", "--resume", path])
    with pytest.raises(
        SystemExit, match=r"^error: --total-timesteps=4096: cannot change on resume \(the checkpoint has 2048\)"
    ):
        pqn.main(pqn.Args(**dict(flags, total_timesteps=4096), resume=path))
