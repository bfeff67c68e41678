"""dqn_dueling_per.py on Atari: the configuration an Atari id brings, and the replay that stores each frame once."""

import re
import sys
from pathlib import Path

import envpool
import numpy as np
import pytest

import cleanrl.dqn_dueling_per as script
from cleanrl.dqn_dueling_per import ATARI_DEFAULTS, Args, FrameReplayBuffer, NStepWindow, PrioritizedReplayBuffer
from cleanrl_q_utils import training_run

DOCS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "rl-algorithms" / "dqn_dueling_per.md"


# ---------------------------------------------------------------- the Atari configuration


class Started(Exception):
    """Stands in for the run: carries the flags it would start with."""


def started_args(monkeypatch, args: Args, argv=()) -> Args:
    """The flags `main(args)` would run with (the command line `argv`), stopped where the run would start."""

    def start(run_args, *rest, **kwargs):
        raise Started(run_args)

    monkeypatch.setattr(training_run, "Run", start)
    monkeypatch.setattr(script.flag_checks, "available_memory_bytes", lambda: 10**12)  # the 1M replay: about 7 GB
    monkeypatch.setattr(sys, "argv", ["dqn_dueling_per.py", *argv])
    with pytest.raises(Started) as started:
        script.main(args)
    return started.value.args[0]


def test_an_atari_id_runs_the_papers_configuration(monkeypatch, capsys):
    args = started_args(monkeypatch, Args(env_id="Breakout-v5"))
    assert {name: getattr(args, name) for name in ATARI_DEFAULTS} == ATARI_DEFAULTS
    assert args.total_timesteps == 50_000_000 and args.buffer_size == 1_000_000 and args.n_step == 1
    assert args.learning_rate == 6.25e-5 and args.target_network_frequency == 30_000 and args.learning_starts == 50_000
    # the start-up block says so, flag by flag
    line = next(line for line in capsys.readouterr().out.splitlines() if "the Atari configuration" in line)
    assert line.startswith("Breakout-v5: the Atari configuration: --total-timesteps 50000000 --num-envs 4 ")
    assert "--learning-rate 6.25e-05" in line and "--n-step 1" in line and "--target-network-frequency 30000" in line


def test_a_flag_given_on_the_command_line_wins_over_the_atari_configuration(monkeypatch, capsys):
    # --n-step 3 is also the script's default: given on the command line, it still wins.
    args = started_args(
        monkeypatch, Args(env_id="Pong-v5", learning_rate=1e-4), argv=["--learning-rate", "1e-4", "--n-step", "3"]
    )
    assert args.learning_rate == 1e-4 and args.n_step == 3
    assert args.buffer_size == ATARI_DEFAULTS["buffer_size"] and args.batch_size == ATARI_DEFAULTS["batch_size"]
    line = next(line for line in capsys.readouterr().out.splitlines() if "the Atari configuration" in line)
    assert "--learning-rate" not in line and "--n-step" not in line and "--buffer-size 1000000" in line


@pytest.mark.parametrize("env_id", ["CartPole-v1", "MinAtar/Breakout-v0"])
def test_other_ids_do_not_get_the_atari_configuration(monkeypatch, capsys, env_id):
    if env_id.startswith("MinAtar/"):
        pytest.importorskip("minatar")
    args = started_args(monkeypatch, Args(env_id=env_id))
    assert args.buffer_size == Args.buffer_size and args.num_envs == Args.num_envs
    assert args.n_step == Args.n_step and args.adam_eps == Args.adam_eps
    assert "the Atari configuration" not in capsys.readouterr().out


def test_the_docs_table_states_the_atari_configuration():
    """The docs page's table of the Atari configuration names every flag of ATARI_DEFAULTS with its value."""
    text = DOCS_PAGE.read_text()
    section = text[text.index("\n### The Atari configuration\n") :]
    section = section[: section.index("\n#", 1)]
    rows = re.findall(r"^\| `--([a-z-]+)` \| `([^`]+)` \|", section, re.MULTILINE)
    assert {flag.replace("-", "_"): eval(value, {"__builtins__": {}}) for flag, value in rows} == ATARI_DEFAULTS
    assert "configuration" in script.__doc__.split("\n\n")[0]  # --help prints the docstring's first paragraph


# ---------------------------------------------------------------- the replay's memory


