"""Recurrent IQN for vector observations: R2D2's recurrent model and sequence replay combined with IQN's implicit
quantile head, n-step double-Q targets and a dueling output.

The same algorithm as recurrent_iqn_atari.py with an MLP torso, for classic control (by default CartPole with the
velocities hidden, a partially observed task that needs the LSTM's memory) and MinAtar: only the environment, the
torso and the defaults differ. Papers: Dabney et al. 2018 (IQN, arXiv:1806.06923), Kapturowski et al. 2019 (R2D2),
Hessel et al. 2018 (Rainbow); the algorithm follows the article "Fast Sample Efficient Q-Learning With Recurrent IQN"
(RLtime). Docs: docs/rl-algorithms/recurrent_iqn.md
"""

import cleanrl_q_utils.quiet_start  # noqa: F401  (first: a signal while torch loads exits quietly)

import copy
import os
import time
from dataclasses import dataclass
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from cleanrl_q_utils import (
    checkpoint_files,
    classic_control,
    command_line,
    environments,
    episode_scores,
    flag_checks,
    flag_errors,
    minatar,
    model_files,
    training_run,
)
from cleanrl_q_utils.lstm_unroll import segment_bounds, unroll_lstm, unroll_lstm_merged
from cleanrl_q_utils.segment_tree import SegmentTree

envpool = classic_control.import_envpool()  # None off Linux (it has Linux wheels only): classic control is gymnasium's

# The layout of checkpoint.pt, which a resume checks; 3: replay windows with the burn-in before them; the IQN-before-LSTM layer
CHECKPOINT_FORMAT = 3
# Evaluation environments are seeded --seed + EVAL_SEED_OFFSET. The training envs take seeds --seed .. --seed + num_envs - 1,
# so evaluation must not start there (it would replay their first games), nor at another run's training seeds: with
# the seeds runs use (1-10 or so) and up to ~990 envs, --seed + 1000 lies past every one of them.
EVAL_SEED_OFFSET = 1000


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda will be used when available"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "cleanrl-q"
    """the wandb's project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """if toggled, record videos of the evaluation episodes to `runs/<run_name>/videos/` (needs the `video` extra)"""
    save_model: bool = False
    """if toggled, save the final model to `runs/<run_name>/` and evaluate it"""
    eval_episodes: int = 10
    """the number of episodes the model is evaluated on (after `--save-model`, or with `--eval-only`)"""
    eval_only: bool = False
    """evaluate the model at --model-path instead of training (with --capture-video: record it)"""
    model_path: Optional[str] = None
    """a model file written by --save-model, for --eval-only"""

    env_id: str = "CartPole-v1"  # classic control, or MinAtar (MinAtar/Breakout-v0)
    """the id of the environment"""
    total_timesteps: int = 450_000
    """the total number of agent steps of the experiment, summed over all environments"""
    mask_velocity: bool = True
    """if toggled, hide CartPole's velocities (observe cart position and pole angle only): a memory task"""
    num_envs: int = 16  # one actor epsilon each
    """the number of parallel environments"""
    buffer_size: int = 300_000  # each frame is stored once; 300k: the last two thirds of a default run
    """the replay capacity in transitions, summed over all environments"""
    seq_len: int = 20
    """the number of trained steps of a replayed sequence, after its burn-in prefix"""
    batch_size: int = 32
    """the number of sequences per gradient update"""
    replay_ratio: float = 8.0  # 32x20 trained steps a batch: one update per 80 steps
    """the average number of times each collected step is replayed as a trained (non burn-in) step"""
    burn_in: int = 10
    """the steps before a sequence's trained steps that only warm up its stored LSTM state (no loss, no gradient; 0: off)"""
    n_step: int = 5
    """the number of steps of the n-step return"""
    gamma: float = 0.99
    """the discount factor gamma"""
    learning_rate: float = 5e-4
    """the learning rate of the optimizer"""
    anneal_lr: bool = True
    """if toggled, anneal the learning rate linearly to zero over training"""
    adam_eps: float = 1e-5
    """the epsilon of the Adam optimizer"""
    max_grad_norm: float = 40.0
    """the global norm the gradients are clipped to"""
    target_network_frequency: int = 2_000
    """the number of agent steps (summed over all environments) between copies of the online network into the target network"""
    learning_starts: int = 2_000
    """the number of agent steps collected before learning starts"""
    lstm_size: int = 128
    """the size of the LSTM state"""
    hidden_size: int = 128
    """the width of the MLP torso and of the hidden layers of the advantage and value branches"""
    num_tau_samples: int = 8
    """N: the number of quantile samples of the online network in the loss"""
    num_tau_prime_samples: int = 8
    """N': the number of quantile samples of the target network in the loss"""
    num_quantile_samples: int = 8  # when acting and in the double-Q target
    """K: the number of quantile samples whose mean gives the Q-values that pick actions"""
    quantile_embedding_dim: int = 64
    """the number of cosine features cos(pi i tau), i = 1..dim, of the quantile embedding"""
    kappa: float = 1.0
    """the threshold of the Huber loss inside the quantile loss"""
    iqn_before_lstm: bool = False
    """place the IQN layer before the LSTM (state repeated per quantile sample, merged by the mean: --lstm-state-merge)"""
    lstm_state_merge: str = "step"  # the article's two ways; RLtime's 'inner' (its default) and 'outer'
    """with --iqn-before-lstm, when the quantile samples' LSTM states merge by their mean: 'step' (after every step,
    repeated again for the next) or 'sequence' (repeated at the start of an unroll, each carried alone, merged at its end)"""
    start_e: float = 1.0  # CartPole needs random play first
    """the base of the per-actor epsilons at the start"""
    end_e: float = 0.01
    """the base of the per-actor epsilons at the end of its decay"""
    min_epsilon: Optional[float] = None  # R2D2's fixed epsilons: --start-e 0.4 --end-e 0.4 --min-epsilon 0
    """the floor of every actor's epsilon (None: `end_e`, so after the decay every actor plays at `end_e`)"""
    exploration_fraction: float = 0.3333  # 150k of the default 450k steps
    """the fraction of `total_timesteps` over which the epsilon schedule goes linearly from `start_e` to `end_e` (0: `end_e`
    from the first step)"""
    epsilon_alpha: float = 7.0
    """the exponent range alpha of the per-actor epsilons: actor i explores with base^(1 + alpha i / (num_envs - 1))"""
    eval_epsilon: float = 0.001
    """the epsilon of the evaluation episodes"""
    prioritized_replay: bool = False
    """R2D2-style prioritized sequence replay (off: uniform, as in the article's results)"""
    priority_eta: float = 0.9  # per step: the mean absolute TD error over the quantile samples
    """the mix of a sequence's priority: eta * max_t + (1 - eta) * mean_t of its absolute TD errors"""
    prioritized_replay_alpha: float = 0.9
    """the priority exponent alpha of prioritized replay"""
    prioritized_replay_beta: float = 0.6  # constant
    """the importance-sampling exponent beta of prioritized replay"""
    value_rescaling: bool = True
    """if toggled, apply the value rescaling h(x) = sign(x)(sqrt(|x|+1)-1) + 1e-3 x to the targets"""
    max_episode_steps: int = 500  # CartPole-v1: 500
    """the episode cap in agent steps"""
    log_interval: int = 100  # keeps device syncs out of the hot loop
    """the number of learner updates between loss logs"""
    checkpoint_every: int = 0
    """write a resumable checkpoint every this many agent steps and at the end (0: only when a signal stops the run)"""
    checkpoint_replay: bool = False
    """also store the replay buffer in checkpoints (large, but the resumed run is then exact)"""
    resume: Optional[str] = None
    """continue the run saved in this checkpoint, in the same run directory (and W&B run)"""
    resume_fresh_envs: bool = False
    """with --resume: start new games instead of replaying every logged action (cost independent of the run's length;
    the games in progress are dropped, so the run is not bit-identical)"""


