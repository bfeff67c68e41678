"""A recorded evaluation video appears only complete: an --eval-only --capture-video run interrupted while it encodes
leaves no partial video, and an uninterrupted one leaves a playable one and no temporary file."""

import glob
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("moviepy")
pytest.importorskip("pygame")

from cleanrl import pqn  # noqa: E402
from cleanrl_q_utils import model_files  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The child runs pqn.py as the command line does (its own signal handlers), with the encoder's frame writer wrapped so
# that a real signal reaches the process in the middle of an encoding, after a few frames went to ffmpeg.
INTERRUPTED_EVALUATION = """
import os, runpy, signal, sys
from moviepy.video.io import ffmpeg_writer

signum, model, script = int(sys.argv[1]), sys.argv[2], sys.argv[3]
write, written = ffmpeg_writer.FFMPEG_VideoWriter.write_frame, []
def write_then_signal(self, frame):
    write(self, frame)
    written.append(1)
    if len(written) == 3:
        os.kill(os.getpid(), signum)
ffmpeg_writer.FFMPEG_VideoWriter.write_frame = write_then_signal
sys.argv = [script, "--eval-only", "--model-path", model, "--capture-video", "--eval-episodes", "1"]
runpy.run_path(script, run_name="__main__")
"""


def untrained_model(folder) -> str:
    """A model file of pqn.py's CartPole network as initialised: its episodes are short, its video is quick to encode."""
    os.makedirs(folder)
    path = os.path.join(folder, "pqn.cleanrl_model")
    model_files.save_weights(path, pqn.__file__, pqn.Args(), pqn.QNetwork((4,), 2).state_dict())
    return path


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_evaluation_interrupted_while_its_video_is_encoded_leaves_no_partial_video(signum, tmp_path):
    model = untrained_model(tmp_path / "runs" / "cartpole")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    child = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_EVALUATION, str(int(signum)), model, pqn.__file__],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 128 + signum, child.stdout + child.stderr
    folders = glob.glob(str(tmp_path / "videos" / "*"))
    assert len(folders) == 1, "the evaluation did not reach the recording"
    assert os.listdir(folders[0]) == [], "the interrupted encoding left a file"


def test_an_uninterrupted_evaluation_leaves_one_playable_video_and_no_temporary_file(tmp_path, monkeypatch):
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    model = untrained_model(tmp_path / "runs" / "cartpole")
    monkeypatch.chdir(tmp_path)
    scores = pqn.main(pqn.Args(eval_only=True, model_path=model, capture_video=True, eval_episodes=1))
    (folder,) = glob.glob("videos/*")
    assert os.listdir(folder) == ["rl-video-episode-0.mp4"]
    frames, _ = imageio_ffmpeg.count_frames_and_secs(os.path.join(folder, "rl-video-episode-0.mp4"))
    assert frames == scores[0] + 1  # CartPole scores 1 a step; the reset frame is recorded too
