"""The five scripts of vector observations where envpool cannot be installed (it has Linux wheels only): classic
control runs on gymnasium's games through cleanrl_q_utils/classic_control.py, stepped as envpool steps them, and an
Atari id stops with one line. envpool is installed where these tests run, so the stand-in is compared with it directly,
and runs without envpool import it from a folder whose `envpool` package fails to import, as on macOS."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from cleanrl_q_utils import classic_control, flag_checks, flag_errors

from tiny import tiny

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = ["pqn", "dqn_dueling_per", "iqn", "r2d2", "recurrent_iqn"]


def envpool_envs(env_id, num_envs, seed, max_episode_steps=None):
    import envpool

    cap = {} if max_episode_steps is None else dict(max_episode_steps=max_episode_steps)
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **cap)


MAKERS = {"envpool": envpool_envs, "gymnasium": classic_control.make_envs}


def play(envs, actions):
    """Every step's (obs, reward, terminated, truncated, info) of `actions` (steps, envs), after a reset."""
    first = envs.reset()
    return first, [envs.step(row) for row in actions]


def test_the_stand_in_steps_as_envpool_does_at_the_step_cap():
    """Same seed and actions, a 5-step cap no game reaches its end before: both truncate on the 5th step, then play a
    reset step (reward 0, no episode end, elapsed_step 0), with the same dtypes and info fields."""
    actions = np.tile([0, 1, 1], (14, 1))
    (pool_obs, pool_info), pool = play(envpool_envs("CartPole-v1", 3, 7, max_episode_steps=5), actions)
    (gym_obs, gym_info), stand_in = play(classic_control.make_envs("CartPole-v1", 3, 7, max_episode_steps=5), actions)
    assert gym_obs.dtype == pool_obs.dtype and gym_obs.shape == pool_obs.shape
    assert set(gym_info) == set(pool_info) and set(gym_info["players"]) == set(pool_info["players"])
    np.testing.assert_array_equal(gym_info["elapsed_step"], pool_info["elapsed_step"])
    for (p_obs, p_rew, p_term, p_trunc, p_info), (g_obs, g_rew, g_term, g_trunc, g_info) in zip(pool, stand_in):
        assert (g_obs.dtype, g_rew.dtype, g_term.dtype, g_trunc.dtype) == (
            p_obs.dtype,
            p_rew.dtype,
            p_term.dtype,
            p_trunc.dtype,
        )
        np.testing.assert_array_equal(g_rew, p_rew)
        np.testing.assert_array_equal(g_term, p_term)
        np.testing.assert_array_equal(g_trunc, p_trunc)
        assert set(g_info) == set(p_info)  # no "reward" or "terminated": dqn_dueling_per reads those as Atari's
        for key in ("env_id", "elapsed_step"):
            assert g_info[key].dtype == p_info[key].dtype
            np.testing.assert_array_equal(g_info[key], p_info[key])
        np.testing.assert_array_equal(g_info["players"]["env_id"], p_info["players"]["env_id"])
    truncations = np.array([step[3] for step in stand_in])
    assert truncations[[4, 10]].all() and truncations.sum() == 2 * 3  # steps 5 and 11 of every env: one reset step between
    assert all(step[1].sum() == 0 for step in (stand_in[5], stand_in[11]))


@pytest.mark.parametrize("maker", MAKERS, ids=list(MAKERS))
def test_the_reset_step_ignores_its_action_and_ends_nothing(maker):
    """Pushing left until the pole falls ends an episode by termination; the next step is a reset step in envpool and
    in the stand-in alike: whatever its action, the same first observation, reward 0 and no episode end."""
    runs = []
    for reset_action in (0, 1):
        envs = MAKERS[maker]("CartPole-v1", 1, 11)
        envs.reset()
        steps = 0
        while not envs.step(np.array([0]))[2][0]:
            steps += 1
            assert steps < 100, "the pole never fell"
        obs, reward, terminated, truncated, info = envs.step(np.array([reset_action]))
        assert reward[0] == 0 and not terminated[0] and not truncated[0] and info["elapsed_step"][0] == 0
        runs.append(np.concatenate([obs, envs.step(np.array([1]))[0]]))
        envs.close()
    np.testing.assert_array_equal(runs[0], runs[1])


@pytest.mark.parametrize("maker", MAKERS, ids=list(MAKERS))
def test_env_i_is_seeded_with_seed_plus_i_and_a_reset_seed_is_ignored(maker):
    pair, alone = MAKERS[maker]("CartPole-v1", 2, 20), MAKERS[maker]("CartPole-v1", 1, 21)
    first = pair.reset()[0]
    np.testing.assert_array_equal(first[1], alone.reset(seed=99)[0][0])
    assert not np.array_equal(pair.reset()[0], first)  # a later reset goes on with each env's generator


def test_the_same_seed_and_actions_replay_the_same_games():
    """A resume rebuilds the envs by replaying the logged actions on fresh envs of the same seed."""
    actions = np.random.default_rng(0).integers(0, 3, (300, 3))
    first, second = (play(classic_control.make_envs("Acrobot-v1", 3, 5), actions)[1] for _ in range(2))
    np.testing.assert_array_equal(np.array([step[0] for step in first]), np.array([step[0] for step in second]))
    other = play(classic_control.make_envs("Acrobot-v1", 3, 6), actions)[1]
    assert not np.array_equal(other[-1][0], first[-1][0])


