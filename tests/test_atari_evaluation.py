"""Evaluation plays the training game (issue 15): on envpool Atari with training's life handling, a lost life is
followed by no-ops and FIRE, so a Breakout agent that never presses FIRE still finishes its games (5 lives of about
25 steps each); scores are whole games, counted once. Before the fix evaluation used `episodic_life=False`, where
nothing serves the ball after a lost life and a NOOP game only ends at the 27,000-step cap."""

import inspect

import numpy as np
import pytest
import torch

from cleanrl import dqn_dueling_per, iqn, iqn_atari, pqn, pqn_atari_envpool, pqn_atari_envpool_lstm, r2d2, r2d2_atari

STEP_BUDGET = 1_000  # steps per environment; a NOOP game of Breakout on training's env takes about 125


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Batches of 1-2 frames: more threads only add synchronization (on a busy 2-core machine, 100x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def noop_model(module, num_actions: int = 4):
    """A saved network of `module` whose greedy action is always 0 (NOOP): the last layer outputs its bias only."""
    if module is iqn_atari:
        model, last = (net := iqn_atari.QuantileNetwork(num_actions, 8, 16)), net.head[-1]
    elif module is dqn_dueling_per:
        model = dqn_dueling_per.DuelingQNetwork((4, 84, 84), num_actions)
        last = model.advantage[-1]
    else:
        model = module.QNetwork(num_actions)
        last = model.network[-1] if module is pqn_atari_envpool else model.q_head
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.eye(num_actions)[0])
    return model


def eval_args(module, **flags):
    sizes = dict(quantile_embedding_dim=8, hidden_size=16) if module is iqn_atari else {}
    return module.Args(**{"env_id": "Breakout-v5", "eval_episodes": 2, "eval_epsilon": 0.0, **sizes, **flags})


class CountingEnvs:
    """Wraps an env pool: counts steps, the actions sent, and the true game ends it reports; fails past the budget."""

    def __init__(self, envs, budget: int):
        self.envs, self.budget, self.steps, self.game_ends, self.actions = envs, budget, 0, 0, set()

    def step(self, actions):
        self.steps += 1
        self.actions.update(np.atleast_1d(actions).tolist())
        if self.steps > self.budget:
            raise AssertionError(f"evaluation still playing after {self.budget} steps: nothing serves after a lost life")
        result = self.envs.step(actions)
        info, truncated = result[4], result[3]
        ends = info["terminated"].astype(bool) if "reward" in info else result[2]
        self.game_ends += int(np.sum(ends | truncated))
        return result

    def __getattr__(self, name):
        return getattr(self.envs, name)


