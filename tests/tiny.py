"""The tiny runs the tests train: `tiny("iqn")` is the flags of cleanrl/iqn.py's tiny run, for `iqn.Args(**...)`.

A test that needs another size says so at its call site, with the flags it changes:
`tiny("iqn", total_timesteps=1000, checkpoint_replay=True)`. A flag left out of a run is at the script's default,
and a flag a script gets from Python at its default value counts as not given (command_line.flags_given).

Three kinds of run, each a table of the same scripts:

- `TINY`, what `tiny(script)` gives: the run of the checkpoint and resume tests, which learns (a few updates at
  least) before and after an interruption: small networks, learning from step 100-300, a few thousand CartPole steps
  or a few hundred Atari frames.
- `SHORT`, `tiny(script, short=True)`: a few hundred steps with a network size other than the default, for the
  tests of what a run prints and saves (an --eval-only evaluation has to rebuild the network from the model file).
- `MINATAR`, what `tiny(script, env_id="MinAtar/...")` gives: a run on a MinAtar game, where every flag not given
  comes from the script's MINATAR_DEFAULTS: the sizes alone.
- `ATARI`, `tiny(script, atari=True)`: the tiny Atari run of a script that plays both vector and Atari games (for
  the scripts of Atari alone, `TINY` holds it).
"""

from types import ModuleType

TINY = {
    "pqn": dict(total_timesteps=2048, num_envs=4, num_steps=16, num_minibatches=2, update_epochs=2),
    "pqn_atari_envpool": dict(total_timesteps=256, num_envs=4, num_steps=32, num_minibatches=2, update_epochs=1),
    "pqn_atari_envpool_lstm": dict(total_timesteps=256, num_envs=4, num_steps=32, num_minibatches=2, update_epochs=1),
    "dqn_dueling_per": dict(
        total_timesteps=2000,
        num_envs=4,
        hidden_size=16,
        buffer_size=1000,
        batch_size=32,
        learning_starts=200,
        train_frequency=4,
        target_network_frequency=100,
    ),
    "iqn": dict(
        total_timesteps=2000,
        num_envs=4,
        learning_starts=200,
        buffer_size=2000,
        batch_size=32,
        hidden_size=16,
        quantile_embedding_dim=16,
        num_quantile_samples=8,
        target_network_frequency=100,
        exploration_fraction=0.5,
        cuda=False,
    ),
    "iqn_atari": dict(
        total_timesteps=240,
        num_envs=2,
        learning_starts=160,
        buffer_size=400,
        batch_size=4,
        num_tau_samples=8,
        num_tau_prime_samples=8,
        num_quantile_samples=8,
        hidden_size=32,
        target_network_frequency=40,
        exploration_fraction=0.4,
        eval_episodes=0,
        cuda=False,
    ),
    "r2d2": dict(
        total_timesteps=2000,
        num_envs=4,
        learning_starts=300,
        buffer_size=2000,
        batch_size=8,
        seq_len=6,
        burn_in=4,
        sequence_period=6,
        n_step=3,
        lstm_size=16,
        replay_ratio=4.0,
        target_update_period=5,
        log_interval=5,
        mask_velocity=True,
        cuda=False,
    ),
    "r2d2_atari": dict(
        env_id="Pong-v5",
        total_timesteps=320,
        num_envs=2,
        learning_starts=100,
        buffer_size=2000,
        batch_size=4,
        seq_len=4,
        burn_in=4,
        sequence_period=4,
        n_step=2,
        lstm_size=32,
        replay_ratio=1.0,
        target_update_period=2,
        log_interval=2,
        cuda=False,
    ),
}
_RECURRENT_IQN = dict(
    lstm_size=8,
    hidden_size=8,
    quantile_embedding_dim=6,
    num_tau_samples=3,
    num_tau_prime_samples=3,
    num_quantile_samples=3,
    cuda=False,
    num_envs=4,
    buffer_size=400,
    seq_len=6,
    batch_size=4,
    learning_starts=160,
    target_network_frequency=160,
    log_interval=2,
    burn_in=2,
)
TINY["recurrent_iqn"] = dict(_RECURRENT_IQN, total_timesteps=2000)
TINY["recurrent_iqn_atari"] = dict(_RECURRENT_IQN, total_timesteps=400, max_episode_steps=80)  # every env ends games