# The configuration of a MinAtar id (flags given on the command line win). Its target period, learning rate and
# exploration come from runs of 2M steps (the docs' MinAtar section); the replay size and start of learning are not tuned.
# It keeps the script's replay ratio of 8: at R2D2's 4 a step costs what R2D2's does, and Breakout ended at a third.
# MinAtar has no step cap of its own: Atari's, 27,000 steps, caps a game here (and scales the timestep input).
MINATAR_DEFAULTS = dict(
    total_timesteps=5_000_000,  # the feed-forward scripts' MinAtar budget (Young & Tian's)
    mask_velocity=False,  # the CartPole memory task, on by default
    max_episode_steps=27_000,
    buffer_size=200_000,
    learning_starts=20_000,
    learning_rate=1e-3,  # R2D2's; ends above 2.5e-4 on each seed of Breakout and Space Invaders (seeds 1-3)
    target_network_frequency=20_000,  # agent steps (250 updates), the article's; every 3 updates did no better
    exploration_fraction=2 / 15,  # 667k steps, as in those runs; ended at 100k it cost Breakout (docs' MinAtar section)
)


def validate_args(args) -> list:
    flag_checks.check_common_flags(args)
    if args.lstm_state_merge not in ("step", "sequence"):
        flag_errors.flag_error("lstm_state_merge", args.lstm_state_merge, "step or sequence")
    if args.lstm_state_merge != "step" and not args.iqn_before_lstm:
        flag_errors.flag_error(
            "lstm_state_merge",
            args.lstm_state_merge,
            "only with --iqn-before-lstm (after the LSTM one state per sequence, nothing to merge)",
        )
    spec = flag_checks.check_env_id(args.env_id, atari=False)  # MinAtar's grids are not Atari's frames
    space = spec.observation_space
    if args.mask_velocity and not args.env_id.startswith("CartPole"):
        flag_errors.flag_error("mask_velocity", True, f"only defined for CartPole, not --env-id={args.env_id}")
    two_windows = 2 * (args.burn_in + args.seq_len + args.n_step) * args.num_envs
    if args.buffer_size < two_windows:
        rule = f"must hold two windows of --burn-in + --seq-len + --n-step steps per environment ({two_windows})"
        flag_errors.flag_error("buffer_size", args.buffer_size, rule)
    obs_shape = (2,) if args.mask_velocity else space.shape
    return flag_checks.check_run_memory(args, memory_needs(args, obs_shape, spec.action_space.n, space.dtype))


def network_sizes(args, obs_shape, num_actions) -> tuple[int, int, int]:
    """(parameters, floats of every layer output per step of a sequence, and per quantile level of a step) of
    QNetwork, counted from its layers."""
    linear, inputs = flag_checks.linear_parameters, int(np.prod(obs_shape))
    if len(obs_shape) == 3:  # MinAtar grid
        grid, torso_size = 16 * (obs_shape[0] - 2) * (obs_shape[1] - 2), 128
        parameters = flag_checks.conv_parameters(obs_shape[2], 16, 3) + linear(grid, torso_size)
        per_step = 2 * inputs + 2 * grid + 2 * torso_size
    else:
        torso_size = args.hidden_size
        parameters, per_step = linear(inputs, torso_size), inputs + 2 * torso_size
    lstm_inputs = torso_size + num_actions + 2
    embedded = lstm_inputs if args.iqn_before_lstm else args.lstm_size
    branches = 2 * linear(args.lstm_size, args.hidden_size) + linear(args.hidden_size, num_actions)
    branches += linear(args.hidden_size, 1)
    parameters += flag_checks.lstm_parameters(lstm_inputs, args.lstm_size) + linear(args.quantile_embedding_dim, embedded)
    parameters += args.quantile_embedding_dim + branches  # the cosine frequencies, a buffer saved with the weights
    per_step += 2 * lstm_inputs + 7 * args.lstm_size  # the LSTM's input, four gates, state and output
    per_level = args.quantile_embedding_dim + 2 * embedded + args.lstm_size + 4 * args.hidden_size + 3 * num_actions + 1
    if args.iqn_before_lstm:  # the LSTM runs once per quantile level
        per_level += lstm_inputs + 7 * args.lstm_size
    return parameters, per_step, per_level