@pytest.mark.parametrize(
    "module", [iqn_atari, dqn_dueling_per, pqn_atari_envpool, pqn_atari_envpool_lstm], ids=lambda m: m.__name__[8:]
)
def test_noop_policy_finishes_whole_breakout_games(module, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    pools, make_env = [], module.make_env
    monkeypatch.setattr(
        module, "make_env", lambda *a, **k: pools.append(CountingEnvs(make_env(*a, **k), STEP_BUDGET)) or pools[-1]
    )
    args = eval_args(module)
    scores = module.evaluate(noop_model(module).state_dict(), args, torch.device("cpu"), "videos/run")
    (pool,) = pools
    assert pool.actions == {0}  # only NOOP was chosen: FIRE came from the environment
    games_per_env = args.eval_episodes // pool.num_envs
    assert 5 * 20 * games_per_env <= pool.steps <= 300 * games_per_env  # 5 lives, about 25 steps each, per game
    # Each env's games are whole games, counted once: as many scores as games the envs finished (a few envs may
    # finish a game more than their quota on the same step as the last counted one; none is counted twice).
    assert len(scores) == args.eval_episodes <= pool.game_ends
    assert all(score >= 0 and np.isfinite(score) for score in scores)


@pytest.mark.parametrize(
    "module", [iqn_atari, dqn_dueling_per, pqn_atari_envpool, pqn_atari_envpool_lstm], ids=lambda m: m.__name__[8:]
)
def test_video_evaluation_plays_the_same_games(module, monkeypatch, tmp_path):
    """--capture-video (ale-py) also serves after a lost life, so the recorded NOOP games end, are counted whole, and
    are written to the folder given."""
    for name in ("ale_py", "moviepy", "cv2"):
        pytest.importorskip(name, reason="the video extra (pip install -e '.[video]')")
    monkeypatch.chdir(tmp_path)
    counters, make_video_env = [], module.environments.make_video_env

    def counting_video_env(*args, **kwargs):
        counters.append(CountingEnvs(make_video_env(*args, **kwargs), STEP_BUDGET))
        return counters[-1]

    monkeypatch.setattr(module.environments, "make_video_env", counting_video_env)
    args = eval_args(module, capture_video=True, eval_episodes=1)
    scores = module.evaluate(noop_model(module).state_dict(), args, torch.device("cpu"), "videos/run")
    (env,) = counters
    assert len(scores) == 1 and scores[0] >= 0
    assert env.game_ends == 1 and 5 * 20 <= env.steps <= 300
    assert list((tmp_path / "videos" / "run").glob("*.mp4"))


def test_recurrent_state_is_zeroed_at_every_life_start(monkeypatch, tmp_path):
    """Training zeroes the LSTM state at each life start (after envpool's reset step); evaluation does the same."""
    monkeypatch.chdir(tmp_path)
    module = pqn_atari_envpool_lstm
    firsts = []

    class RecordingQNetwork(module.QNetwork):
        def forward(self, x, state, is_first):
            firsts.append(is_first[0].cpu().numpy().copy())
            return super().forward(x, state, is_first)

    monkeypatch.setattr(module, "QNetwork", RecordingQNetwork)
    pools, make_env = [], module.make_env
    monkeypatch.setattr(
        module, "make_env", lambda *a, **k: pools.append(CountingEnvs(make_env(*a, **k), STEP_BUDGET)) or pools[-1]
    )
    module.evaluate(noop_model(module).state_dict(), eval_args(module, eval_episodes=1), torch.device("cpu"), "videos/run")
    firsts = np.array(firsts)[:, 0]
    # The game's first observation, then the observation after each of the 4 reset steps that follow a lost life.
    assert firsts[0] and firsts.sum() == 5


# Defaults: 0.001 is the Atari evaluation of the dueling / tuned Double DQN, IQN (Dopamine) and R2D2-family scripts;
# 0.0 (greedy) is purejaxql's EPS_TEST for PQN. recurrent_iqn*.py keep their own evaluation settings.
@pytest.mark.parametrize(
    "module, default",
    [(dqn_dueling_per, 0.001), (iqn, 0.001), (iqn_atari, 0.001), (pqn, 0.0), (pqn_atari_envpool, 0.0)]
    + [(pqn_atari_envpool_lstm, 0.0), (r2d2, 0.001), (r2d2_atari, 0.001)],
    ids=lambda m: getattr(m, "__name__", "")[8:] or str(m),
)
def test_eval_epsilon_has_its_default_and_evaluate_takes_it_from_args_only(module, default):
    assert module.Args().eval_epsilon == default
    assert list(inspect.signature(module.evaluate).parameters)[:2] == ["weights", "args"]
    assert "epsilon" not in inspect.signature(module.evaluate).parameters  # no hidden second default


def test_eval_epsilon_reaches_the_policy(monkeypatch, tmp_path):
    """dqn_dueling_per hard-coded 0.05; --eval-epsilon 1 now makes every evaluation action uniform."""
    monkeypatch.chdir(tmp_path)
    pools, make_env = [], dqn_dueling_per.make_env
    monkeypatch.setattr(
        dqn_dueling_per, "make_env", lambda *a, **k: pools.append(CountingEnvs(make_env(*a, **k), STEP_BUDGET)) or pools[-1]
    )
    args = eval_args(dqn_dueling_per, eval_epsilon=1.0, eval_episodes=1)
    assert len(dqn_dueling_per.evaluate(noop_model(dqn_dueling_per).state_dict(), args, torch.device("cpu"), "run")) == 1
    assert pools[0].actions == {0, 1, 2, 3}


def test_a_video_evaluation_on_ale_py_says_so_in_one_line(tmp_path, capsys):
    """An Atari video is played on ale-py, not envpool, so its scores can differ: the console says so once; the
    gymnasium envs of other ids (the ones their scripts train on) print nothing."""
    for name in ("ale_py", "moviepy", "cv2"):
        pytest.importorskip(name, reason="the video extra (pip install -e '.[video]')")
    from cleanrl_q_utils import environments

    environments.make_video_env("Breakout-v5", str(tmp_path / "atari"), max_episode_steps=27_000).close()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "ale-py" in lines[0] and "ALE/Breakout-v5" in lines[0] and "envpool" in lines[0]
    environments.make_video_env("CartPole-v1", str(tmp_path / "cartpole")).close()
    assert capsys.readouterr().out == ""
