"""The memory pre-flight: flags (or a model file's saved flags) that describe a run too big for the machine are refused
in one line naming the flag before anything is built, and the network estimates it adds up are honest: at least the
parameters of the network the script builds, times the copies a run holds, and not so much more that normal runs are
refused."""

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn as nn

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
from cleanrl_q_utils import flag_checks, model_files, training_run

from tiny import tiny


def name(module) -> str:
    return module.__name__.rsplit(".", 1)[-1]


def sequence_buffer(module, num_envs: int) -> int:
    """The smallest buffer that holds the windows a sequence script asks of every env."""
    a = module.Args()
    window = a.burn_in + a.seq_len + a.n_step
    if module is r2d2_atari:
        return num_envs * (window + max(window, a.sequence_period + a.frame_stack))
    return 2 * num_envs * window


# Per script: (the flag made huge, the flags of the run). Other flags follow where a rule ties them to the huge one (a
# buffer that holds a batch, learning that starts after it), so that the memory check is what refuses the run.
HUGE = {
    pqn: [
        ("num_envs", dict(num_envs=10**8)),
        ("num_steps", dict(num_steps=10**9)),
        ("eval_episodes", dict(eval_episodes=10**9, save_model=True)),
    ],
    pqn_atari_envpool: [
        ("num_envs", dict(num_envs=10**7)),
        ("num_steps", dict(num_steps=10**7)),
        ("eval_episodes", dict(eval_episodes=10**9, save_model=True)),
    ],
    pqn_atari_envpool_lstm: [
        ("num_envs", dict(num_envs=10**7)),
        ("num_steps", dict(num_steps=10**7)),
        ("eval_episodes", dict(eval_episodes=10**9, save_model=True)),
    ],
    dqn_dueling_per: [
        ("hidden_size", dict(hidden_size=10**6)),
        ("batch_size", dict(batch_size=10**9, buffer_size=10**9, learning_starts=10**9, total_timesteps=2 * 10**9)),
        (
            "num_envs",
            dict(
                num_envs=10**8,
                buffer_size=3 * 10**8,
                learning_starts=3 * 10**8,
                train_frequency=10**8,
                total_timesteps=4 * 10**8,
            ),
        ),
        ("eval_episodes", dict(eval_episodes=10**9, save_model=True)),
    ],
    iqn: [
        ("hidden_size", dict(hidden_size=10**6)),
        ("quantile_embedding_dim", dict(quantile_embedding_dim=10**9)),
        ("num_tau_samples", dict(num_tau_samples=10**6)),
        ("num_tau_prime_samples", dict(num_tau_prime_samples=10**6)),
        ("num_quantile_samples", dict(num_quantile_samples=10**9)),
        ("batch_size", dict(batch_size=10**8, learning_starts=10**8, buffer_size=10**8, total_timesteps=2 * 10**8)),
        ("num_envs", dict(num_envs=10**8, buffer_size=4 * 10**8)),
    ],
    iqn_atari: [
        ("hidden_size", dict(hidden_size=10**8)),
        ("quantile_embedding_dim", dict(quantile_embedding_dim=10**9)),
        ("num_tau_samples", dict(num_tau_samples=10**6)),
        ("num_tau_prime_samples", dict(num_tau_prime_samples=10**6)),
        ("num_quantile_samples", dict(num_quantile_samples=10**8)),
        ("batch_size", dict(batch_size=10**6, learning_starts=10**6, total_timesteps=2 * 10**6)),
        ("num_envs", dict(num_envs=10**7, buffer_size=10**8)),
    ],
    r2d2: [
        ("lstm_size", dict(lstm_size=10**6)),
        ("batch_size", dict(batch_size=10**8)),
        ("num_envs", dict(num_envs=10**8, buffer_size=sequence_buffer(r2d2, 10**8), total_timesteps=10**8)),
        ("eval_episodes", dict(eval_episodes=10**9, save_model=True)),
    ],
    r2d2_atari: [
        ("lstm_size", dict(lstm_size=10**6)),
        ("batch_size", dict(batch_size=10**7)),
        ("num_envs", dict(num_envs=10**6, buffer_size=sequence_buffer(r2d2_atari, 10**6), total_timesteps=10**6)),
        ("eval_episodes", dict(eval_episodes=10**9, save_model=True)),
    ],
}
for module in (recurrent_iqn, recurrent_iqn_atari):
    HUGE[module] = [
        ("lstm_size", dict(lstm_size=10**6)),
        ("hidden_size", dict(hidden_size=10**6)),
        ("quantile_embedding_dim", dict(quantile_embedding_dim=10**9)),
        ("num_tau_samples", dict(num_tau_samples=10**6)),
        ("num_tau_prime_samples", dict(num_tau_prime_samples=10**6)),
        ("num_quantile_samples", dict(num_quantile_samples=10**8)),
        ("batch_size", dict(batch_size=10**8)),
        ("num_envs", dict(num_envs=10**7, buffer_size=sequence_buffer(module, 10**7))),
    ]


