"""What a run tells its user (cleanrl_q_utils: training_run.py, episode_scores.py, model_files.py): the start-up block,
the progress line, the closing summary, resume messages, the --capture-video checks, and evaluating a saved model
later with --eval-only."""

import glob
import importlib
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from cleanrl_q_utils import episode_scores

from helpers import checkpoint_of, import_script
from tiny import SHORT, tiny

ATARI = {name for name in SHORT if "atari" in name}


@pytest.fixture(autouse=True)
def in_tmp(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)


def test_durations_count_days_and_the_progress_line_says_percent_done(monkeypatch, capsys):
    assert episode_scores.format_duration(59) == "00:00:59"
    assert episode_scores.format_duration(86400 + 3661) == "1 day 01:01:01"
    assert episode_scores.format_duration(6 * 86400 + 8 * 3600 + 35 * 60 + 58) == "6 days 08:35:58"
    now = [1000.0]
    monkeypatch.setattr(episode_scores.time, "time", lambda: now[0])
    progress = episode_scores.Progress(50_000_000, 0, learning_starts=20_000, slow_hint="try the twin")
    now[0] += 10
    progress.print(10_000, [])  # acting only, 1,000 SPS: no estimate yet, it would promise far too little
    now[0] += 10
    progress.print(20_000, [])  # learning starts: the rate is measured from here
    now[0] += 100
    progress.print(30_000, [1.0, 3.0])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("| warming up (learning starts at step 20000)")  # the first call: no acting time yet
    assert lines[1].endswith("| ETA measuring (at least 13:53:00)")  # 49,980,000 steps at the warm-up's 1 ms: 49,980 s
    assert "step     30000/50000000 (  0.1%)" in lines[2] and "SPS    250" in lines[2] and "return(100)     2.00" in lines[2]
    assert lines[2].endswith("ETA 5 days 18:48:20")  # 49,970,000 steps at the 100 SPS since learning began: 499,700 s
    assert lines[3] == "warning: at the speed measured since learning began this run takes 5 days 18:48:20 more; try the twin"
    assert len(lines) == 4  # the warning comes once


def test_few_long_updates_are_timed_apart_from_acting(monkeypatch, capsys):
    """One update of 8 s every 1,000 steps, acting 1 ms a step: the time left counts both from the first update on,
    while a rate since learning started would see only the acting steps before the first update."""
    now = [0.0]
    monkeypatch.setattr(episode_scores.time, "time", lambda: now[0])
    progress = episode_scores.Progress(100_000, 0, learning_starts=1_000, interval=0.0, updates_per_step=1 / 1_000)
    for step in range(100, 2_100, 100):
        updates = 1 if step >= 2_000 else 0  # the first update, in the call of step 2,000 (with its 100 steps)
        now[0] += 0.1 + (8.0 if step == 2_000 else 0.0)
        progress.print(step, [], updates=updates)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("| warming up (learning starts at step 1000)")
    assert lines[10].endswith("| ETA after the first update (at least 00:01:38)")  # step 1,100: no update yet
    assert lines[-1].endswith("| ETA 00:14:42")  # 98,000 steps x (1 ms acting + 8 s / 1,000 steps updating): 882 s
    assert progress.time_left(2_000) == pytest.approx(98_000 * (0.001 + 8.0 / 1_000))


def test_a_run_starts_with_its_setting_and_ends_with_a_summary(capsys):
    pqn = import_script("pqn")
    scores = pqn.main(pqn.Args(**tiny("pqn", short=True), save_model=True, eval_episodes=2))
    out = capsys.readouterr().out
    first, run_dir = out.splitlines()[0], glob.glob("runs/*")[0]
    assert first == "pqn.py: CartPole-v1, seed 1, 512 agent steps"
    assert f"run directory: {run_dir}  (watch it: tensorboard --logdir runs)" in out
    assert f"  model: {run_dir}/pqn.cleanrl_model after training, then evaluated\n" in out
    assert f"device: cpu, 1 thread (no CUDA device found) | torch {torch.__version__}" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("finished step 512/512 in 00:00:") and f"return(100) {np.mean(scores[-100:]):.2f}" in last

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run_dir, size_guidance={"tensors": 0})
    events.Reload()
    (text,) = [event.tensor_proto.string_val[0].decode() for event in events.Tensors("hyperparameters/text_summary")]
    assert "|device|cpu, 1 thread (no CUDA device found)|" in text and f"|torch|{torch.__version__}|" in text
    assert "|git|" in text and "|envpool|" in text


