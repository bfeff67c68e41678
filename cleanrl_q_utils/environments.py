"""Environment helpers that are not the algorithm: the recording env of `--capture-video` (envpool does not render),
the flags of an Atari step at the step cap, and the rebuilding of envpool envs on resume (`fast_forward_envs` steps the
logged actions again; `FirstStepIsReset` starts fresh games with a reset step). A video file is written whole or not
at all (`write_whole_video`).

Layer 3 (checks and helpers): imports minatar, episode_scores and flag_checks."""

import contextlib
import os
import signal
import threading
import time
import warnings
from typing import Optional

import gymnasium as gym
import numpy as np

from cleanrl_q_utils import minatar
from cleanrl_q_utils.episode_scores import format_duration
from cleanrl_q_utils.flag_checks import check_video_modules

# envpool builds gymnasium Box spaces from float64 bounds; gymnasium then warns on every classic-control run that it
# casts them to the float32 dtype the observations have, which is what we want.
warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")


# A signal during the recorded evaluation ends the run with one line of its own; gymnasium's recorder, collected on the
# way out, would add that it could not save the episode it was recording.
warnings.filterwarnings("ignore", message=".*Unable to save last video")


class FirstStepIsReset:
    """Fresh envpool envs (--resume-fresh-envs) whose first step is a reset step, as after an episode end under
    NEXT_STEP autoreset: the actions are ignored and the first observation of a new game comes back, with zero reward,
    no episode end, and the reset's info. Every later call goes to the envs themselves."""

    def __init__(self, envs):
        self.envs, self.first = envs, envs.reset()

    def __getattr__(self, name):
        return getattr(self.envs, name)

    def step(self, actions):
        if self.first is None:
            return self.envs.step(actions)
        (obs, info), self.first = self.first, None
        no = np.zeros(len(obs), dtype=bool)
        return obs, np.zeros(len(obs), dtype=np.float32), no, no.copy(), info


class WholeVideos(gym.wrappers.RecordVideo):
    """gymnasium's recorder of every episode, whose videos appear only complete (`write_whole_video`)."""

    def __init__(self, env: gym.Env, video_folder: str):
        super().__init__(env, video_folder, episode_trigger=lambda _: True)

    def stop_recording(self):
        frames, path = self.recorded_frames, os.path.join(self.video_folder, f"{self._video_name}.mp4")
        self.recorded_frames, self.recording, self._video_name = [], False, None
        if frames:
            write_whole_video(frames, self.frames_per_sec, path)


class VideoDropped(Exception):
    """A signal arrived during an encoding, and its handler let the process go on: that video is not kept."""


def write_whole_video(frames: list[np.ndarray], fps: float, path: str) -> None:
    """Encodes `frames` (RGB uint8) to the mp4 video `path`, which appears only complete: the encoder writes a hidden
    temporary file (`.<name>.part.mp4`, the ending picks the format), renamed when it is done. An error or a SIGINT,
    SIGTERM or SIGHUP during the encoding stops the encoder and removes that file before the signal is answered as
    before (the handler may end the process at once, where no `finally` would run): an interrupted evaluation leaves
    no truncated, unplayable video. Only a SIGKILL can leave the hidden file behind."""
    from moviepy.video.io.ffmpeg_writer import FFMPEG_VideoWriter

    folder, name = os.path.split(path)
    partial = os.path.join(folder, f".{name[: -len('.mp4')]}.part.mp4")
    height, width = frames[0].shape[:2]
    writer = FFMPEG_VideoWriter(partial, (width, height), fps)

    def discard():
        if writer.proc is not None:
            writer.proc.kill()
            writer.proc.wait()
            writer.proc = None
        with contextlib.suppress(OSError):
            os.remove(partial)

    try:
        with discarded_on_signal(discard):
            for frame in frames:
                writer.write_frame(frame)
            writer.close()
    except VideoDropped:
        print(f"note: the video {path} was not kept: a signal arrived while it was being encoded")
        return
    except BaseException:
        discard()
        raise
    os.replace(partial, path)