def test_an_atari_transition_takes_one_frame_and_a_few_bytes():
    capacity, num_envs = 4096, 4
    rb = FrameReplayBuffer(capacity, num_envs, (4, 84, 84), alpha=0.6, n_step=3)
    arrays = [getattr(rb, name) for name in FrameReplayBuffer.ARRAYS] + [rb.sum_tree.nodes, rb.min_tree.nodes]
    allocated = sum(array.nbytes for array in arrays)
    per_transition = allocated / capacity
    assert 84 * 84 < per_transition < 84 * 84 + 64  # a frame, flags, action, return, discount, horizon, two tree leaves
    window = NStepWindow(3, num_envs, (), np.int64, 0.99)
    window_bytes = sum(getattr(window, name).nbytes for name in ("obs", "actions", "rewards", "length"))
    args = Args(env_id="Breakout-v5", buffer_size=capacity, num_envs=num_envs, n_step=3)
    assert script.replay_memory_bytes(args, (4, 84, 84), np.uint8) == allocated + window_bytes
    million = script.replay_memory_bytes(Args(env_id="Breakout-v5", buffer_size=1_000_000, num_envs=4), (4, 84, 84), np.uint8)
    assert 7.0e9 < million < 7.2e9  # the papers' 1M transitions; two stacks per transition took 56 GB


def test_a_ring_too_short_for_the_n_step_window_is_refused(monkeypatch):
    monkeypatch.setattr(training_run, "Run", lambda *args, **kwargs: pytest.fail("a run would start"))
    flags = dict(env_id="Breakout-v5", total_timesteps=400, buffer_size=28, num_envs=4, n_step=4, batch_size=8)
    with pytest.raises(SystemExit, match=r"^error: --buffer-size=28: must hold --n-step \+ 4 = 8 steps of each"):
        script.main(Args(**flags, learning_starts=100))


# ---------------------------------------------------------------- frame-once replay against whole stacks