@pytest.mark.parametrize(
    "module, flag, flags",
    [pytest.param(m, flag, flags, id=f"{name(m)}-{flag}") for m, cases in HUGE.items() for flag, flags in cases],
)
def test_a_run_too_big_for_the_memory_is_refused_in_one_line_before_anything_is_built(
    module, flag, flags, monkeypatch, tmp_path
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(training_run, "Run", lambda *a, **k: pytest.fail(f"--{flag}={flags[flag]} started a run"))
    monkeypatch.setattr(module, "make_env", lambda *a, **k: pytest.fail("an environment was built"))
    with pytest.raises(SystemExit) as refusal:
        module.main(module.Args(**flags))
    message = str(refusal.value.code)
    assert message.startswith(f"error: --{flag.replace('_', '-')}={flags[flag]}"), message
    assert " GB" in message and " GB are available; lower it" in message and "\n" not in message, message
    assert not (tmp_path / "runs").exists()


def test_the_sum_of_the_needs_is_refused_when_no_one_need_is_too_big(monkeypatch):
    needs = [("the replay", 6 * 10**9, ("buffer_size",)), ("an update's activations", 5 * 10**9, ("batch_size",))]
    monkeypatch.setattr(flag_checks, "available_memory_bytes", lambda: 10**10)
    with pytest.raises(SystemExit, match=r"^error: --buffer-size=\d+: the replay needs about 6.0 GB \(about 11.0 GB in all"):
        flag_checks.check_run_memory(iqn.Args(), needs)
    flag_checks.check_run_memory(iqn.Args(), needs[:1])  # each alone fits


def test_a_gpu_run_checks_its_networks_and_activations_against_the_gpus_free_memory(monkeypatch):
    import torch

    monkeypatch.setattr(flag_checks, "available_memory_bytes", lambda: 10**12)  # RAM is plenty
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *device: (2 * 10**9, 80 * 10**9))
    args = iqn.Args(hidden_size=10**4)  # about 2 GB of network copies and 0.9 GB of activations
    with pytest.raises(SystemExit, match=r"^error: --hidden-size=10000 .* GB are available on the GPU; lower it$"):
        iqn.validate_args(args)
    iqn.validate_args(replace(args, cuda=False))  # on the CPU, RAM holds them


# How each script builds its network at the sizes of `args` (obs_shape, num_actions), and how many float32 copies of
# its parameters a training run holds: the weights, their gradients and two Adam (or RAdam) moments, and the target
# network of every script but PQN's.
BUILD = {
    pqn: (lambda a, shape, n: pqn.QNetwork(shape, n), 4),
    pqn_atari_envpool: (lambda a, shape, n: pqn_atari_envpool.QNetwork(n), 4),
    pqn_atari_envpool_lstm: (lambda a, shape, n: pqn_atari_envpool_lstm.QNetwork(n), 4),
    dqn_dueling_per: (lambda a, shape, n: dqn_dueling_per.DuelingQNetwork(shape, n, a.hidden_size), 5),
    iqn: (lambda a, shape, n: iqn.QuantileNetwork(shape, n, a.quantile_embedding_dim, a.hidden_size), 5),
    iqn_atari: (lambda a, shape, n: iqn_atari.QuantileNetwork(n, a.quantile_embedding_dim, a.hidden_size), 5),
    r2d2: (lambda a, shape, n: r2d2.QNetwork(shape, n, a.lstm_size), 5),
    r2d2_atari: (lambda a, shape, n: r2d2_atari.QNetwork(a.frame_stack, n, a.lstm_size), 5),
    recurrent_iqn: (lambda a, shape, n: recurrent_iqn.QNetwork(shape, n, a), 5),
    recurrent_iqn_atari: (lambda a, shape, n: recurrent_iqn_atari.QNetwork(n, a), 5),
}
# (observation shape, dtype, number of actions) of the kinds of environment each script plays
VECTOR, GRID = ((4,), np.float32, 2), ((10, 10, 4), np.bool_, 6)
ATARI = {pqn_atari_envpool: (4, 84, 84), pqn_atari_envpool_lstm: (1, 84, 84), iqn_atari: (4, 84, 84)}
ATARI |= {r2d2_atari: (4, 84, 84), recurrent_iqn_atari: (1, 84, 84)}
ENVS = {module: [((shape, np.uint8, 6), {})] for module, shape in ATARI.items()}
ENVS |= {module: [(VECTOR, {}), (GRID, {})] for module in (pqn, iqn, r2d2, recurrent_iqn)}
ENVS[dqn_dueling_per] = [(VECTOR, {}), (GRID, {}), (((4, 84, 84), np.uint8, 6), {})]
ENVS[r2d2] += [(((2,), np.float32, 2), dict(mask_velocity=True))]
for module in (recurrent_iqn, recurrent_iqn_atari):  # the quantile embedding before the LSTM changes the network
    ENVS[module] += [(ENVS[module][0][0], dict(iqn_before_lstm=True))]