def memory_needs(args, obs_shape, num_actions, obs_dtype) -> list:
    """What a run allocates in proportion to its flags, for `flag_checks.check_run_memory`: the replay, the network
    with its target, gradients and two Adam moments, an update's activations (the differentiated unroll over the
    trained and n-step positions at N levels, the target and selection passes over the window at N' and K levels, the
    loss's N x N' pairs), the environments (evaluation plays up to 32)."""
    parameters, per_step, per_level = network_sizes(args, obs_shape, num_actions)
    network_flags = ("lstm_size", "hidden_size", "quantile_embedding_dim")
    acting = per_step + args.num_quantile_samples * per_level
    evaluation_envs = min(args.eval_episodes, 32)
    needs = flag_checks.common_needs(args, parameters, 5, network_flags, evaluation_envs, acting)
    if args.eval_only:
        return needs
    N, N_prime, K = args.num_tau_samples, args.num_tau_prime_samples, args.num_quantile_samples
    trained, window = args.seq_len + args.n_step, args.burn_in + args.seq_len + args.n_step
    per_sequence = trained * (per_step + N * per_level) + window * (N_prime + K) * per_level + 6 * args.seq_len * N * N_prime
    update = flag_checks.activation_memory_bytes(args.batch_size, per_sequence)
    flags = ("batch_size", "seq_len", "num_tau_samples", "num_tau_prime_samples", "num_quantile_samples", "burn_in")
    update_need = ("an update's activations", update, flags + ("n_step",) + network_flags)
    return needs + [("the replay", replay_memory_bytes(args, obs_shape, obs_dtype), ("buffer_size",)), update_need]


def make_env(env_id, num_envs, seed, mask_velocity, max_episode_steps):
    if minatar.is_minatar(env_id):  # the step cap, gymnasium's TimeLimit, also scales the timestep input
        return minatar.make_envs(env_id, num_envs, seed, max_episode_steps)
    if envpool is None:  # stepped as envpool steps, NEXT_STEP autoreset included
        envs = classic_control.make_envs(env_id, num_envs, seed, max_episode_steps)
    else:
        envs = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, max_episode_steps=max_episode_steps)
    return hide_velocity(envs) if mask_velocity else envs


def hide_velocity(env):
    """CartPole observing only the cart position and the pole angle (an envpool pool or one gymnasium env): the
    velocities must be inferred from the history, so the task needs memory."""
    space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    masked = gym.wrappers.TransformObservation(env, lambda obs: obs[..., [0, 2]], space)
    masked.single_observation_space, masked.single_action_space = space, env.action_space  # as a pool of envs has them
    return masked


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def unroll_lstm_per_sample(lstm, x, state, keep, bounds):
    """x (T, B, K, D): the state (B, H) is repeated for the K quantile samples once, before the first step; each
    sample then carries its own state through the unroll (zeroed where keep is 0), and the K states are merged by
    the mean only after the last step (RLtime's 'outer' mode). -> (T, B, K, H), state (B, H)."""
    T, B, K = x.shape[:3]
    repeated = tuple(s.repeat_interleave(K, 0) for s in state)  # row b * K + k: sample k of sequence b
    out, (h, c) = unroll_lstm(lstm, x.flatten(1, 2), repeated, keep.repeat_interleave(K, 1), bounds)
    return out.view(T, B, K, -1), (h.view(B, K, -1).mean(1), c.view(B, K, -1).mean(1))


class QNetwork(nn.Module):
    """Torso -> [features, one-hot last action, last reward, timestep] -> LSTM -> IQN layer -> dueling. The torso of a
    vector is one dense layer of `hidden_size` units; of MinAtar's (10, 10, C) grid, Young & Tian's convolution of 16
    filters 3x3 and 128 units. With `iqn_before_lstm` the quantile embedding modulates the whole LSTM input instead (as
    in RLtime); the LSTM then runs once per quantile sample, their states merged by the mean after every step or at the
    end (`lstm_state_merge`)."""

    def __init__(self, obs_shape, num_actions, args):
        super().__init__()
        self.num_actions, self.iqn_before_lstm, self.is_grid = num_actions, args.iqn_before_lstm, len(obs_shape) == 3
        self.lstm_state_merge = args.lstm_state_merge
        if self.is_grid:
            height, width, channels = obs_shape
            torso_size = 128
            self.torso_name = f"convolutional (16 filters 3x3, 128 units) for {height}x{width}x{channels} grids"
            conv = [layer_init(nn.Conv2d(channels, 16, 3)), nn.ReLU(), nn.Flatten()]
            self.torso = nn.Sequential(*conv, layer_init(nn.Linear(16 * (height - 2) * (width - 2), torso_size)), nn.ReLU())
        else:
            torso_size, self.torso_name = args.hidden_size, f"MLP of {args.hidden_size} units for vectors of {obs_shape[0]}"
            self.torso = nn.Sequential(layer_init(nn.Linear(obs_shape[0], torso_size)), nn.ReLU())
        self.lstm = nn.LSTM(torso_size + num_actions + 2, args.lstm_size)
        for name, param in self.lstm.named_parameters():
            nn.init.orthogonal_(param) if "weight" in name else nn.init.constant_(param, 0.0)
        embedded_size = torso_size + num_actions + 2 if args.iqn_before_lstm else args.lstm_size
        self.quantile_embedding = nn.Sequential(layer_init(nn.Linear(args.quantile_embedding_dim, embedded_size)), nn.ReLU())
        self.register_buffer("cosine_frequencies", torch.arange(1, args.quantile_embedding_dim + 1) * np.pi)

        def branch(outputs, std):  # modulated LSTM features -> hidden layer -> outputs
            hidden = layer_init(nn.Linear(args.lstm_size, args.hidden_size))
            return nn.Sequential(hidden, nn.ReLU(), layer_init(nn.Linear(args.hidden_size, outputs), std=std))

        self.advantage, self.value = branch(num_actions, 0.01), branch(1, 1.0)

    def embed(self, taus):
        """taus (..., K) -> phi(tau) (..., K, embedded_size)."""
        return self.quantile_embedding(torch.cos(taus.unsqueeze(-1) * self.cosine_frequencies))

    def head(self, features, taus):
        """LSTM features (T, B, H) or (T, B, K, H) and taus (T, B, K) -> quantiles (T, B, K, A)."""
        if not self.iqn_before_lstm:
            features = features.unsqueeze(2) * self.embed(taus)
        advantage = self.advantage(features)
        return self.value(features) + advantage - advantage.mean(-1, keepdim=True)

    def core(self, obs, last_action, last_reward, timestep, is_first, state, taus=None, bounds=None):
        """Observations (T, B, obs_size) and extras (T, B) -> LSTM features, final state. `is_first` (T, B) zeroes the
        state before the first frame of an episode; `bounds` (host ints) are the steps where any sequence starts one,
        so the LSTM runs in one call between them."""
        T, B = obs.shape[:2]
        obs = obs.reshape(T * B, *obs.shape[2:])
        x = self.torso(obs.permute(0, 3, 1, 2).float() if self.is_grid else obs).view(T, B, -1)
        last_action = F.one_hot(last_action.long() + 1, self.num_actions + 1)[..., 1:].float()  # -1 -> zeros
        x = torch.cat([x, last_action, last_reward.unsqueeze(-1), timestep.unsqueeze(-1)], -1)
        keep = (~is_first).unsqueeze(-1).float()
        bounds = [0, T] if bounds is None else bounds
        if self.iqn_before_lstm and self.lstm_state_merge == "sequence":
            return unroll_lstm_per_sample(self.lstm, x.unsqueeze(2) * self.embed(taus), state, keep, bounds)
        if self.iqn_before_lstm:
            return unroll_lstm_merged(self.lstm, x.unsqueeze(2) * self.embed(taus), state, keep)
        return unroll_lstm(self.lstm, x, state, keep, bounds)

    def forward(self, obs, last_action, last_reward, timestep, is_first, state, taus, bounds=None):
        features, state = self.core(obs, last_action, last_reward, timestep, is_first, state, taus, bounds)
        return self.head(features, taus), state