class FakeAtari:
    """Vectorized envs that stack frames as envpool does, with NEXT_STEP autoreset: a game starts with its first frame
    repeated over the stack; after a lost life the stack runs on. Frame (1, 3) = [env, step % 256, step // 256], so
    every observation's frames are unique. Episodes end by lost lives, game overs and time-outs."""

    def __init__(self, num_envs: int, seed: int):
        self.num_envs, self.rng, self.step_count = num_envs, np.random.default_rng(seed), 0
        self.stacks = np.zeros((num_envs, 4, 1, 3), dtype=np.uint8)
        self.ended, self.game_over = np.zeros(num_envs, dtype=bool), np.ones(num_envs, dtype=bool)

    def frames(self) -> np.ndarray:
        step = self.step_count
        return np.array([[[e, step % 256, step // 256]] for e in range(self.num_envs)], dtype=np.uint8)

    def reset(self) -> np.ndarray:
        self.stacks[:] = self.frames()[:, None]
        return self.stacks.copy()

    def step(self):
        self.step_count += 1
        frames, reset_step = self.frames(), self.ended
        new_game = reset_step & self.game_over
        self.stacks[new_game] = frames[new_game][:, None]
        self.stacks[~new_game] = np.concatenate([self.stacks[~new_game, 1:], frames[~new_game][:, None]], axis=1)
        draw = self.rng.random(self.num_envs)
        terminated = ~reset_step & (draw < 0.12)  # a lost life, a third of them the last one
        truncated = ~reset_step & (draw >= 0.12) & (draw < 0.16)
        rewards = np.where(reset_step, 0.0, self.rng.integers(-1, 2, self.num_envs)).astype(np.float32)
        self.ended, self.game_over = terminated | truncated, truncated | (terminated & (draw < 0.04))
        return self.stacks.copy(), rewards, terminated, truncated


def transitions(rows) -> list[tuple]:
    obs, actions, returns, discounts, next_obs = rows
    return sorted(
        (o.tobytes(), int(a), float(r), float(d), n.tobytes())
        for o, a, r, d, n in zip(obs, actions, returns, discounts, next_obs)
    )


@pytest.mark.parametrize("n_step", [1, 3])
def test_frame_once_replay_returns_what_a_replay_of_whole_stacks_returns(n_step):
    """The same stream of 3 fake envs into the replay of whole stacks (PrioritizedReplayBuffer, large enough to keep
    everything) and into FrameReplayBuffer with rings of 12 steps. At every step, every transition the frame replay
    can sample is one of the reference's, with the same stacks, action, n-step return and discount; and it holds every
    reference transition whose frames its rings still hold."""
    num_envs, ring, gamma, steps = 3, 12, 0.9, 300
    env, rng = FakeAtari(num_envs, seed=n_step), np.random.default_rng(0)
    reference = PrioritizedReplayBuffer(num_envs * steps, (4, 1, 3), np.uint8, alpha=0.6)
    reference_window = NStepWindow(n_step, num_envs, (4, 1, 3), np.uint8, gamma)
    rb = FrameReplayBuffer(num_envs * ring, num_envs, (4, 1, 3), alpha=0.6, n_step=n_step, seed=1)
    window = NStepWindow(n_step, num_envs, (), np.int64, gamma)
    obs = env.reset()
    rb.begin(obs)
    is_reset_step = np.zeros(num_envs, dtype=bool)
    seen = {"reset steps": 0, "game starts": 0, "time-outs": 0, "compared": 0}
    for _ in range(steps):
        actions = rng.integers(0, 4, num_envs)
        next_obs, rewards, terminated, truncated = env.step()
        reference.add(*reference_window.push(obs, actions, rewards, terminated, truncated, next_obs, is_reset_step))
        held, next_held = rb.append(next_obs)
        rb.add(*window.push(held, actions, rewards, terminated, truncated, next_held, is_reset_step))
        seen["reset steps"] += is_reset_step.sum()
        seen["game starts"] += (is_reset_step & (next_obs == next_obs[:, -1:]).all(axis=(1, 2, 3))).sum()
        seen["time-outs"] += truncated.sum()
        obs, is_reset_step = next_obs, terminated | truncated

        leaves = np.arange(rb.capacity)
        stored = leaves[rb.sum_tree.leaves(leaves) > 0]
        got = transitions(rb.rows(stored))
        # The reference's transitions from observations still in the rings: o_t's newest frame is step t of the
        # stream, written at ring step t + 3 (begin wrote the first stack's 4 frames). Writing ring step W freed steps
        # W - ring to W - ring + 3, so with the newest at num_added - 1 the kept ones are from num_added - ring + 3 on.
        everything = reference.rows(np.arange(reference.size))
        t = everything[0][:, -1, 0, 1].astype(int) + 256 * everything[0][:, -1, 0, 2].astype(int)
        kept = t + 3 >= rb.num_added - ring + 3
        expected = transitions(tuple(column[kept] for column in everything))
        assert got == expected
        seen["compared"] += len(got)
        sampled = transitions(rb.sample(16, beta=0.4)[0])
        assert set(sampled) <= set(expected)
    assert seen["reset steps"] > 50 and seen["game starts"] > 10 and seen["time-outs"] > 10
    assert rb.num_added > 10 * ring and seen["compared"] > 3000


def test_frame_once_replay_rebuilds_what_envpool_returned():
    """Real Breakout (lives lost, games over, time-outs at 120 steps): every stack the replay can sample, and its
    bootstrap stack, are the observations envpool returned at those steps."""
    num_envs, ring = 3, 40
    envs = envpool.make(
        "Breakout-v5", env_type="gymnasium", num_envs=num_envs, seed=7, stack_num=4, episodic_life=True,
        reward_clip=True, max_episode_steps=120, noop_max=30, repeat_action_probability=0.0,
    )  # fmt: skip
    rng = np.random.default_rng(7)
    rb = FrameReplayBuffer(num_envs * ring, num_envs, (4, 84, 84), alpha=0.6, n_step=3)
    window = NStepWindow(3, num_envs, (), np.int64, 0.99)
    obs, _ = envs.reset()
    rb.begin(obs)
    returned = {(e, rb.num_added - 1): obs[e] for e in range(num_envs)}  # (env, ring step) -> observation
    is_reset_step = np.zeros(num_envs, dtype=bool)
    events = {"life": 0, "game": 0, "time-out": 0, "checked": 0}
    for step in range(450):
        next_obs, rewards, terminated, truncated, info = envs.step(rng.integers(0, 4, num_envs))
        held, next_held = rb.append(next_obs)
        rb.add(*window.push(held, np.zeros(num_envs), rewards, terminated, truncated, next_held, is_reset_step))
        returned |= {(e, rb.num_added - 1): next_obs[e] for e in range(num_envs)}
        events["life"] += int((terminated & ~info["terminated"].astype(bool)).sum())
        events["game"] += int(info["terminated"].sum())
        events["time-out"] += int(truncated.sum())
        is_reset_step = terminated | truncated
        if step % 9 == 0:
            leaves = np.arange(rb.capacity)
            stored = leaves[rb.sum_tree.leaves(leaves) > 0]
            env, slots = np.divmod(stored, ring)
            newest = rb.num_added - 1
            steps = newest - (newest - slots) % ring
            stacks, _, _, _, next_stacks = rb.rows(stored)
            for k in range(len(stored)):
                assert np.array_equal(stacks[k], returned[env[k], steps[k]])
                assert np.array_equal(next_stacks[k], returned[env[k], steps[k] + rb.horizons[env[k], slots[k]]])
            events["checked"] += len(stored)
    envs.close()
    assert events["life"] > 3 and events["game"] > 0 and events["time-out"] > 0 and events["checked"] > 3000