def network_need(module, args, shape, dtype, num_actions) -> int:
    """The bytes the script's memory estimate gives the network and its copies in a training run."""
    if module in (pqn, dqn_dueling_per, iqn, iqn_atari, r2d2_atari):
        needs = module.memory_needs(args, shape, num_actions)
    elif module in (pqn_atari_envpool, pqn_atari_envpool_lstm):
        needs = module.memory_needs(args, shape, dtype, num_actions)
    else:
        needs = module.memory_needs(args, shape, num_actions, dtype)
    (size,) = [size for what, size, _ in needs if what == "the network and its copies"]
    return size


@pytest.mark.parametrize(
    "module, env, flags",
    [pytest.param(m, env, flags, id=f"{name(m)}-{env[0]}-{flags}") for m, cases in ENVS.items() for env, flags in cases],
)
def test_the_network_estimate_covers_the_built_network_and_its_copies_and_is_not_far_above(module, env, flags):
    shape, dtype, num_actions = env
    args = module.Args(**{**tiny(module), **flags})
    build, copies = BUILD[module]
    network = build(args, shape, num_actions)
    actual = sum(p.numel() * p.element_size() for p in network.parameters())
    estimate = network_need(module, args, shape, dtype, num_actions)
    assert actual * copies <= estimate <= 10 * actual * copies, (estimate, actual, copies)


# A flag of each script's network sizes, and a value that makes the network itself too big for any machine.
HUGE_NETWORK = {
    dqn_dueling_per: ("hidden_size", 10**6),
    iqn: ("hidden_size", 10**6),
    iqn_atari: ("hidden_size", 10**8),
    r2d2: ("lstm_size", 10**6),
    r2d2_atari: ("lstm_size", 10**6),
    recurrent_iqn: ("lstm_size", 10**6),
    recurrent_iqn_atari: ("lstm_size", 10**6),
}