def test_classic_control_runs_do_not_warn_about_box_precision():
    command = "from cleanrl import pqn; pqn.main(pqn.Args(total_timesteps=256, num_envs=4, num_steps=32))"
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__)))
    done = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "precision lowered" not in done.stderr + done.stdout


def test_resume_without_the_replay_says_so_and_counts_the_replayed_agent_steps(capsys):
    iqn = import_script("iqn")
    iqn.main(iqn.Args(**tiny("iqn", short=True, total_timesteps=400, checkpoint_every=400)))
    path = str(checkpoint_of())
    capsys.readouterr()
    iqn.main(iqn.Args(resume=path))  # the checkpoint's flags, 400 steps: a finished run
    out = capsys.readouterr().out
    assert "resume: fast-forwarding the environments through 400 logged agent steps (200 steps of 2 envs)" in out
    assert "resume: the replay was not saved (--checkpoint-replay was off): it refills from empty, and learning " in out
    assert "resumes at step 600" in out  # 400 + --learning-starts 200


def test_capture_video_checks_its_packages_before_training_and_warns_when_nothing_is_recorded(monkeypatch, capsys):
    iqn = import_script("iqn")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "moviepy" else real_find_spec(name))
    with pytest.raises(
        SystemExit, match=r'^error: --capture-video needs moviepy, not installed: pip install -e "\.\[video\]"$'
    ):
        iqn.main(iqn.Args(capture_video=True, save_model=True))
    assert not os.path.exists("runs")  # refused before the run started
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    pytest.importorskip("moviepy")
    pytest.importorskip("pygame")
    iqn.main(iqn.Args(**tiny("iqn", short=True), capture_video=True))
    assert "warning: --capture-video records the evaluation episodes, which only --save-model or --eval-only play" in (
        capsys.readouterr().out
    )
    assert not os.path.exists("videos")


@pytest.mark.parametrize("name", sorted(SHORT))
def test_every_script_evaluates_a_saved_model_later_from_the_command_line(name, capsys):
    script = import_script(name)
    # R2D2 has no life-loss resets, so an untrained agent that never serves plays Breakout to the 27,000-step cap.
    env = {"env_id": "Pong-v5" if name == "r2d2_atari" else "Breakout-v5"} if name in ATARI else {}
    script.main(script.Args(**tiny(name, short=True), **env, save_model=True, eval_episodes=1))
    out = capsys.readouterr().out
    (model_path,) = glob.glob(f"runs/*/{name}.cleanrl_model")
    assert f"evaluation of {model_path} over 1 episodes: mean " in out  # --save-model prints the mean
    assert "| evaluation " in out.strip().splitlines()[-1]  # and the summary line has it

    saved = torch.load(model_path, weights_only=True)
    assert saved["script"] == f"{name}.py" and saved["args"] == vars(
        script.Args(**tiny(name, short=True), **env, save_model=True, eval_episodes=1)
    )
    # A later evaluation: only the model path and evaluation flags are given; the sizes come from the file.
    scores = script.main(script.Args(eval_only=True, model_path=model_path, eval_episodes=2))
    out = capsys.readouterr().out
    assert len(scores) == 2 and all(np.isfinite(scores))
    assert f"evaluation of {model_path} over 2 episodes: mean {np.mean(scores):.2f}" in out
    assert len(glob.glob("runs/*")) == 1  # evaluating starts no training run