@contextlib.contextmanager
def discarded_on_signal(discard):
    """While the block runs, a SIGINT, SIGTERM or SIGHUP first calls `discard()`, then is answered by the handler that
    was installed; where that handler returns (the process goes on), the block ends with VideoDropped."""
    if threading.current_thread() is not threading.main_thread():  # handlers can only be set in the main thread
        yield
        return
    handled = [sig for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if signal.getsignal(sig) != signal.SIG_IGN]
    previous = {sig: signal.getsignal(sig) for sig in handled}

    def discard_then_answer(signum, frame):
        discard()
        answer = previous[signum]
        if callable(answer):
            answer(signum, frame)
        else:  # SIG_DFL, or a handler not installed from Python: the default action, which ends the process
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        raise VideoDropped()

    for sig in handled:
        signal.signal(sig, discard_then_answer)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def make_video_env(
    env_id: str, video_folder: str, frame_stack: int = 4, max_episode_steps: Optional[int] = None, episodic_life: bool = True
):
    """A recording gymnasium env for --capture-video (envpool does not render): for Atari ids, ale-py's env with the
    training preprocessing (NOOP starts, 4-frame skip, 84x84 grayscale, `frame_stack` frames); else gymnasium's own.
    `episodic_life` is the training env's envpool flag: with it envpool presses FIRE after every lost life, without
    it only at the start of a game, so the recorded game is the one trained and scored."""
    check_video_modules(env_id)
    if minatar.is_minatar(env_id):
        return WholeVideos(minatar.make_rendering_env(env_id), video_folder)
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # frames are drawn off-screen: no display needed (or complained of)
    if env_id.endswith("-v5"):
        import ale_py

        gym.register_envs(ale_py)
    if not env_id.endswith("-v5"):
        return WholeVideos(gym.make(env_id, render_mode="rgb_array"), video_folder)
    # The same model can score differently here than on envpool: say so, once per video evaluation.
    print(
        f"note: --capture-video evaluates on ale-py's ALE/{env_id} with the training preprocessing (envpool does not "
        "render): the same model's scores can differ from those on envpool"
    )
    frames = {} if max_episode_steps is None else {"max_num_frames_per_episode": 4 * max_episode_steps}
    env = gym.make(f"ALE/{env_id}", frameskip=1, repeat_action_probability=0.0, render_mode="rgb_array", **frames)
    env = WholeVideos(env, video_folder)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False)
    env = FireAfterLifeLoss(env, episodic_life) if "FIRE" in env.unwrapped.get_action_meanings() else env
    return gym.wrappers.FrameStackObservation(env, frame_stack) if frame_stack > 1 else env


def terminated_at_step_cap(terminated: np.ndarray, truncated: np.ndarray, info: dict) -> np.ndarray:
    """The termination flags of one envpool Atari step, with a game that ends on the capped step counted as ended:
    envpool returns `done & ~truncated` there, a time-out whose target would bootstrap, though `info["terminated"]`
    says the game is over. gymnasium (TimeLimit, ale-py's frame cap) already sets both flags; without that info key
    the flags are returned unchanged."""
    if "terminated" not in info:
        return terminated
    return terminated | (truncated & np.asarray(info["terminated"], dtype=bool))


class FireAfterLifeLoss(gym.Wrapper):
    """Presses FIRE once after the reset and, with `after_life_loss`, after every lost life, as envpool does
    (`use_fire_reset`; with `episodic_life` a life loss there is a reset): games like Breakout then go on without
    the agent having to serve. Without `episodic_life` envpool serves only a game's first ball, and so does this."""

    def __init__(self, env, after_life_loss: bool = True):
        super().__init__(env)
        self.after_life_loss = after_life_loss

    def fire(self):
        return self.env.step(self.env.unwrapped.get_action_meanings().index("FIRE"))

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.fire()
        return self.env.reset(**kwargs) if terminated or truncated else (obs, info)

    def step(self, action):
        lives = self.env.unwrapped.ale.lives()
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.after_life_loss and info["lives"] < lives and not (terminated or truncated):
            obs, fire_reward, terminated, truncated, info = self.fire()
            reward += fire_reward
        return obs, reward, terminated, truncated, info


def fast_forward_envs(envs, action_log: np.ndarray, obs: np.ndarray, action_dtype) -> None:
    """Steps fresh envs (envpool's or MinAtar's) through the logged actions (rows of one action per env), to rebuild
    the state a checkpoint does not hold; stops the run if the last observation differs from the checkpoint's `obs`."""
    envs_count = action_log.shape[1] if action_log.ndim > 1 else 1
    print(
        f"resume: fast-forwarding the environments through {action_log.size} logged agent steps ({len(action_log)} steps "
        f"of {envs_count} envs) to rebuild their games (a checkpoint holds no game state; --resume-fresh-envs skips this)",
        flush=True,
    )
    stepped, started = None, time.time()
    last = started
    for row, actions in enumerate(action_log, 1):
        stepped = envs.step(actions.astype(action_dtype))[0]
        # The first line, after a second, says how long the fast-forward takes; then one every ten seconds.
        if time.time() - last >= (10.0 if last > started else 1.0) and row < len(action_log):
            last = time.time()
            left = (len(action_log) - row) * (last - started) / row
            done = f"{row * envs_count}/{action_log.size} agent steps ({100 * row / len(action_log):.0f}%)"
            print(f"resume: fast-forwarded {done}, {format_duration(left)} left", flush=True)
    if last > started:
        print(f"resume: fast-forward done in {format_duration(time.time() - started)}")
    if stepped is not None and not np.array_equal(stepped, obs):
        raise SystemExit(
            "error: the environments' fast-forward through the logged actions diverged from the checkpoint "
            "(another envpool version?)"
        )