@pytest.mark.parametrize("module", list(HUGE_NETWORK), ids=name)
def test_eval_only_of_a_model_file_that_declares_a_huge_network_is_refused_before_building_it(module, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    flag, value = HUGE_NETWORK[module]
    path = str(tmp_path / "huge.cleanrl_model")
    # The weights are a stand-in: the evaluation must stop on the saved flags before it reads them into a network.
    model_files.save_weights(path, module.__file__, module.Args(**{flag: value}), nn.Linear(1, 1).state_dict())
    monkeypatch.setattr(module, "evaluate", lambda *a, **k: pytest.fail("the evaluation started"))
    monkeypatch.setattr(module, "make_env", lambda *a, **k: pytest.fail("an environment was built"))
    with pytest.raises(SystemExit) as refusal:
        module.main(module.Args(eval_only=True, model_path=path))
    message = str(refusal.value.code)
    named = f"error: --{flag.replace('_', '-')}={value}"
    assert message.startswith(named) and message[len(named)] in " :", message  # other sizes may follow it
    assert ": the network needs about " in message and "\n" not in message, message


@pytest.mark.parametrize("module", list(HUGE), ids=name)
def test_the_memory_check_passes_the_default_flags_with_32_gb_free_and_refuses_them_with_1_kb(module, monkeypatch):
    # Estimates far above the truth would refuse the documented runs: every default run fits a 32 GB machine.
    monkeypatch.setattr(flag_checks, "available_memory_bytes", lambda: 32 * 10**9)
    module.validate_args(module.Args(save_model=True))
    # and the check does run on these flags: the same run on a machine with 1 kB free is refused in one line.
    monkeypatch.setattr(flag_checks, "available_memory_bytes", lambda: 1000)
    with pytest.raises(SystemExit) as refused:
        module.validate_args(module.Args(save_model=True))
    assert str(refused.value).startswith("error: --") and "needs about" in str(refused.value)


# ---------------------------------------------------------------- rollouts and replays


@pytest.mark.parametrize("module", [pqn, pqn_atari_envpool, pqn_atari_envpool_lstm], ids=["mlp", "cnn", "lstm"])
def test_an_oversized_pqn_rollout_is_refused_before_envs_are_built(module, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(module, "make_env", lambda *a, **kw: pytest.fail("an env was built"))
    huge = 10**6
    with pytest.raises(SystemExit, match="--num-envs") as error:
        module.main(module.Args(num_envs=huge, num_steps=huge))
    assert "--num-steps" in str(error.value)
    assert not (tmp_path / "runs").exists()


def test_pqn_atari_rollout_memory_estimate_counts_observations():
    args = pqn_atari_envpool.Args(num_envs=8, num_steps=128)
    per_step = 4 * 84 * 84 + 8 + 4 + 4 + 4 + 1
    assert pqn_atari_envpool.rollout_memory_bytes(args, (4, 84, 84), np.uint8) == 8 * 128 * per_step


@pytest.mark.parametrize(
    "module, env_id",
    [(dqn_dueling_per, "CartPole-v1"), (dqn_dueling_per, "Breakout-v5"), (iqn, None), (iqn_atari, None)]
    + [(r2d2, None), (r2d2_atari, None), (recurrent_iqn, None), (recurrent_iqn_atari, None)],
    ids=lambda value: value if isinstance(value, str) else name(value) if value is not None else "",
)
def test_an_oversized_replay_is_refused_before_envs_are_built(module, env_id, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(module, "make_env", lambda *a, **k: pytest.fail("an environment was built"))
    flags = dict(buffer_size=10**12, cuda=False) | (dict(env_id=env_id) if env_id else {})
    with pytest.raises(
        SystemExit, match=r"^error: --buffer-size=1000000000000: the replay needs about [\d,.]+ GB (.* )?but [\d,.]+ GB are"
    ):
        module.main(module.Args(**flags))
    assert not (tmp_path / "runs").exists()


def test_dqn_dueling_per_replay_memory_estimate_matches_the_allocated_arrays():
    rb = dqn_dueling_per.PrioritizedReplayBuffer(37, (4,), np.float32, alpha=0.6)  # 37: the trees pad to 64 leaves
    window = dqn_dueling_per.NStepWindow(3, 2, (4,), np.float32, gamma=0.99)
    arrays = (
        rb.obs,
        rb.next_obs,
        rb.actions,
        rb.returns,
        rb.discounts,
        rb.sum_tree.nodes,
        rb.min_tree.nodes,
        window.obs,
        window.actions,
        window.rewards,
        window.length,
    )
    estimate = dqn_dueling_per.replay_memory_bytes(
        dqn_dueling_per.Args(buffer_size=37, n_step=3, num_envs=2), (4,), np.float32
    )
    assert estimate == sum(a.nbytes for a in arrays)  # Atari's replay: tests/test_dqn_dueling_per_atari.py


def test_iqn_replay_memory_estimate_matches_the_allocated_arrays():
    rng = np.random.default_rng(0)
    args = iqn.Args(buffer_size=1003, num_envs=4)  # 250 slots per environment: 1000 in all
    rb = iqn.ReplayBuffer(1003, 4, (4,), "cpu", rng)
    assert iqn.replay_memory_bytes(args, (4,)) == sum(getattr(rb, name).nbytes for name in rb.ARRAYS) == 1000 * 33
    args = iqn_atari.Args(buffer_size=1003, num_envs=4)
    rb = iqn_atari.ReplayBuffer(1003, 4, (84, 84), 4, "cpu", rng)
    assert iqn_atari.replay_memory_bytes(args, (84, 84)) == sum(getattr(rb, name).nbytes for name in rb.ARRAYS)


@pytest.mark.parametrize("module, obs_shape, dtype", [(r2d2, (2,), np.float32), (r2d2_atari, (84, 84), np.uint8)])
def test_r2d2_replay_memory_estimate_matches_the_allocation(module, obs_shape, dtype):
    args = module.Args(num_envs=3, buffer_size=3000, seq_len=6, burn_in=4, sequence_period=3, n_step=2, lstm_size=8)
    rb = module.SequenceReplay(args, obs_shape, dtype)
    allocated = sum(value.nbytes for value in vars(rb).values() if isinstance(value, np.ndarray))
    assert module.replay_memory_bytes(args, obs_shape, dtype) == allocated + rb.tree.nodes.nbytes


def test_recurrent_iqn_replay_memory_estimate_matches_the_allocation():
    args = recurrent_iqn.Args(**tiny("recurrent_iqn", buffer_size=4000, prioritized_replay=True))
    rb = recurrent_iqn.SequenceReplay(args, (2,), np.float32, args.lstm_size, torch.device("cpu"))
    allocated = sum(getattr(rb, key).nbytes for key in rb.ARRAYS) + rb.state.nbytes + rb.priorities.nodes.nbytes
    assert recurrent_iqn.replay_memory_bytes(args, (2,), np.float32) == allocated
