"""The Atari protocol of the scripts: a game that ends on the step cap is a termination, the video records the game as
trained and scored, and every Atari docs page states the protocol the scripts implement."""

import inspect
import pathlib

import numpy as np
import pytest
import torch

from cleanrl import dqn_dueling_per, iqn_atari, pqn_atari_envpool, pqn_atari_envpool_lstm, r2d2_atari, recurrent_iqn_atari
from cleanrl_q_utils import environments

from tiny import tiny

ATARI_SCRIPTS = [dqn_dueling_per, iqn_atari, pqn_atari_envpool, pqn_atari_envpool_lstm, r2d2_atari, recurrent_iqn_atari]


def script_id(module):
    return module.__name__.split(".")[-1]


def make_training_env(module, env_id: str, seed: int):
    """One environment exactly as the script's training loop builds them."""
    if module is recurrent_iqn_atari:
        args = module.Args()
        return module.make_env(env_id, 1, seed, args.max_episode_steps, not args.value_rescaling)
    return module.make_env(env_id, 1, seed)


# ---------------------------------------------------------------- a game over on the capped step
def noop_steps_to_game_over(envs) -> int:
    """Steps of NOOP from a reset until the env reports a finished game (Pong: the opponent scores 21 times)."""
    envs.reset()
    for t in range(1, 5000):
        _, _, terminated, truncated, info = envs.step(np.zeros(1, dtype=int))
        if terminated[0] or truncated[0]:
            return t
    raise AssertionError("no game over in 5000 NOOP steps")


def last_step(envs, steps: int):
    envs.reset()
    for _ in range(steps):
        result = envs.step(np.zeros(1, dtype=int))
    return result


def test_envpool_game_over_on_the_capped_step_is_a_termination():
    import envpool

    def pong(**cap):
        return envpool.make("Pong-v5", env_type="gymnasium", num_envs=1, seed=3, episodic_life=True, **cap)

    game_over_at = noop_steps_to_game_over(pong())
    assert 300 < game_over_at < 4000
    # capped exactly where the game ends: envpool calls the step a time-out only
    _, _, terminated, truncated, info = last_step(pong(max_episode_steps=game_over_at), game_over_at)
    assert truncated[0] and not terminated[0] and info["terminated"][0]
    assert environments.terminated_at_step_cap(terminated, truncated, info)[0]
    # capped one step earlier, the game goes on: a time-out, whose target bootstraps
    _, _, terminated, truncated, info = last_step(pong(max_episode_steps=game_over_at - 1), game_over_at - 1)
    assert truncated[0] and not terminated[0] and not info["terminated"][0]
    assert not environments.terminated_at_step_cap(terminated, truncated, info)[0]


def test_gymnasium_time_limit_game_over_on_the_capped_step_is_a_termination():
    gym = pytest.importorskip("gymnasium")
    ale_py = pytest.importorskip("ale_py", reason="the video extra (pip install -e '.[video]')")
    gym.register_envs(ale_py)

    def pong(**cap):
        envs = gym.vector.SyncVectorEnv([lambda: gym.make("ALE/Pong-v5", repeat_action_probability=0.0, **cap)])
        envs.reset(seed=3)
        return envs

    def run(envs, steps):
        for _ in range(steps):
            result = envs.step(np.zeros(1, dtype=int))
        return result

    envs = pong()
    game_over_at = next(t for t in range(1, 5000) if any(envs.step(np.zeros(1, dtype=int))[2]))
    _, _, terminated, truncated, info = run(pong(max_episode_steps=game_over_at), game_over_at)
    assert terminated[0] and truncated[0]  # gymnasium's TimeLimit keeps the termination
    assert environments.terminated_at_step_cap(terminated, truncated, info)[0]
    _, _, terminated, truncated, info = run(pong(max_episode_steps=game_over_at - 1), game_over_at - 1)
    assert truncated[0] and not environments.terminated_at_step_cap(terminated, truncated, info)[0]


class CappedGameOver:
    """An envpool pool whose environment 0 reports, on step `at`, a game over on the capped step the way envpool does
    (terminated False, truncated True, info["terminated"] 1); a recorder of the flags the training loop stores."""

    def __init__(self, envs, at: int):
        self.envs, self.at, self.steps = envs, at, 0

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.envs.step(actions)
        self.steps += 1
        if self.steps == self.at:
            terminated, truncated = terminated.copy(), truncated.copy()
            info = {**info, "terminated": np.array(info["terminated"]).copy()}
            terminated[0], truncated[0], info["terminated"][0] = False, True, 1
        return obs, reward, terminated, truncated, info

    def __getattr__(self, name):
        return getattr(self.envs, name)