def test_eval_only_refuses_what_it_cannot_evaluate(tmp_path, capsys):
    iqn, pqn = import_script("iqn"), import_script("pqn")
    with pytest.raises(SystemExit, match="^error: --eval-only=True: needs --model-path PATH"):
        iqn.main(iqn.Args(eval_only=True))
    with pytest.raises(SystemExit, match="^error: --model-path=nowhere.pt: is only read with --eval-only"):
        iqn.main(iqn.Args(model_path="nowhere.pt"))
    with pytest.raises(SystemExit, match="^error: --model-path=nowhere.pt: no such file"):
        iqn.main(iqn.Args(eval_only=True, model_path="nowhere.pt"))
    pqn.main(pqn.Args(**tiny("pqn", short=True), save_model=True, eval_episodes=1))
    (model_path,) = glob.glob("runs/*/pqn.cleanrl_model")
    with pytest.raises(SystemExit, match=f"^error: --model-path={model_path}: written by pqn.py, not iqn.py$"):
        iqn.main(iqn.Args(eval_only=True, model_path=model_path))
    capsys.readouterr()
    # A flag that would change the network is named and ignored; a file of bare weights is built from the flags.
    pqn.main(pqn.Args(eval_only=True, model_path=model_path, eval_episodes=1, num_envs=8))
    assert "eval-only: ignoring --num-envs=8; the model's value is 4" in capsys.readouterr().out
    # A resumed run's model file names the checkpoint it resumed from; an evaluation does not take it.
    saved, resumed = torch.load(model_path, weights_only=True), str(tmp_path / "resumed.cleanrl_model")
    torch.save(saved | {"args": saved["args"] | {"resume": "runs/x/checkpoint.pt"}}, resumed)
    assert len(pqn.main(pqn.Args(eval_only=True, model_path=resumed, eval_episodes=1))) == 1
    bare = str(tmp_path / "bare.cleanrl_model")
    torch.save(saved["model"], bare)
    assert len(pqn.main(pqn.Args(eval_only=True, model_path=bare, eval_episodes=1))) == 1
    assert "holds weights only: the network is built from the command-line flags" in capsys.readouterr().out


def test_capture_video_records_the_evaluation_of_a_saved_model(capsys):
    pytest.importorskip("moviepy")
    pytest.importorskip("pygame")
    iqn = import_script("iqn")
    iqn.main(iqn.Args(**tiny("iqn", short=True), save_model=True, eval_episodes=1))
    (model_path,) = glob.glob("runs/*/iqn.cleanrl_model")
    iqn.main(iqn.Args(eval_only=True, model_path=model_path, eval_episodes=2, capture_video=True))
    videos = glob.glob("videos/*-eval-*/*.mp4")
    assert len(videos) == 2 and all(os.path.getsize(video) > 1000 for video in videos)


def test_videos_of_a_training_run_are_written_inside_its_run_folder(capsys):
    pytest.importorskip("moviepy", reason="the video extra (pip install -e '.[video]')")
    pytest.importorskip("pygame", reason="the video extra (pip install -e '.[video]')")
    pqn = import_script("pqn")
    flags = dict(total_timesteps=256, num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1, eval_episodes=1)
    pqn.main(pqn.Args(**flags, save_model=True, capture_video=True))
    (run_dir,) = glob.glob("runs/*")
    assert glob.glob(f"{run_dir}/videos/*.mp4") and os.listdir(".") == ["runs"]  # nothing outside the run folder
    assert f"videos in {run_dir}/videos" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["pqn", "pqn_atari_envpool", "dqn_dueling_per", "r2d2", "r2d2_atari", "recurrent_iqn"])
def test_save_model_with_no_evaluation_episodes_saves_and_plays_none(name, monkeypatch, tmp_path, capsys):
    """--eval-episodes 0 (allowed for every script): the model is written, no evaluation envs are built."""
    monkeypatch.chdir(tmp_path)
    module = import_script(name)
    module.main(module.Args(**tiny(name, short=True), save_model=True, eval_episodes=0))
    out = capsys.readouterr().out
    assert glob.glob(f"runs/*/{name}.cleanrl_model") and "no episodes played (--eval-episodes 0)" in out