class SequenceReplay:
    """Per-environment step streams in a ring. Window k trains the `seq_len` slots from k * seq_len; the `burn_in` slots
    before them warm up the recurrent state stored when the first of them was acted, and the `n_step` slots after them
    complete the targets. Windows overlap by burn-in and tail, so every step is trained once, but for those of the first
    windows, whose burn-in would begin before the stream. Slot t holds the observation o_t and what the agent fed with
    it (last action, last clipped reward, timestep, is_first), the action a_t, the reward r_t and the end flags of that
    step, and whether the step from o_t was envpool's reset step (its action was ignored; never trained on)."""

    ARRAYS = "obs last_action last_reward timestep is_first action reward is_reset_step terminated truncated".split()

    def __init__(self, args, obs_shape, obs_dtype, state_size, device):
        self.seq_len, self.burn_in, self.window = args.seq_len, args.burn_in, args.burn_in + args.seq_len + args.n_step
        self.capacity = args.buffer_size // args.num_envs // args.seq_len * args.seq_len  # per environment
        self.num_windows = self.capacity // args.seq_len
        N, C = args.num_envs, self.capacity
        self.obs = np.zeros((N, C, *obs_shape), dtype=obs_dtype)
        self.last_action, self.action = np.zeros((N, C), dtype=np.int16), np.zeros((N, C), dtype=np.int16)
        self.last_reward, self.reward, self.timestep = (np.zeros((N, C), dtype=np.float32) for _ in range(3))
        self.is_first, self.is_reset_step, self.terminated, self.truncated = (np.zeros((N, C), dtype=bool) for _ in range(4))
        self.state = torch.zeros((N, self.num_windows, 2, state_size), device=device)
        self.pos = 0  # steps written per environment
        self.priorities = SegmentTree(N * self.num_windows) if args.prioritized_replay else None
        self.max_priority = 1.0

    def add(self, state, **fields):
        """Writes one step of every environment; `state` (h, c) is the state before o_t (kept where a burn-in starts)."""
        slot = self.pos % self.capacity
        if (slot + self.burn_in) % self.seq_len == 0:
            window = (slot + self.burn_in) // self.seq_len % self.num_windows
            self.state[:, window] = torch.stack(state, 1)
            if self.priorities is not None:  # the old window here is being overwritten
                self.priorities.update(self.window_ids(window), 0.0)
        for key, value in fields.items():
            getattr(self, key)[:, slot] = value
        self.pos += 1
        done = self.pos - self.window + self.burn_in  # first trained slot of the window that just became complete
        if self.priorities is not None and done >= self.burn_in and done % self.seq_len == 0:
            self.priorities.update(self.window_ids(done % self.capacity // self.seq_len), self.max_priority)

    def window_ids(self, window):
        return np.arange(self.obs.shape[0]) * self.num_windows + window

    def valid_windows(self):
        """The first and last window number whose slots are all written and none overwritten."""
        oldest = max(0, self.pos - self.capacity) + self.burn_in  # the earliest first trained slot
        return -(-oldest // self.seq_len), (self.pos - self.window + self.burn_in) // self.seq_len

    def num_valid(self):
        first, last = self.valid_windows()
        return self.obs.shape[0] * (last - first + 1)

    def sample(self, batch_size):
        """-> (numpy dict of (T, B) arrays, stored states, window ids, sampling probabilities or None)."""
        if self.priorities is None:
            first, last = self.valid_windows()
            windows = np.random.randint(first, last + 1, batch_size) % self.num_windows
            envs = np.random.randint(0, self.obs.shape[0], batch_size)
            ids, probs = envs * self.num_windows + windows, None
        else:
            total = self.priorities.root
            mass = (np.arange(batch_size) + np.random.rand(batch_size)) * total / batch_size  # one in each equal segment
            ids = self.priorities.find_prefix_sum(np.minimum(mass, np.nextafter(total, 0)))
            probs = self.priorities.leaves(ids) / total
            envs, windows = ids // self.num_windows, ids % self.num_windows
        slots = (windows[None] * self.seq_len - self.burn_in + np.arange(self.window)[:, None]) % self.capacity  # (T, B)
        batch = {key: getattr(self, key)[envs[None], slots] for key in self.ARRAYS}
        state = self.state[torch.from_numpy(envs), torch.from_numpy(windows)]
        return batch, (state[:, 0], state[:, 1]), ids, probs

    def update_priorities(self, ids, priorities):
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.priorities.update(ids, priorities)

    def state_dict(self):
        # Tensors sharing the arrays' memory: torch.save writes them without a pickled copy of the whole buffer.
        arrays = {key: torch.from_numpy(getattr(self, key)) for key in self.ARRAYS}
        tree = None if self.priorities is None else self.priorities.nodes
        return dict(arrays, state=self.state, pos=self.pos, max_priority=self.max_priority, priorities=tree)

    def load_state_dict(self, saved):
        for key in self.ARRAYS:
            setattr(self, key, saved[key].numpy())
        self.state = saved["state"].to(self.state.device)
        self.pos, self.max_priority = saved["pos"], saved["max_priority"]
        if self.priorities is not None:
            self.priorities.nodes = saved["priorities"]


def replay_memory_bytes(args, obs_shape, obs_dtype):
    """The bytes SequenceReplay allocates for these flags: the slots of every stream, the stored states of every window
    and the sum tree (a Python-int count, so absurd sizes do not overflow)."""
    capacity = args.buffer_size // args.num_envs // args.seq_len * args.seq_len
    slot = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize + 2 * 2 + 3 * 4 + 4  # int16 x2, float32 x3, bool x4
    windows = args.num_envs * (capacity // args.seq_len)
    tree = 2 * 8 * (1 << max(windows - 1, 1).bit_length()) if args.prioritized_replay else 0
    return args.num_envs * capacity * slot + windows * 2 * args.lstm_size * 4 + tree


def n_step_targets(reward, terminated, truncated, gamma, n):
    """Multi-step returns that stop at episode ends, for the first T - n slots of a window.

    reward, terminated, truncated: (T, B). Returns (returns, discounts, bootstrap), each (T - n, B):
    target_t = returns_t + discounts_t * Z(o_{bootstrap_t}), bootstrap_t in [t+1, t+n]. An episode that ends
    at step t+k stops the sum there; a time-out bootstraps from its final observation o_{t+k+1}, a
    termination has discount 0."""
    T = reward.shape[0] - n
    returns, discounts = torch.zeros_like(reward[:T]), torch.ones_like(reward[:T])
    bootstrap = torch.arange(1, T + 1, device=reward.device).unsqueeze(1).expand_as(returns).clone()
    running = torch.ones_like(reward[:T], dtype=torch.bool)  # the episode has not ended before step t+k
    for k in range(n):
        returns += running * discounts * reward[k : k + T]
        discounts = torch.where(running, discounts * gamma, discounts)
        ended = running & (terminated[k : k + T] | truncated[k : k + T])
        discounts = torch.where(ended & terminated[k : k + T], 0.0, discounts)
        bootstrap += (running & ~ended & (k + 1 < n)).long()
        running = running & ~ended
    return returns, discounts, bootstrap


def quantile_huber_loss(quantiles, taus, target_quantiles, kappa=1.0):
    """quantiles (B, N) at fractions taus (B, N), target_quantiles (B, N') -> loss per sample (B,):
    sum over i of the mean over j of |tau_i - 1{delta_ij < 0}| Huber_kappa(delta_ij) / kappa,
    delta_ij = target_j - quantile_i."""
    delta = target_quantiles.unsqueeze(1) - quantiles.unsqueeze(2)  # (B, N, N')
    huber = torch.where(delta.abs() <= kappa, 0.5 * delta**2, kappa * (delta.abs() - 0.5 * kappa))
    weight = (taus.unsqueeze(2) - (delta.detach() < 0).float()).abs()
    return (weight * huber / kappa).mean(2).sum(1)


def value_rescale(x, eps=1e-3):
    return torch.sign(x) * (torch.sqrt(x.abs() + 1) - 1) + eps * x


def inverse_value_rescale(x, eps=1e-3):
    return torch.sign(x) * ((2 * (x.abs() + 1 + eps) / (1 + torch.sqrt(1 + 4 * eps * (x.abs() + 1 + eps)))) ** 2 - 1)


def linear_schedule(start: float, end: float, duration: float, t):
    """Linear from `start` at agent step 0 to `end` at step `duration`, then `end`; a `duration` of 0 is `end` from the
    first step. `t` is a step or an array of steps; the result (float64) has its shape."""
    t = np.asarray(t, dtype=np.float64)
    value = start + (end - start) * t / duration if duration > 0 else np.full_like(t, end)
    return np.clip(value, min(start, end), max(start, end))


def actor_epsilons(num_envs, base_epsilon, alpha=7.0, min_epsilon=0.01):
    """epsilon_i = base^(1 + alpha i / (num_envs - 1)) for actor i, never below `min_epsilon` (num_envs,)."""
    exponents = 1 + alpha * np.arange(num_envs) / max(num_envs - 1, 1)
    return np.maximum(base_epsilon**exponents, min_epsilon)


class Agent:
    """Acting bookkeeping for a batch of environments: recurrent state and the extra LSTM inputs."""

    INPUTS = ("last_action", "last_reward", "is_first", "game_steps", "game_over")

    def __init__(self, q_network, num_envs, args, device):
        self.q_network, self.args, self.device = q_network, args, device
        self.state = (torch.zeros(num_envs, args.lstm_size, device=device),) * 2
        self.last_action, self.last_reward = np.full(num_envs, -1, dtype=np.int64), np.zeros(num_envs, dtype=np.float32)
        self.is_first, self.game_over = np.ones(num_envs, dtype=bool), np.zeros(num_envs, dtype=bool)
        self.game_steps = np.zeros(num_envs, dtype=np.int64)  # agent steps since the game began

    def state_dict(self):
        return {"state": self.state, **{key: getattr(self, key) for key in self.INPUTS}}

    def load_state_dict(self, saved):
        self.state = tuple(x.to(self.device) for x in saved["state"])
        for key in self.INPUTS:
            setattr(self, key, saved[key])

    def inputs(self):
        timestep = (self.game_steps / self.args.max_episode_steps).astype(np.float32)
        return dict(last_action=self.last_action, last_reward=self.last_reward, timestep=timestep, is_first=self.is_first)

    @torch.no_grad()
    def act(self, obs, epsilons):
        num_envs, inputs = len(obs), {k: torch.as_tensor(v, device=self.device)[None] for k, v in self.inputs().items()}
        taus = torch.rand(1, num_envs, self.args.num_quantile_samples, device=self.device)
        obs = torch.as_tensor(obs, device=self.device)[None]
        quantiles, self.state = self.q_network(obs, **inputs, state=self.state, taus=taus)
        actions = quantiles[0].mean(1).argmax(1).cpu().numpy()
        explore = np.random.rand(num_envs) < epsilons
        return np.where(explore, np.random.randint(self.q_network.num_actions, size=num_envs), actions)

    def update_inputs(self, actions, reward, is_reset_step, game_over):
        """After a step: the next frame's extra inputs. A reset step's frame starts a new episode (or life);
        the timestep restarts only with a new game."""
        self.game_steps = np.where(is_reset_step & self.game_over, 0, self.game_steps + ~is_reset_step)
        self.game_over = game_over
        self.is_first = is_reset_step.copy()
        self.last_action = np.where(is_reset_step, -1, actions)
        self.last_reward = np.where(is_reset_step, 0.0, np.clip(reward, -1, 1)).astype(np.float32)


def head_at(network, features, taus, bootstrap):
    """The head's quantiles (L, B, K, A) at the bootstrap positions (L, B) of features (T, B, ...) and taus (T, B, K):
    the rows a target reads, the same numbers as running the head at every position and gathering after it."""

    def rows(x):
        return x.gather(0, bootstrap.view(*bootstrap.shape, *[1] * (x.dim() - 2)).expand(-1, -1, *x.shape[2:]))

    return network.head(rows(features), rows(taus))


def train_step(args, q_network, target_network, optimizer, rb, device):
    """One update on batch_size sequences; returns the loss, the mean Q and whether the gradient norm was finite, as
    device tensors (no sync)."""
    batch, initial_state, ids, probs = rb.sample(args.batch_size)  # (burn_in + L + n, B) slots
    bounds = window_bounds = segment_bounds(batch["is_first"])
    b = {k: torch.as_tensor(v, device=device) for k, v in batch.items()}
    inputs = {k: b[k] for k in ["obs", "last_action", "last_reward", "timestep", "is_first"]}
    T, B, L, n, burn_in = rb.window, args.batch_size, args.seq_len, args.n_step, args.burn_in
    sizes = args.num_tau_prime_samples, args.num_tau_samples, args.num_quantile_samples  # N', N, K
    target_taus, taus, select_taus = (torch.rand(T, B, k, device=device) for k in sizes)
    state = initial_state
    if burn_in > 0:  # the burn-in only warms up the stored state: no gradient, no loss
        with torch.no_grad():
            burn_in_inputs = {k: v[:burn_in] for k, v in inputs.items()}
            burn_in_bounds = [t for t in bounds if t < burn_in] + [burn_in]
            _, state = q_network.core(**burn_in_inputs, state=state, taus=taus[:burn_in], bounds=burn_in_bounds)
        bounds = [0] + [t - burn_in for t in bounds if t > burn_in]
    trained_inputs = {k: v[burn_in:] for k, v in inputs.items()}
    features, _ = q_network.core(**trained_inputs, state=state, taus=taus[burn_in:], bounds=bounds)
    taus = taus[burn_in : burn_in + L]
    quantiles = q_network.head(features[:L], taus)  # (L, B, N, A)
    with torch.no_grad():
        ends = [b[k][burn_in:] for k in ("reward", "terminated", "truncated")]  # slot 0: the first trained step
        returns, discounts, bootstrap = n_step_targets(*ends, args.gamma, n)  # (L, B) each
        target_features = target_network.core(**inputs, state=initial_state, taus=target_taus, bounds=window_bounds)[0]
        target_quantiles = head_at(target_network, target_features[burn_in:], target_taus[burn_in:], bootstrap)
        if args.iqn_before_lstm:  # the quantile samples enter the LSTM: the selection pass needs its own unroll
            select_features = q_network.core(**inputs, state=initial_state, taus=select_taus, bounds=window_bounds)[0]
            select_features = select_features[burn_in:]
        else:  # reuse the LSTM features, new quantile samples in the head
            select_features = features
        select_quantiles = head_at(q_network, select_features, select_taus[burn_in:], bootstrap)
        # Double Q: the online network picks the bootstrap action, the target network values it.
        next_actions = select_quantiles.mean(2).argmax(2, keepdim=True)  # (L, B, 1)
        next_actions = next_actions.unsqueeze(2).expand(-1, -1, args.num_tau_prime_samples, 1)
        next_quantiles = target_quantiles.gather(3, next_actions).squeeze(3)  # (L, B, N')
        if args.value_rescaling:
            next_quantiles = inverse_value_rescale(next_quantiles)
        targets = returns.unsqueeze(2) + discounts.unsqueeze(2) * next_quantiles
        if args.value_rescaling:
            targets = value_rescale(targets)
    actions = b["action"][burn_in : burn_in + L].long()
    chosen = quantiles.gather(3, actions.view(*actions.shape, 1, 1).expand(-1, -1, args.num_tau_samples, 1)).squeeze(3)
    loss = quantile_huber_loss(chosen.flatten(0, 1), taus.flatten(0, 1), targets.flatten(0, 1), args.kappa).view(L, B)
    mask = (~b["is_reset_step"][burn_in : burn_in + L]).float()  # reset steps (the action was ignored) are never trained
    weights = torch.ones(B, device=device)
    if probs is not None:  # importance sampling, normalized by the largest weight in the batch
        w = (rb.num_valid() * probs) ** -args.prioritized_replay_beta
        weights = torch.as_tensor(w / w.max(), dtype=torch.float32, device=device)
    loss_value = (loss * mask * weights).sum() / mask.sum().clamp(min=1.0)
    optimizer.zero_grad(set_to_none=True)
    loss_value.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
    optimizer.step()
    if probs is not None:  # R2D2's sequence priority from the mean absolute sampled TD error of each step
        td = ((targets.unsqueeze(2) - chosen.detach().unsqueeze(3)).abs().mean((2, 3)) * mask).cpu().numpy()
        mean_td = td.sum(0) / np.maximum(mask.sum(0).cpu().numpy(), 1)
        priority = args.priority_eta * td.max(0) + (1 - args.priority_eta) * mean_td
        rb.update_priorities(ids, priority**args.prioritized_replay_alpha + 1e-6)
    return loss_value.detach(), (chosen.detach().mean(2) * mask).sum() / mask.sum().clamp(min=1.0), torch.isfinite(grad_norm)


class StartUpReplay:
    """Stands in for the replay when the update is timed before the loop, with nothing stored yet: every sample is the
    same `batch_size` windows of the replay's first slots (zeros of the real shapes and dtypes), at equal sampling
    probabilities where the replay is prioritized; new priorities are dropped."""

    def __init__(self, rb: SequenceReplay, batch_size: int):
        self.window, self.batch_size = rb.window, batch_size
        envs, slots = np.zeros((1, batch_size), dtype=np.int64), np.arange(rb.window)[:, None] % rb.capacity  # (T, B)
        self.batch = {key: getattr(rb, key)[envs, slots] for key in rb.ARRAYS}
        state = rb.state[torch.zeros(batch_size, dtype=torch.int64), torch.zeros(batch_size, dtype=torch.int64)]
        self.state = (state[:, 0], state[:, 1])
        self.probs = None if rb.priorities is None else np.full(batch_size, 1 / batch_size)

    def sample(self, batch_size):
        return self.batch, self.state, np.zeros(batch_size, dtype=np.int64), self.probs

    def num_valid(self):
        return self.batch_size

    def update_priorities(self, ids, priorities):
        pass


def seconds_per_update(args, q_network, target_network, optimizer, rb: SequenceReplay, device) -> float:
    """Seconds one update takes, timed before the loop for the progress line's first estimate: `train_step` on copies of
    the networks (and a fresh optimizer of the same kind) with the batch of a `StartUpReplay`, the median of 3 calls
    after an untimed one (which pays for first-call allocations). Every random generator is left as it was (the update
    draws its quantile levels from torch's), so that the run's numbers do not depend on the timing."""
    rng = checkpoint_files.rng_states()
    online, target = copy.deepcopy(q_network), copy.deepcopy(target_network)
    timed_optimizer = type(optimizer)(online.parameters(), **optimizer.defaults)
    replay = StartUpReplay(rb, args.batch_size)
    times = []
    for _ in range(4):
        start = time.perf_counter()
        train_step(args, online, target, timed_optimizer, replay, device)
        if device.type == "cuda":  # kernels run asynchronously: the update ends when the device is done
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    checkpoint_files.set_rng_states(rng)
    return sorted(times[1:])[1]


def evaluate(weights: dict, args, device, video_folder: str):
    """Plays `args.eval_episodes` episodes with the network of `weights` (a model file's) at `args.eval_epsilon` and
    returns their returns. Episodes are split evenly over the environments so short ones are not favoured;
    `args.capture_video` records them (one env) in `video_folder`."""
    if args.eval_episodes == 0:  # none to play (and envpool builds no zero envs)
        return []
    eval_episodes, num_envs = args.eval_episodes, 1 if args.capture_video else min(args.eval_episodes, 32)
    if args.capture_video:
        env = environments.make_video_env(args.env_id, video_folder)
        envs = gym.vector.SyncVectorEnv([lambda: hide_velocity(env) if args.mask_velocity else env])  # as in training
    else:
        envs = make_env(args.env_id, num_envs, args.seed + EVAL_SEED_OFFSET, args.mask_velocity, args.max_episode_steps)
    q_network = QNetwork(envs.single_observation_space.shape, int(envs.single_action_space.n), args).to(device)
    model_files.put_weights(q_network, weights, args.model_path)
    q_network.eval()
    agent = Agent(q_network, num_envs, args, device)
    quota = np.array([eval_episodes // num_envs + (i < eval_episodes % num_envs) for i in range(num_envs)])
    scores, score = [], np.zeros(num_envs)
    obs, _ = envs.reset(seed=args.seed + EVAL_SEED_OFFSET) if args.capture_video else envs.reset()
    is_reset_step = np.zeros(num_envs, dtype=bool)
    while len(scores) < eval_episodes:
        actions = agent.act(obs, args.eval_epsilon)
        obs, reward, terminated, truncated, info = envs.step(actions)
        score += reward
        game_over = terminated | truncated
        for i in np.flatnonzero(game_over & (quota > 0)):
            scores.append(float(score[i]))
            quota[i] -= 1
        score[game_over] = 0.0
        agent.update_inputs(actions, reward, is_reset_step, game_over)
        is_reset_step = game_over
    envs.close()
    return scores


def main(args: Args) -> list[float]:
    args = command_line.with_minatar_defaults(args, MINATAR_DEFAULTS)
    if args.eval_only:  # rebuild a saved agent from its model file and evaluate it, no training
        args, weights = model_files.read_for_evaluation(args, __file__)
        validate_args(args)
        device, video_folder = model_files.start_evaluation(args, __file__)
        return model_files.report_evaluation(args, evaluate(weights, args, device, video_folder), video_folder)
    args, checkpoint = command_line.resume(args, __file__, CHECKPOINT_FORMAT)
    memory = validate_args(args)  # the memory the run will take, said in the start-up block
    args = flag_checks.whole_iterations(args)
    # cpu_threads=1: a network this small only pays synchronization for threads
    with training_run.Run(args, checkpoint, __file__, CHECKPOINT_FORMAT, cpu_threads=1, memory=memory) as run:
        device = run.device
        torch.set_float32_matmul_precision("high")  # TF32 matmuls on GPUs that have them

        envs = make_env(args.env_id, args.num_envs, run.env_seed, args.mask_velocity, args.max_episode_steps)
        obs_space, num_actions = envs.single_observation_space, int(envs.single_action_space.n)
        q_network = QNetwork(obs_space.shape, num_actions, args).to(device)
        target_network = QNetwork(obs_space.shape, num_actions, args).to(device)
        print(f"  torso: {q_network.torso_name}")
        target_network.load_state_dict(q_network.state_dict())
        optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, eps=args.adam_eps)
        rb = SequenceReplay(args, obs_space.shape, obs_space.dtype, args.lstm_size, device)
        agent = Agent(q_network, args.num_envs, args, device)
        stats = episode_scores.EpisodeStats(args.num_envs)
        # One update of batch_size x seq_len trained slots per this many agent steps keeps the replay ratio.
        update_every = max(1, round(args.batch_size * args.seq_len / args.replay_ratio / args.num_envs))
        target_every = max(1, args.target_network_frequency // (args.num_envs * update_every))
        # --target-network-frequency counts agent steps and is rounded down to whole updates: say what it became.
        print(
            f"  updates: one every {update_every * args.num_envs} agent steps; a target copy every {target_every}"
            f" updates ({target_every * update_every * args.num_envs} agent steps)"
        )
        num_iterations = args.total_timesteps // args.num_envs
        # The actions of every envs.step call: replaying them rebuilds the environments on resume.
        action_log = np.zeros((num_iterations, args.num_envs), dtype=np.min_scalar_type(num_actions - 1))
        loss_sums = torch.zeros(2, device=device)  # quantile loss and Q-value of the updates since the last log
        obs, _ = envs.reset()
        is_reset_step = np.zeros(args.num_envs, dtype=bool)
        start_iteration, updates, learn_from = 0, 0, args.learning_starts  # updates once past learn_from

        def checkpoint_state(iterations_done: int) -> dict:
            """All a resume needs, as plain values; the replay only with --checkpoint-replay."""
            networks = dict(q_network=q_network.state_dict(), target_network=target_network.state_dict())
            learner = networks | dict(optimizer=optimizer.state_dict(), updates=updates)
            actors = dict(agent=agent.state_dict(), obs=obs.copy(), is_reset_step=is_reset_step.copy())
            logs = dict(iteration=iterations_done, stats=stats.state_dict(), loss_sums=loss_sums.detach().cpu().clone())
            replay = rb.state_dict() if args.checkpoint_replay else None
            return learner | actors | dict(action_log=action_log[:iterations_done].copy()) | logs | {"rb": replay}

        if checkpoint:
            with run.restoring() as saved:
                q_network.load_state_dict(saved["q_network"])
                target_network.load_state_dict(saved["target_network"])
                optimizer.load_state_dict(saved["optimizer"])
                updates = saved["updates"]
                agent.load_state_dict(saved["agent"])
                obs[: len(saved["obs"])] = saved["obs"]
                is_reset_step[: len(saved["is_reset_step"])] = saved["is_reset_step"]
                action_log[: len(saved["action_log"])] = saved["action_log"]
                start_iteration = saved["iteration"]
                stats.load_state_dict(saved["stats"])
                loss_sums.copy_(saved["loss_sums"])
                if args.checkpoint_replay:
                    rb.load_state_dict(saved["rb"])
            envs, obs = run.fast_forward(envs, action_log[:start_iteration], obs, stats)
            if args.resume_fresh_envs:  # new games: every env's next step is a reset step; partial scores dropped
                is_reset_step[:] = agent.game_over[:] = True  # game_over: the new game's timestep restarts
                stats.drop_games_in_progress()
                rb.truncated[:, (rb.pos - 1) % rb.capacity] = True  # the cut is a time-out: targets bootstrap from obs
            if not args.checkpoint_replay:  # the replay starts empty: collect again before learning
                learn_from = start_iteration * args.num_envs + args.learning_starts
                run.note_empty_replay(learn_from)
        timed = seconds_per_update(args, q_network, target_network, optimizer, rb, device)
        progress = run.progress(start_iteration * args.num_envs, 1 / (update_every * args.num_envs), timed)
        epsilon_floor = args.end_e if args.min_epsilon is None else args.min_epsilon
        # The NaN stop, kept on the device and read at logging intervals: no wait for the device at every update.
        updates_finite = torch.ones((), dtype=torch.bool, device=device)
        for iteration in range(start_iteration + 1, num_iterations + 1):
            global_step = iteration * args.num_envs
            base_epsilon = linear_schedule(
                args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
            )
            epsilons = actor_epsilons(args.num_envs, base_epsilon, args.epsilon_alpha, epsilon_floor)
            state_before, inputs = agent.state, agent.inputs()
            actions = agent.act(obs, epsilons)
            action_log[iteration - 1] = actions
            next_obs, reward, terminated, truncated, info = envs.step(actions)
            step = dict(obs=obs, action=actions, reward=reward, terminated=terminated, truncated=truncated)
            rb.add(state_before, **step, is_reset_step=is_reset_step, **inputs)
            game_over = terminated | truncated
            stats.update(reward, is_reset_step, game_over, run.writer, global_step)
            agent.update_inputs(actions, reward, is_reset_step, game_over)
            is_reset_step, obs = terminated | truncated, next_obs

            if global_step > learn_from and iteration % update_every == 0 and rb.num_valid() > 0:
                if args.anneal_lr:  # from the steps taken before this vector step
                    steps_before = global_step - args.num_envs
                    optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - steps_before / args.total_timesteps)
                loss, q_value, grads_finite = train_step(args, q_network, target_network, optimizer, rb, device)
                loss_sums += torch.stack((loss, q_value))
                updates_finite &= grads_finite
                updates += 1
                if updates % args.log_interval == 0:
                    run.check_finite(updates_finite, global_step)
                    loss_sum, q_sum = loss_sums.tolist()
                    loss_sums.zero_()
                    run.writer.add_scalar("losses/quantile_loss", loss_sum / args.log_interval, global_step)
                    run.writer.add_scalar("losses/q_values", q_sum / args.log_interval, global_step)
                    run.writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                    run.writer.add_scalar("charts/epsilon", base_epsilon, global_step)
                    run.writer.add_scalar("charts/SPS", progress.sps(global_step), global_step)
                    if args.prioritized_replay:
                        run.writer.add_scalar("charts/beta", args.prioritized_replay_beta, global_step)
                if updates % target_every == 0:
                    target_network.load_state_dict(q_network.state_dict())

            is_last = iteration == num_iterations
            if is_last:  # the updates since the last logging block: no final checkpoint or model of NaN weights
                run.check_finite(updates_finite, global_step)
            progress.print(global_step, stats.recent, force=is_last, updates=updates)
            if run.checkpoint_due(global_step, args.num_envs, is_last):
                run.save(global_step, checkpoint_state(iteration), learned=("q_network", "target_network", "optimizer"))
            if run.stopped:  # a signal asked to stop: the checkpoint says how to continue
                break
        envs.close()

        if args.save_model and not run.stopped and (model_path := run.save_model(q_network.state_dict())):
            run.log_evaluation(model_path, evaluate(q_network.state_dict(), args, device, run.video_folder))
        run.finish(stats.scores)
    return stats.scores


if __name__ == "__main__":
    main(command_line.parse(Args, minatar=MINATAR_DEFAULTS))