def test_r2d2_atari_stores_a_game_over_on_the_capped_step_as_terminated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_env, buffers = r2d2_atari.make_env, []
    monkeypatch.setattr(r2d2_atari, "make_env", lambda *a, **k: CappedGameOver(make_env(*a, **k), at=30))
    replay = r2d2_atari.SequenceReplay
    monkeypatch.setattr(r2d2_atari, "SequenceReplay", lambda *a, **k: buffers.append(replay(*a, **k)) or buffers[-1])
    flags = tiny("r2d2_atari", total_timesteps=80, learning_starts=70, batch_size=2, lstm_size=8, burn_in=2, sequence_period=2)
    r2d2_atari.main(r2d2_atari.Args(**flags))
    (rb,) = buffers
    assert rb.terminated[0, 29] and rb.truncated[0, 29]  # step 30 of env 0: no bootstrap from its final frame
    assert not rb.terminated[1].any()


# ---------------------------------------------------------------- the video plays the game as trained and scored
class StopBeforePlaying(Exception):
    pass


def video_env_of(module, tmp_path):
    """The arguments the script's evaluate passes to make_video_env with --capture-video (it plays nothing)."""
    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        raise StopBeforePlaying

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module.environments, "make_video_env", record)
        patch.setattr(module.model_files, "put_weights", lambda *a, **k: None)
        patch.setattr(torch.nn.Module, "load_state_dict", lambda self, state, *a, **k: None)
        if module is r2d2_atari:
            patch.setattr(module, "play", lambda *a, **k: [0.0])  # the envpool games before the video
        args = module.Args(env_id="Breakout-v5", capture_video=True, eval_episodes=1)
        with pytest.raises(StopBeforePlaying):
            module.evaluate(str(tmp_path / "model.pt"), args, torch.device("cpu"), "run")
    (call,) = calls
    return call


def noop_game(envs, steps: int) -> tuple[int, bool]:
    """(lives left, game over) after `steps` NOOP steps from a reset, or when the game ends before."""
    envs.reset()
    for _ in range(steps):
        _, _, terminated, truncated, info = envs.step(np.zeros(1, dtype=int))
        game_over = bool(np.asarray(info.get("terminated", terminated))[0] or truncated[0])
        if game_over:
            return int(np.asarray(info["lives"])[0]), True
    return int(np.asarray(info["lives"])[0]), False


@pytest.mark.parametrize("module", ATARI_SCRIPTS, ids=script_id)
def test_the_video_records_the_game_as_trained_and_scored(module, monkeypatch, tmp_path):
    """A NOOP agent in Breakout: where training serves after a lost life (a lost life ends a training episode and
    envpool presses FIRE), the game ends after 5 lives; where it does not (r2d2_atari plays full games), the game
    stalls after the first lost life. The recorded game must do the same, under the same step cap and frame stack."""
    pytest.importorskip("ale_py", reason="the video extra (pip install -e '.[video]')")
    pytest.importorskip("moviepy", reason="the video extra (pip install -e '.[video]')")
    monkeypatch.chdir(tmp_path)
    args, kwargs = video_env_of(module, tmp_path)
    training = make_training_env(module, "Breakout-v5", seed=5)
    config = training.spec.config
    given = inspect.signature(environments.make_video_env).bind(*args, **kwargs)
    given.apply_defaults()
    assert given.arguments["max_episode_steps"] == config.max_episode_steps  # the same cap
    assert given.arguments["episodic_life"] == config.episodic_life  # the same serving after a lost life
    assert given.arguments["frame_stack"] == config.stack_num
    video = environments.make_video_env(*args, **kwargs)
    import gymnasium as gym

    video = gym.vector.SyncVectorEnv([lambda: video])
    steps = 600  # a NOOP game of Breakout with serving ends in about 125 steps
    trained, recorded = noop_game(training, steps), noop_game(video, steps)
    assert trained == recorded
    assert trained == ((0, True) if config.episodic_life else (4, False))
    video.close()