@pytest.fixture
def without_envpool(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # `import envpool` then fails, as where it is not installed


def test_without_envpool_classic_control_ids_have_envpools_spaces(without_envpool):
    assert classic_control.import_envpool() is None
    spec = flag_checks.check_env_id("CartPole-v1", atari=False)
    assert spec.observation_space.shape == (4,) and spec.observation_space.dtype == np.float32
    assert spec.action_space.n == 2
    from cleanrl_q_utils.run_folder import software_versions

    assert software_versions(str(REPO / "cleanrl" / "pqn.py"))["envpool"] == "not installed"


def test_envpool_and_the_stand_in_give_the_same_spaces():
    import envpool

    for env_id in ("CartPole-v1", "Acrobot-v1", "MountainCar-v0"):
        ours, theirs = classic_control.check_env_id(env_id), envpool.make_spec(env_id)
        assert ours.observation_space.shape == theirs.observation_space.shape
        assert ours.observation_space.dtype == theirs.observation_space.dtype
        assert ours.action_space == theirs.action_space


@pytest.mark.parametrize(
    "env_id, atari, says",
    [
        ("Breakout-v5", None, "Atari games need envpool, which installs on Linux only"),
        ("Pong-v5", True, "Atari games need envpool, which installs on Linux only"),
        ("Pendulum-v1", False, "the ids are CartPole-v0, CartPole-v1, Acrobot-v1"),
    ],
)
def test_without_envpool_other_ids_stop_with_one_line_naming_them(without_envpool, env_id, atari, says):
    with pytest.raises(SystemExit) as stop:
        flag_checks.check_env_id(env_id, atari)
    message = str(stop.value.code)
    assert message.startswith(f"error: --env-id={env_id}: ") and says in message and "\n" not in message


def test_available_memory_falls_back_to_all_ram_without_proc_or_free_pages(monkeypatch):
    """macOS has neither /proc/meminfo nor a count of free pages for sysconf."""
    sysconf = os.sysconf

    def no_proc(path, *args, **kwargs):
        raise FileNotFoundError(path)

    def no_free_pages(name):
        if name == "SC_AVPHYS_PAGES":
            raise ValueError("unrecognized configuration name")
        return sysconf(name)

    monkeypatch.setattr(flag_errors, "open", no_proc, raising=False)
    monkeypatch.setattr(os, "sysconf", no_free_pages)
    assert flag_errors.available_memory_bytes() == sysconf("SC_PHYS_PAGES") * sysconf("SC_PAGE_SIZE")


def test_envpool_is_a_dependency_on_linux_only():
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (envpool,) = [Requirement(line) for line in project["dependencies"] if Requirement(line).name == "envpool"]
    assert envpool.marker is not None
    assert envpool.marker.evaluate({"sys_platform": "linux"})
    assert not envpool.marker.evaluate({"sys_platform": "darwin"}) and not envpool.marker.evaluate({"sys_platform": "win32"})


@pytest.fixture(scope="module")
def blocked_envpool(tmp_path_factory) -> Path:
    """A folder that, first on PYTHONPATH, makes `import envpool` fail as on macOS."""
    folder = tmp_path_factory.mktemp("no_envpool")
    (folder / "envpool").mkdir()
    (folder / "envpool" / "__init__.py").write_text("raise ImportError(\"No module named 'envpool'\")\n")
    return folder


def command_line_flags(flags: dict) -> list[str]:
    words = []
    for name, value in flags.items():
        flag = name.replace("_", "-")
        words += ([f"--{flag}"] if value else [f"--no-{flag}"]) if isinstance(value, bool) else [f"--{flag}", str(value)]
    return words


def run_without_envpool(blocked: Path, cwd: Path, script: str, flags: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocked), str(REPO)]), OMP_NUM_THREADS="1")
    command = [sys.executable, str(REPO / "cleanrl" / f"{script}.py"), *command_line_flags(flags)]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def tensorboard_scalars(run_dir: Path, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir))
    accumulator.Reload()
    return [event.value for event in accumulator.Scalars(tag)]


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_vector_script_trains_on_cartpole_without_envpool(script, blocked_envpool, tmp_path):
    done = run_without_envpool(blocked_envpool, tmp_path, script, tiny(script, short=True, env_id="CartPole-v1"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "envpool not installed" in done.stdout  # the start-up block's versions: the run did play without it
    (run_dir,) = (tmp_path / "runs").iterdir()
    returns = tensorboard_scalars(run_dir, "charts/episodic_return")
    lengths = tensorboard_scalars(run_dir, "charts/episodic_length")
    assert len(returns) > 0 and np.all(np.isfinite(returns))
    # CartPole pays 1 per step, the reset step none: an episode's return is its length, at most the 500-step cap.
    np.testing.assert_array_equal(returns, lengths)
    assert max(lengths) <= 500


@pytest.mark.parametrize(
    "script",
    ["dqn_dueling_per", "pqn_atari_envpool", "pqn_atari_envpool_lstm", "iqn_atari", "r2d2_atari", "recurrent_iqn_atari"],
)
def test_an_atari_id_without_envpool_stops_with_one_line(script, blocked_envpool, tmp_path):
    done = run_without_envpool(blocked_envpool, tmp_path, script, dict(env_id="Breakout-v5"))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --env-id=Breakout-v5: Atari games need envpool"), done.stderr
    assert not (tmp_path / "runs").exists()