SHORT = {
    "pqn": dict(total_timesteps=512, num_envs=4, num_steps=32),
    "pqn_atari_envpool": dict(total_timesteps=256, num_envs=4, num_steps=32, num_minibatches=2, update_epochs=1),
    "pqn_atari_envpool_lstm": dict(total_timesteps=256, num_envs=4, num_steps=32, num_minibatches=2, update_epochs=1),
    "dqn_dueling_per": dict(
        total_timesteps=600, num_envs=4, hidden_size=16, buffer_size=1000, batch_size=32, learning_starts=200
    ),
    "iqn": dict(total_timesteps=800, num_envs=2, learning_starts=200, buffer_size=400, batch_size=16, hidden_size=32),
    "iqn_atari": dict(
        total_timesteps=240,
        num_envs=2,
        learning_starts=160,
        buffer_size=400,
        batch_size=4,
        hidden_size=32,
        num_tau_samples=8,
        num_tau_prime_samples=8,
        num_quantile_samples=8,
    ),
    "r2d2": dict(
        total_timesteps=1200,
        num_envs=4,
        learning_starts=500,
        buffer_size=4000,
        batch_size=8,
        seq_len=6,
        burn_in=4,
        sequence_period=6,
        n_step=3,
        lstm_size=16,
        replay_ratio=2.0,
    ),
    "r2d2_atari": dict(
        total_timesteps=480,
        num_envs=2,
        learning_starts=200,
        buffer_size=2000,
        batch_size=4,
        seq_len=4,
        burn_in=4,
        sequence_period=4,
        n_step=2,
        lstm_size=32,
        replay_ratio=2.0,
    ),
    "recurrent_iqn": dict(
        total_timesteps=400,
        num_envs=4,
        buffer_size=400,
        seq_len=6,
        batch_size=4,
        learning_starts=160,
        burn_in=0,
        lstm_size=8,
        hidden_size=8,
        quantile_embedding_dim=6,
    ),
}
SHORT["recurrent_iqn_atari"] = dict(SHORT["recurrent_iqn"], max_episode_steps=80)

MINATAR = {  # a few thousand steps with learning in them
    "pqn": dict(total_timesteps=2048, num_envs=8, num_steps=32, num_minibatches=4, update_epochs=1),
    "dqn_dueling_per": dict(total_timesteps=1200, num_envs=4, learning_starts=400, batch_size=32, train_frequency=4),
    "iqn": dict(total_timesteps=1200, num_envs=4, learning_starts=400, batch_size=32, buffer_size=4000),
    "r2d2": dict(total_timesteps=1600, num_envs=4, learning_starts=400, buffer_size=4000, batch_size=8, log_interval=1),
    "recurrent_iqn": dict(
        total_timesteps=1600, num_envs=4, learning_starts=400, buffer_size=4000, batch_size=8, log_interval=1
    ),
}


ATARI = {
    # Breakout with rings of 32 frames for 2 envs, learning from step 16 (the CNN's sizes are fixed); the other flags
    # from the Atari configuration.
    "dqn_dueling_per": dict(
        env_id="Breakout-v5",
        total_timesteps=96,
        num_envs=2,
        buffer_size=64,
        batch_size=4,
        learning_starts=16,
        train_frequency=2,
        target_network_frequency=16,
    ),
}


def tiny(script: str | ModuleType, *, short: bool = False, atari: bool = False, **overrides) -> dict:
    """The flags of `script`'s tiny run (a name such as "iqn", or the imported module), with `overrides` on top: from
    `SHORT` with short=True, from `ATARI` with atari=True, from `MINATAR` when overrides name a MinAtar env_id, from
    `TINY` otherwise."""
    name = script if isinstance(script, str) else script.__name__.rsplit(".", 1)[-1]
    if atari:
        table = ATARI
    elif str(overrides.get("env_id", "")).startswith("MinAtar/"):
        table = MINATAR
    else:
        table = SHORT if short else TINY
    return {**table[name], **overrides}