@pytest.mark.parametrize("module", ATARI_SCRIPTS, ids=script_id)
def test_every_atari_training_loop_counts_a_game_over_on_the_capped_step_as_terminated(module):
    """The flags each training loop stores or bootstraps from pass through the fix right after envpool's step (the
    r2d2_atari test above runs it end to end)."""
    source = inspect.getsource(module.main)
    step = source.index(" = envs.step(")
    assert "environments.terminated_at_step_cap(terminated, truncated, info" in source[step : source.index("\n", step) + 400]


# ---------------------------------------------------------------- the protocol stated in the docs
DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "rl-algorithms"
PROTOCOL_PAGES = ["dqn_dueling_per.md", "iqn.md", "pqn.md", "r2d2.md", "recurrent_iqn.md"]
ROWS = [
    "Frame skip (emulator frames per agent step, max-pooled)",
    "Sticky actions (repeat-action probability)",
    "No-op starts (at most)",
    "Frames per network input",
    "A lost life ends a training episode (terminal)",
    "The environment presses FIRE",
    "Step cap (agent steps)",
    "A game over on the capped step",
    "Reward clipping in training",
    "Evaluation epsilon (`--eval-epsilon`)",
    "Evaluation episodes (`--eval-episodes`)",
    "Evaluation score",
]


def protocol_table(page: str) -> tuple[list[str], dict[str, list[str]], str]:
    """(scripts named in the header, row label -> cells, the text between the table and the next heading) of the
    page's `## Atari protocol` section, which must come right before `## Hyperparameters`."""
    text = (DOCS / page).read_text()
    start = text.index("\n## Atari protocol\n")
    end = text.index("\n## ", start + 1)
    assert text[end:].startswith("\n## Hyperparameters\n"), page
    lines = text[start:end].strip().splitlines()[2:]
    table = [line for line in lines if line.startswith("|")]
    note = "\n".join(lines[len(table) :]).strip()
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table]
    header, body = rows[0], rows[2:]
    assert header[0] == "Setting" and set(rows[1]) == {"---"}
    scripts = [cell.strip("`").removesuffix(".py") for cell in header[1:]]
    return scripts, {row[0]: row[1:] for row in body}, note


def test_every_atari_page_has_the_same_protocol_table_in_the_same_place():
    notes = []
    for page in PROTOCOL_PAGES:
        _, rows, note = protocol_table(page)
        assert list(rows) == ROWS, page
        notes.append(note.split("\n\n")[0])  # the shared paragraph; a page may add its own after it
    assert len(set(notes)) == 1
    assert sorted(s for page in PROTOCOL_PAGES for s in protocol_table(page)[0]) == sorted(map(script_id, ATARI_SCRIPTS))


@pytest.mark.parametrize("module", ATARI_SCRIPTS, ids=script_id)
def test_the_docs_protocol_table_states_what_the_script_does(module):
    name = script_id(module)
    (page,) = [page for page in PROTOCOL_PAGES if name in protocol_table(page)[0]]
    scripts, rows, _ = protocol_table(page)
    said = {label: cells[scripts.index(name)] for label, cells in rows.items()}
    config, args = make_training_env(module, "Breakout-v5", seed=1).spec.config, module.Args()
    assert int(said[ROWS[0]]) == config.frame_skip
    assert float(said[ROWS[1]]) == config.repeat_action_probability
    assert int(said[ROWS[2]]) == config.noop_max
    assert int(said[ROWS[3]]) == getattr(args, "frame_stack", config.stack_num)
    assert said[ROWS[4]] == ("yes" if config.episodic_life else "no")
    assert config.use_fire_reset
    assert said[ROWS[5]] == ("at a game's start and after a lost life" if config.episodic_life else "at a game's start only")
    assert int(said[ROWS[6]].replace(",", "")) == config.max_episode_steps
    assert said[ROWS[7]] == "termination (no bootstrap)"  # test_every_atari_training_loop_... checks the loop
    assert said[ROWS[8]] == ("sign" if config.reward_clip else "none")
    assert float(said[ROWS[9]]) == args.eval_epsilon
    assert int(said[ROWS[10]]) == args.eval_episodes
    assert said[ROWS[11]] == "whole games, raw rewards"
    assert "make_env(" in inspect.getsource(module.evaluate)  # evaluation plays on the training environment
