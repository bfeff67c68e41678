"""Every bad flag is refused before anything is built: one line that starts with `error: --<the flag>=`, and no run
directory. Nothing trains here: `training_run.Run` is replaced by a stand-in that fails the test if a run would start."""

import math

import numpy as np
import pytest

from cleanrl import (
    dqn_dueling_per,
    iqn,
    iqn_atari,
    pqn,
    pqn_atari_envpool,
    pqn_atari_envpool_lstm,
    r2d2,
    r2d2_atari,
    recurrent_iqn,
    recurrent_iqn_atari,
)
from cleanrl_q_utils import training_run

SCRIPTS = [pqn, pqn_atari_envpool, pqn_atari_envpool_lstm, dqn_dueling_per, iqn, iqn_atari, r2d2, r2d2_atari]
SCRIPTS += [recurrent_iqn, recurrent_iqn_atari]
ATARI = {pqn_atari_envpool, pqn_atari_envpool_lstm, iqn_atari, r2d2_atari, recurrent_iqn_atari}
COUNTS = (
    "total_timesteps num_envs num_steps num_minibatches update_epochs batch_size buffer_size seq_len n_step "
    "train_frequency target_network_frequency target_update_period hidden_size lstm_size quantile_embedding_dim "
    "num_tau_samples "
    "num_tau_prime_samples num_quantile_samples log_interval max_episode_steps frame_stack"
).split()
BAD = (
    [(flag, value) for flag in ("learning_rate", "adam_eps", "kappa", "replay_ratio") for value in (0.0, -1e-3, math.nan)]
    + [("learning_rate", math.inf), ("prioritized_replay_eps", 0.0), ("prioritized_replay_eps", -1.0)]
    + [("max_grad_norm", 0.0), ("max_grad_norm", -10.0), ("max_grad_norm", math.nan)]
    + [
        (flag, value)
        for flag in ("gamma", "q_lambda", "start_e", "end_e", "min_epsilon", "eval_epsilon", "priority_eta")
        for value in (-0.1, 1.5, math.nan)
    ]
    + [("exploration_fraction", -0.1), ("exploration_fraction", 1.5), ("exploration_fraction", math.nan)]
    + [(flag, -1.0) for flag in ("prioritized_replay_alpha", "prioritized_replay_beta", "epsilon_alpha")]
    + [(flag, -1) for flag in ("learning_starts", "burn_in", "checkpoint_every", "eval_episodes")]
    + [("seed", -1), ("seed", 2**32), ("seed", 2**31), ("seed", 2**32 - 1)]  # envpool takes 32-bit signed seeds
    + [("exp_name", name) for name in ("a/b", "../../x", "", "..", "x" * 300)]  # one folder name, not a path
    # a plain name, as it is part of the printed resume line and of the W&B run: no shell character, space or flag look
    + [("exp_name", name) for name in ("x;touch PWNED;y", "a b", "$(id)", "-x")]
    + [(flag, 0) for flag in COUNTS]
    + [("total_timesteps", 10**15), ("env_id", "NoSuchGame-v5"), ("env_id", "Pendulum-v1")]
)


def cases():
    for module in SCRIPTS:
        fields = vars(module.Args())
        for flag, value in BAD:
            if flag in fields:
                yield pytest.param(module, flag, value, id=f"{module.__name__.split('.')[-1]}-{flag}={value}")
        if module is dqn_dueling_per:  # it takes both kinds of environment
            continue
        other_family = "CartPole-v1" if module in ATARI else "Breakout-v5"
        yield pytest.param(module, "env_id", other_family, id=f"{module.__name__.split('.')[-1]}-env_id={other_family}")


@pytest.mark.parametrize("module, flag, value", list(cases()))
def test_a_bad_flag_is_refused_in_one_line_before_anything_is_built(module, flag, value, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)

    def would_start(*args, **kwargs):
        raise AssertionError(f"--{flag}={value} was accepted: a run would start")

    monkeypatch.setattr(training_run, "Run", would_start)
    with pytest.raises(SystemExit) as refusal:
        module.main(module.Args(**{flag: value}))
    message = str(refusal.value.code)
    assert message.startswith(f"error: --{flag.replace('_', '-')}=") and "\n" not in message, message
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("module", SCRIPTS, ids=lambda module: module.__name__.split(".")[-1])
def test_fresh_envs_without_a_resume_are_refused_in_one_line(module, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(training_run, "Run", lambda *args, **kwargs: pytest.fail("a run would start"))
    with pytest.raises(SystemExit, match=r"^error: --resume-fresh-envs=True: only with --resume PATH"):
        module.main(module.Args(resume_fresh_envs=True))
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("module", SCRIPTS, ids=lambda module: module.__name__.split(".")[-1])
def test_track_without_a_weights_and_biases_login_is_refused_before_the_run_folder(module, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setattr(training_run, "Run", lambda *args, **kwargs: pytest.fail("a run would start"))
    with pytest.raises(SystemExit, match=r"^error: --track: no Weights & Biases login found"):
        module.main(module.Args(track=True))
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("module", SCRIPTS, ids=lambda module: module.__name__.split(".")[-1])
def test_a_total_between_two_whole_iterations_is_rounded_up_and_said(module, monkeypatch, tmp_path, capsys):
    class Started(Exception):
        """Stands in for the run: the flags it would start with."""

    def start(args, *rest, **kwargs):
        raise Started(args)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(training_run, "Run", start)
    asked = module.Args().total_timesteps + 1
    with pytest.raises(Started) as started:
        module.main(module.Args(total_timesteps=asked))
    args = started.value.args[0]
    per_iteration = args.num_envs * getattr(args, "num_steps", 1)
    assert args.total_timesteps == -(-asked // per_iteration) * per_iteration  # the next whole number of iterations
    note = f"--total-timesteps={asked} rounded up to {args.total_timesteps}"
    assert (note in capsys.readouterr().out) == (per_iteration > 1)


@pytest.mark.parametrize("module", SCRIPTS, ids=lambda module: module.__name__.split(".")[-1])
def test_exploration_fraction_zero_is_accepted_and_means_end_e_from_the_first_step(module):
    module.validate_args(module.Args(exploration_fraction=0.0))  # no refusal
    steps = np.array([0, 1, 8, 10_000])
    assert (module.linear_schedule(1.0, 0.05, 0.0 * 10_000, steps) == 0.05).all()


@pytest.mark.parametrize("module", SCRIPTS, ids=lambda module: module.__name__.split(".")[-1])
def test_linear_schedule_runs_from_start_to_end_over_its_duration_then_holds(module):
    f = module.linear_schedule
    by_hand = {0: 1.0, 25: 0.75, 50: 0.5, 100: 0.0, 101: 0.0, 10_000: 0.0}  # 1 -> 0 over 100 steps
    for step, value in by_hand.items():
        assert f(1.0, 0.0, 100, step) == pytest.approx(value, abs=1e-12)
    assert f(1.0, 0.01, 100, 500) == 0.01  # exactly the end value once the decay is over
    np.testing.assert_allclose(f(0.4, 1.0, 60, np.array([0, 30, 60, 90])), [0.4, 0.7, 1.0, 1.0])  # rising (PER's beta)
