"""R2D2 (Recurrent Replay Distributed DQN) for vector observations.

An LSTM Q-network learns from prioritized replay of fixed-length sequences: each starts from the recurrent state the
actor had when it was collected, a burn-in prefix only warms that state up, and the `seq_len` steps after it are
trained with n-step double-Q targets under value rescaling, the loss summed over them; a new sequence starts every
`sequence_period` steps and enters the replay with the priority of its TD errors under the network that acted.
Vectorized environments act with fixed per-actor epsilons in place of the paper's distributed actors. Vectors get a
dense torso, MinAtar's grids a convolutional one; `--mask-velocity` hides CartPole's velocities (a memory task).

Paper: Kapturowski et al., "Recurrent Experience Replay in Distributed Reinforcement Learning", ICLR 2019.
Docs: docs/rl-algorithms/r2d2.md
"""

import cleanrl_q_utils.quiet_start  # noqa: F401  (first: a signal while torch loads exits quietly)

import copy
import os
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn

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
from cleanrl_q_utils.segment_tree import SegmentTree

envpool = classic_control.import_envpool()  # None off Linux (it has Linux wheels only): classic control is gymnasium's

# The layout of checkpoint.pt, which a resume checks; 3: the burn-in is a prefix before --seq-len trained steps,
# and --sequence-period sets how often a sequence starts; 4: the replay keeps the actors' Q-values, not a max priority;
# 5: the replay's write position is `pos` and its window records `window_*` (were `t`, `seq_*`); 6: the flag
# --target-network-frequency (in learner updates here, in agent steps elsewhere) is --target-update-period
CHECKPOINT_FORMAT = 6
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
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """if toggled, record videos of the evaluation episodes to `runs/<run_name>/videos/` (needs the `video` extra)"""
    save_model: bool = False
    """if toggled, save the final model to `runs/<run_name>/` and evaluate it"""
    eval_episodes: int = 10
    """the number of episodes the model is evaluated on (after `--save-model`, or with `--eval-only`)"""
    eval_only: bool = False
    """evaluate the model at --model-path instead of training (with --capture-video: record it)"""
    model_path: str | None = None
    """a model file written by --save-model, for --eval-only"""

    env_id: str = "CartPole-v1"  # classic control, or MinAtar (MinAtar/Breakout-v0)
    """the id of the environment"""
    total_timesteps: int = 300_000
    """the total number of agent steps of the experiment, summed over all environments"""
    mask_velocity: bool = False
    """if toggled, hide CartPole's velocities (observe cart position and pole angle only): a memory task"""
    num_envs: int = 16  # one actor each
    """the number of parallel environments"""
    buffer_size: int = 300_000  # stored observations; the default keeps a whole run
    """the replay capacity in transitions, summed over all environments"""
    learning_starts: int = 5_000
    """the number of agent steps collected before learning starts"""
    batch_size: int = 32
    """the number of sequences per gradient update"""
    seq_len: int = 10
    """the number of trained steps of a replayed sequence, after its burn-in prefix"""
    burn_in: int = 10
    """the steps before a sequence's trained steps that only warm up its stored LSTM state (no loss, no gradient; 0: off)"""
    sequence_period: int = 10
    """steps between the starts of consecutive sequences of an episode (each step is trained seq-len / period times)"""
    n_step: int = 5
    """the number of steps of the n-step return"""
    gamma: float = 0.99
    """the discount factor gamma"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer"""
    adam_eps: float = 1e-3
    """the epsilon of the Adam optimizer"""
    max_grad_norm: float = 40.0
    """the global norm the gradients are clipped to"""
    target_update_period: int = 100
    """the number of learner updates (not agent steps) between copies of the online network into the target network"""
    replay_ratio: float = 16.0
    """the average number of times each collected step is replayed as a trained (non burn-in) step"""
    prioritized_replay_alpha: float = 0.9
    """the priority exponent alpha of prioritized replay"""
    prioritized_replay_beta: float = 0.6  # constant
    """the importance-sampling exponent beta of prioritized replay"""
    priority_eta: float = 0.9
    """the mix of a sequence's priority: eta * max_t + (1 - eta) * mean_t of its absolute TD errors"""
    start_e: float = 0.4
    """the base of the per-actor epsilons at the start"""
    epsilon_alpha: float = 7.0
    """the exponent range alpha of the per-actor epsilons: actor i explores with base^(1 + alpha i / (num_envs - 1))"""
    end_e: float = 0.05
    """the base of the per-actor epsilons at the end of its decay"""
    exploration_fraction: float = 0.5
    """the fraction of `total_timesteps` over which the epsilon schedule goes linearly from `start_e` to `end_e` (0: `end_e`
    from the first step)"""
    eval_epsilon: float = 0.001  # the Atari evaluation of the dueling DQN and IQN papers
    """the epsilon of the evaluation episodes"""
    lstm_size: int = 128  # also the width of the torso before it and of each dueling head
    """the size of the LSTM state"""
    log_interval: int = 100
    """the number of learner updates between loss logs"""
    checkpoint_every: int = 0
    """write a resumable checkpoint every this many agent steps and at the end (0: only when a signal stops the run)"""
    checkpoint_replay: bool = False
    """also store the replay buffer in checkpoints (large, but the resumed run is then exact)"""
    resume: str | None = None
    """continue the run saved in this checkpoint, in the same run directory (and W&B run)"""
    resume_fresh_envs: bool = False
    """with --resume: start new games instead of replaying every logged action (cost independent of the run's length;
    the games in progress are dropped, so the run is not bit-identical)"""


# A MinAtar id's configuration (given flags win), from a sweep on Breakout and 1M-step runs on Asterix, Seaquest and
# Breakout (docs/rl-algorithms/r2d2.md, docs/minatar.md): under an hour on 2 CPU cores.
MINATAR_DEFAULTS = dict(
    total_timesteps=5_000_000,  # the feed-forward scripts' MinAtar budget (Young & Tian's)
    buffer_size=200_000,
    learning_starts=20_000,
    seq_len=20,
    burn_in=10,
    sequence_period=10,
    replay_ratio=4.0,
    # 8 sequences, not 32: four times the updates from the same replayed steps (one per 40 agent steps, not 160); with
    # 32 it started late on Asterix and Seaquest, with 8 far less (1M steps, seeds 1-3: docs/minatar.md)
    batch_size=8,
    # the script's learning rate, 1e-3, and Adam epsilon, the paper's 1e-3: the loss sums over the 20 trained steps, as
    # Acme and SEED RL; under a mean over them (gradients 20 times smaller) Breakout stayed random and needed 1e-5
    target_update_period=400,  # a copy every 16k agent steps (400 updates): 61 in a 1M-step run, 312 in 5M
    # the paper's fixed per-actor epsilons 0.4^(1 + 7i/15), as r2d2_atari.py: a base decaying to 0.01 left all but one greedy
    start_e=0.4,
    end_e=0.4,
)


def validate_args(args: Args) -> list:
    flag_checks.check_common_flags(args)
    spec = flag_checks.check_env_id(args.env_id, atari=False)
    min_buffer, period = args.num_envs * 2 * (args.burn_in + args.seq_len + args.n_step), args.sequence_period
    checks = [
        ("mask_velocity", True, not args.mask_velocity or args.env_id.startswith("CartPole"), "only for CartPole"),
        ("sequence_period", period, period <= args.seq_len, f"1 to --seq-len={args.seq_len}, else steps go untrained"),
        ("n_step", args.n_step, args.n_step <= args.seq_len, f"1 <= n-step <= --seq-len={args.seq_len}"),
        ("buffer_size", args.buffer_size, args.buffer_size >= min_buffer, f"at least {min_buffer}: two windows per env"),
        ("total_timesteps", args.total_timesteps, args.total_timesteps >= args.num_envs, "at least --num-envs"),
    ]
    flag_errors.check_flags(checks)
    obs_shape = hide_velocity(np.zeros((1, *spec.observation_space.shape)), args.mask_velocity).shape[1:]
    return flag_checks.check_run_memory(args, memory_needs(args, obs_shape, spec.action_space.n, spec.observation_space.dtype))


def network_sizes(args: Args, obs_shape: tuple, num_actions: int) -> tuple[int, int]:
    """(parameters, floats of every layer output for one step of one sequence) of QNetwork, counted from its layers."""
    inputs = int(np.prod(obs_shape))
    if len(obs_shape) == 3:  # MinAtar grid
        grid, features = 16 * (obs_shape[0] - 2) * (obs_shape[1] - 2), 128
        torso = flag_checks.conv_parameters(obs_shape[2], 16, 3) + flag_checks.linear_parameters(grid, features)
        floats = 2 * inputs + 2 * grid + 2 * features
    else:
        features = args.lstm_size
        torso, floats = flag_checks.linear_parameters(inputs, features), inputs + 2 * features
    lstm, size = flag_checks.lstm_parameters(features + num_actions + 1, args.lstm_size), args.lstm_size
    heads = 2 * flag_checks.linear_parameters(size, size) + flag_checks.linear_parameters(size, 1)
    heads += flag_checks.linear_parameters(size, num_actions)
    # per step: the LSTM's input, its four gates, state and output, the two heads, the dueling combination
    return torso + lstm + heads, floats + features + num_actions + 1 + 11 * size + 4 * num_actions + 1


def memory_needs(args: Args, obs_shape: tuple, num_actions: int, obs_dtype) -> list:
    """What a run allocates in proportion to its flags, for `flag_checks.check_run_memory`: the replay, the network
    with its target, gradients and two Adam moments, an update's activations (the unroll that is differentiated, over
    the trained and n-step positions of the batch's sequences), the environments."""
    parameters, per_step = network_sizes(args, obs_shape, num_actions)
    needs = flag_checks.common_needs(args, parameters, 5, ("lstm_size",), args.eval_episodes, per_step)
    if args.eval_only:
        return needs
    positions = args.batch_size * (args.seq_len + args.n_step)  # the burn-in and target unrolls keep nothing
    update = flag_checks.activation_memory_bytes(positions, per_step)
    flags = ("batch_size", "seq_len", "n_step", "lstm_size")
    return needs + [
        ("the replay", replay_memory_bytes(args, obs_shape, obs_dtype), ("buffer_size",)),
        ("an update's activations", update, flags),
    ]


def make_env(env_id: str, num_envs: int, seed: int):
    if minatar.is_minatar(env_id):
        return minatar.make_envs(env_id, num_envs, seed)
    if envpool is None:  # stepped as envpool steps, NEXT_STEP autoreset included
        return classic_control.make_envs(env_id, num_envs, seed)
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed)


def hide_velocity(obs: np.ndarray, mask_velocity: bool) -> np.ndarray:
    """CartPole's observation is (x, x_dot, theta, theta_dot); the memory task keeps (x, theta)."""
    return obs[:, [0, 2]] if mask_velocity else obs


class QNetwork(nn.Module):
    """Torso (a dense layer for vectors, Young & Tian's convolution for MinAtar's grids) -> LSTM (input also gets the
    previous reward and one-hot previous action) -> dueling heads."""

    def __init__(self, obs_shape: tuple, num_actions: int, lstm_size: int):
        super().__init__()
        self.num_actions, self.is_grid = num_actions, len(obs_shape) == 3
        if self.is_grid:
            height, width, channels = obs_shape
            conv = [nn.Conv2d(channels, 16, 3), nn.ReLU(), nn.Flatten()]
            self.torso = nn.Sequential(*conv, nn.Linear(16 * (height - 2) * (width - 2), 128), nn.ReLU())
            features, self.torso_name = 128, f"convolutional (16 filters 3x3, 128 units) for {height}x{width}x{channels} grids"
        else:
            self.torso = nn.Sequential(nn.Linear(int(np.prod(obs_shape)), lstm_size), nn.ReLU())
            features, self.torso_name = lstm_size, f"MLP of {lstm_size} units for vectors of {int(np.prod(obs_shape))}"
        self.lstm = nn.LSTM(features + num_actions + 1, lstm_size)
        self.value = nn.Sequential(nn.Linear(lstm_size, lstm_size), nn.ReLU(), nn.Linear(lstm_size, 1))
        self.advantage = nn.Sequential(nn.Linear(lstm_size, lstm_size), nn.ReLU(), nn.Linear(lstm_size, num_actions))

    def forward(self, obs, last_action, last_reward, is_first, state):
        """obs (T, B, ...), last_action (T, B) long (-1: none), last_reward (T, B), is_first (T, B) bool,
        state = (h, c) each (B, H). Returns q (T, B, A) and the final state."""
        steps, batch = is_first.shape
        obs = obs.flatten(0, 1)
        features = self.torso(obs.permute(0, 3, 1, 2).float() if self.is_grid else obs).view(steps, batch, -1)
        one_hot = nn.functional.one_hot(last_action.clamp(min=0), self.num_actions) * (last_action >= 0).unsqueeze(-1)
        x = torch.cat([features, one_hot.float(), last_reward.unsqueeze(-1)], dim=-1)
        # the state restarts from zero at an episode's first observation; episodes only begin in a sequence's
        # first steps, so the LSTM runs fused over the few segments between those positions
        h, c, outputs = state[0].unsqueeze(0), state[1].unsqueeze(0), []
        bounds = [0, *(is_first[1:].any(1).nonzero().flatten() + 1).tolist(), steps]
        for start, end in zip(bounds[:-1], bounds[1:]):
            keep = (~is_first[start]).float().unsqueeze(-1)
            out, (h, c) = self.lstm(x[start:end], (h * keep, c * keep))
            outputs.append(out)
        out = torch.cat(outputs)
        advantage = self.advantage(out)
        return self.value(out) + advantage - advantage.mean(-1, keepdim=True), (h[0], c[0])


def max_windows(capacity: int, num_envs: int, period: int, window: int) -> int:
    """Window slots of the replay: twice one window per period, as short episodes start more windows."""
    return 2 * capacity // period + 4 * num_envs * (window // period + 2)


class SequenceReplay:
    """Every observation is stored once, in one ring of slots per environment; a sequence is an index window into
    it (docs page, "Sequence replay without duplicated frames"). A window never crosses an episode: its positions
    outside [lo, hi) are padding, lo < 0 where the episode began before the window, lo >= 0 (zero state) where the
    window reaches back before the episode's start, so that its first steps are trained as often as the others."""

    def __init__(self, args: Args, obs_shape: tuple, obs_dtype):
        self.num_envs, self.capacity = args.num_envs, args.buffer_size // args.num_envs
        shape = (self.num_envs, self.capacity)  # one ring of slots per environment
        self.seq_len, self.burn_in, self.period = args.seq_len, args.burn_in, args.sequence_period
        self.window = args.burn_in + args.seq_len + args.n_step  # burn-in prefix, trained steps, target steps
        self.prioritized_replay_alpha, self.save_arrays = args.prioritized_replay_alpha, args.checkpoint_replay
        self.n_step, self.gamma, self.priority_eta = args.n_step, args.gamma, args.priority_eta
        self.history = 1  # slots read before a window: the previous action and reward
        self.obs = np.zeros((*shape, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros(shape, dtype=np.uint8)
        self.rewards = np.zeros(shape, dtype=np.float32)
        self.terminated, self.truncated = np.zeros((2, *shape), dtype=bool)
        # the acting network's Q(s, a) of the action taken and max_a Q(s, a): a new window's priority comes from them
        self.acted_q, self.max_q = np.zeros((2, *shape), dtype=np.float32)
        self.num_windows = max_windows(args.buffer_size, args.num_envs, self.period, self.window)
        # per window: its env, the absolute step of its position 0, [lo, hi), the LSTM state before position 0
        self.window_env, self.window_start, self.window_lo, self.window_hi = np.zeros((4, self.num_windows), dtype=np.int64)
        self.window_h, self.window_c = np.zeros((2, self.num_windows, args.lstm_size), dtype=np.float32)
        self.tree = SegmentTree(self.num_windows)
        self.open = np.zeros(0, dtype=np.int64)  # windows still being filled (priority 0 until complete)
        self.next_window, self.pos = 0, 0
        self.episode_start = np.zeros(args.num_envs, dtype=np.int64)

    def state_dict(self) -> dict:
        """The write position and episode starts always (windows opened after a resume need them); with `save_arrays`
        every array and the sum tree too, as tensors sharing their memory (torch.save then pickles no copy of them)."""
        state = dict(pos=self.pos, episode_start=self.episode_start.copy())
        if self.save_arrays:
            state.update({name: torch.from_numpy(v) for name, v in vars(self).items() if isinstance(v, np.ndarray)})
            state.update(tree=torch.from_numpy(self.tree.nodes), next_window=self.next_window)
        return state

    def load_state_dict(self, state: dict) -> None:
        state = {name: value.numpy() if isinstance(value, torch.Tensor) else value for name, value in state.items()}
        self.tree.nodes = state.pop("tree", self.tree.nodes)
        vars(self).update(state)

    def _new_windows(self, envs, starts, lo, h, c):
        ids = (self.next_window + np.arange(len(envs))) % self.num_windows
        self.next_window += len(envs)
        self.tree.update(ids, 0.0)  # evicts the oldest sequences (FIFO)
        self.window_env[ids], self.window_start[ids], self.window_lo[ids] = envs, starts, lo
        self.window_h[ids], self.window_c[ids] = h, c
        self.open = np.concatenate([self.open, ids])

    def add(self, obs, actions, rewards, terminated, truncated, is_first, is_reset_step, h, c, q):
        """One vector step: obs (N, ...) fed to the network, its action, reward and flags. `is_reset_step` marks
        envpool's reset step (its obs is the previous episode's final one), h and c the LSTM state before obs, q (N, A)
        the acting network's Q-values at obs."""
        pos, slot = self.pos, self.pos % self.capacity
        self.obs[:, slot], self.actions[:, slot], self.rewards[:, slot] = obs, actions, rewards
        self.terminated[:, slot], self.truncated[:, slot] = terminated, truncated
        self.acted_q[:, slot], self.max_q[:, slot] = np.take_along_axis(q, actions[:, None], 1)[:, 0], q.max(1)
        if pos % self.period == 0:  # forget windows whose slots the ring is about to overwrite
            stale = self.window_start - self.history <= pos - self.capacity + self.period
            stale_ids = np.flatnonzero(stale & (self.tree.leaves(np.arange(self.num_windows)) > 0))
            self.tree.update(stale_ids, 0.0)
        # close windows that are full or whose episode ended with this step's final observation
        env, start = self.window_env[self.open], self.window_start[self.open]
        ended, full = is_reset_step[env], pos - start + 1 >= self.window
        close = ended | full
        hi = np.where(ended, pos - start + 1, self.window)
        trained = ~ended | (hi - 2 >= self.burn_in)  # at least one trained step
        keep = self.open[close & trained]
        self.window_hi[keep] = hi[close & trained]
        if len(keep):  # a complete window enters with the priority of its TD errors under the acting network
            self.update_priorities(keep, self.initial_priorities(keep))
        self.open = self.open[~close]
        # open new windows: their trained steps start at the multiples of `period` of an episode
        first = np.flatnonzero(is_first)
        self.episode_start[first] = pos
        since_start = pos - self.episode_start + self.burn_in
        regular = np.flatnonzero(~is_first & ~is_reset_step & (since_start % self.period == 0))
        self._new_windows(regular, np.full(len(regular), pos), self.episode_start[regular] - pos, h[regular], c[regular])
        earliest = -((self.seq_len - 1) // self.period) * self.period  # the first trained span that reaches the episode
        for trained_start in range(earliest, self.burn_in + 1, self.period) if len(first) else []:  # reach back before it
            lo = np.full(len(first), self.burn_in - trained_start)
            self._new_windows(first, pos - lo, lo, 0.0, 0.0)  # zero state
        self.pos += 1

    def sample(self, batch_size: int, rng: np.random.Generator, prioritized_replay_beta: float, device):
        """Prioritized draw of `batch_size` sequences with their normalized importance weights."""
        total = self.tree.root
        mass = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)  # one in each equal segment
        ids = self.tree.find_prefix_sum(mass)
        probs = self.tree.leaves(ids) / total
        weights = (np.count_nonzero(self.tree.leaves(np.arange(self.num_windows))) * probs) ** -prioritized_replay_beta
        batch = self.gather(ids, device)
        batch["weights"] = torch.as_tensor((weights / weights.max()).astype(np.float32), device=device)
        return ids, batch

    def positions(self, ids: np.ndarray):
        """The env and ring slot of positions -history .. window - 1 of the windows `ids` (P, B), and which of them lie
        in the window's episode."""
        offset = np.arange(-self.history, self.window)[:, None]
        env = self.window_env[ids][None]
        slots = (self.window_start[ids][None] + offset) % self.capacity
        valid = (offset >= self.window_lo[ids][None]) & (offset < self.window_hi[ids][None])  # padding: another episode
        return env, slots, valid

    def step_fields(self, env, slots, valid) -> dict:
        """Time-major arrays over positions 0 .. window - 1 of everything stored per step but the observation."""
        actions = np.where(valid, self.actions[env, slots].astype(np.int64), -1)
        rewards = np.where(valid, self.rewards[env, slots], 0.0).astype(np.float32)
        done = valid & (self.terminated[env, slots] | self.truncated[env, slots])
        now, before = slice(self.history, None), slice(self.history - 1, -1)
        return {
            **dict(actions=actions[now], rewards=rewards[now]),
            **dict(terminated=valid[now] & self.terminated[env, slots[now]], done=done[now], valid=valid[now]),
            **dict(is_first=valid[now] & ~valid[before], is_reset_step=done[before], last_action=actions[before]),
            **dict(last_reward=np.clip(rewards[before], -1, 1)),  # clipped, as the actor sees it
            **dict(acted_q=np.where(valid[now], self.acted_q[env, slots[now]], 0), max_q=self.max_q[env, slots[now]]),
        }

    def gather(self, ids: np.ndarray, device) -> dict:
        """Time-major tensors over the `burn_in + seq_len + n_step` positions of the sequences `ids`."""
        env, slots, valid = self.positions(ids)
        frames = self.obs[env, slots] * valid.reshape(*valid.shape, *[1] * (self.obs.ndim - 2)).astype(self.obs.dtype)
        batch = {k: v for k, v in self.step_fields(env, slots, valid).items() if k not in ("acted_q", "max_q")}
        batch.update(obs=frames[self.history :], h=self.window_h[ids], c=self.window_c[ids])
        return {k: torch.as_tensor(v, device=device) for k, v in batch.items()}

    def initial_priorities(self, ids: np.ndarray) -> np.ndarray:
        """Priorities of the complete windows `ids` from the Q-values the actors acted with (as Ape-X, R2D2 and SEED RL:
        the acting network both rates the taken action and bootstraps, so no target network is involved)."""
        fields = {k: torch.as_tensor(v) for k, v in self.step_fields(*self.positions(ids)).items()}
        trained = slice(self.burn_in, self.burn_in + self.seq_len)
        mask = fields["valid"][trained] & ~fields["is_reset_step"][trained]
        after_burn_in = [fields[k][self.burn_in :] for k in ("acted_q", "max_q", "rewards", "done", "terminated")]
        return acting_priorities(*after_burn_in, mask, self.n_step, self.gamma, self.priority_eta).numpy()

    def update_priorities(self, ids: np.ndarray, priorities: np.ndarray) -> None:
        # a zero leaf marks a free slot, so a window whose TD errors are all exactly zero keeps a tiny priority
        self.tree.update(ids, np.maximum(priorities, 1e-8) ** self.prioritized_replay_alpha)


def replay_memory_bytes(args: Args, obs_shape: tuple, obs_dtype) -> int:
    """Bytes that SequenceReplay allocates for these flags (the step streams, the sequence records and their tree)."""
    capacity, window = args.buffer_size // args.num_envs, args.burn_in + args.seq_len + args.n_step
    per_step = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize + 1 + 4 + 1 + 1 + 8  # obs, action, reward, flags, Qs
    num_windows = max_windows(args.buffer_size, args.num_envs, args.sequence_period, window)
    per_window = 4 * 8 + 2 * args.lstm_size * 4  # env, start, lo, hi; h and c
    tree = 2 * (1 << (num_windows - 1).bit_length()) * 8
    return args.num_envs * (capacity * per_step + 8) + num_windows * per_window + tree  # + each env's episode start


def value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x."""
    return torch.sign(x) * (torch.sqrt(torch.abs(x) + 1) - 1) + eps * x


def inverse_value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h^-1(x), in the form 2z / (1 + sqrt(1 + 4 eps z)) with z = |x| + 1 + eps, which avoids the cancellation
    of sqrt(1 + 4 eps z) - 1 in float32."""
    z = torch.abs(x) + 1 + eps
    return torch.sign(x) * ((2 * z / (1 + torch.sqrt(1 + 4 * eps * z))) ** 2 - 1)


def sequence_priorities(abs_td: torch.Tensor, mask: torch.Tensor, eta: float = 0.9) -> torch.Tensor:
    """eta max_t |delta_t| + (1 - eta) mean_t |delta_t| over the valid steps: abs_td, mask (T, B) -> (B,)."""
    masked = abs_td * mask
    return eta * masked.amax(0) + (1 - eta) * masked.sum(0) / mask.sum(0).clamp(min=1)


def target_copies(args: Args) -> int:
    """The target-network copies a run of these flags makes: after `learning_starts`, one update per
    batch_size * seq_len / replay_ratio collected steps, a copy every `target_update_period` updates."""
    learning_iterations = max(args.total_timesteps // args.num_envs - args.learning_starts // args.num_envs, 0)
    updates = int(learning_iterations * args.num_envs * args.replay_ratio / (args.batch_size * args.seq_len))
    return updates // args.target_update_period


def linear_schedule(start: float, end: float, duration: float, t):
    """Linear from `start` at agent step 0 to `end` at step `duration`, then `end`; a `duration` of 0 is `end` from the
    first step. `t` is a step or an array of steps; the result (float64) has its shape."""
    t = np.asarray(t, dtype=np.float64)
    value = start + (end - start) * t / duration if duration > 0 else np.full_like(t, end)
    return np.clip(value, min(start, end), max(start, end))


def actor_epsilons(num_envs: int, base_epsilon: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """eps_i = base_epsilon^(1 + alpha i / (N - 1)); a single actor gets `base_epsilon`."""
    fraction = np.arange(num_envs) / max(num_envs - 1, 1)
    return base_epsilon ** (1 + alpha * fraction)


def n_step_returns(rewards, done, terminated, steps: int, n_step: int, gamma: float):
    """The n-step returns of the first `steps` positions of rewards, done, terminated (steps + n_step, B), stopped at
    the episode's end, with the offset k of each one's bootstrap position (n_step, or the steps to the episode's end)
    and whether it bootstraps (only termination cuts the bootstrap, a time-out keeps it); each (steps, B)."""
    returns, alive = torch.zeros_like(rewards[:steps]), torch.ones_like(done[:steps])
    offset, bootstrap = torch.full(returns.shape, n_step, dtype=torch.int64, device=rewards.device), torch.ones_like(alive)
    for k in range(n_step):
        rows = slice(k, steps + k)
        returns += alive * gamma**k * rewards[rows]
        ends = alive & done[rows]
        offset = torch.where(ends, k + 1, offset)
        bootstrap = torch.where(ends, ~terminated[rows], bootstrap)
        alive = alive & ~done[rows]
    return returns, offset, bootstrap


def acting_priorities(acted_q, max_q, rewards, done, terminated, mask, n_step: int, gamma: float, eta: float):
    """A new sequence's priority from the values its actor acted with: delta_t = h(R_t + gamma^k h^-1(max_a Q(s_t+k, a)))
    - Q(s_t, a_t). acted_q, max_q, rewards, done, terminated (T + n_step, B) from the first trained position, mask (T, B)
    -> (B,)."""
    steps = mask.shape[0]
    returns, offset, bootstrap = n_step_returns(rewards, done, terminated, steps, n_step, gamma)
    next_value = max_q.gather(0, offset + torch.arange(steps).unsqueeze(-1))
    target = value_rescale(returns + bootstrap * gamma**offset * inverse_value_rescale(next_value))
    return sequence_priorities((target - acted_q[:steps]).abs(), mask, eta)


def sequence_loss(td: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Importance-weighted batch mean of each sequence's sum over its trained steps of 0.5 delta^2 (as Acme and SEED
    RL; a mean over steps would divide the gradient by seq_len): td (T, B), zero off the trained steps; weights (B,)."""
    return (weights * (0.5 * td**2).sum(0)).mean()


def sequence_td_errors(q_network, target_network, batch, burn_in: int, seq_len: int, n_step: int, gamma: float):
    """TD errors delta (T, B) in rescaled space, the trained-step mask (T, B) and Q(s, a) (T, B) for the
    T = seq_len trained positions after the burn-in prefix. Burn-in runs without gradient; the target network is
    unrolled over the same sequence from the same stored state."""
    inputs = [batch[k] for k in ("obs", "last_action", "last_reward", "is_first")]
    state = (batch["h"], batch["c"])
    with torch.no_grad():
        _, burned_in = q_network(*[x[:burn_in] for x in inputs], state) if burn_in else (None, state)
        target_q, _ = target_network(*inputs, state)
    q, _ = q_network(*[x[burn_in:] for x in inputs], burned_in)  # positions burn_in .. burn_in + seq_len + n_step - 1
    steps, end = seq_len, burn_in + seq_len
    q_taken = q[:steps].gather(-1, batch["actions"][burn_in:end].clamp(min=0).unsqueeze(-1)).squeeze(-1)
    after_burn_in = [batch[k][burn_in:] for k in ("rewards", "done", "terminated")]
    returns, offset, bootstrap = n_step_returns(*after_burn_in, steps, n_step, gamma)
    with torch.no_grad():
        rows = offset + torch.arange(steps, device=offset.device).unsqueeze(-1)  # index into q (starts at burn_in)
        cols = torch.arange(q.shape[1], device=q.device).expand_as(rows)
        best = q.detach()[rows, cols].argmax(-1, keepdim=True)  # double Q: online net picks, target net rates
        next_value = target_q[rows + burn_in, cols].gather(-1, best).squeeze(-1)
        target = value_rescale(returns + bootstrap * gamma**offset * inverse_value_rescale(next_value))
    mask = batch["valid"][burn_in:end] & ~batch["is_reset_step"][burn_in:end]
    return (target - q_taken) * mask, mask, q_taken


def train_step(
    q_network,
    target_network,
    optimizer,
    batch: dict,
    burn_in: int,
    seq_len: int,
    n_step: int,
    gamma: float,
    max_grad_norm: float,
    priority_eta: float,
) -> tuple:
    """One gradient step on a sampled `batch` of sequences. Returns the loss, Q(s, a) and the trained-step mask (T, B),
    the sequences' new priorities (B,) and whether the gradient norm was finite (tensors on the device: reading them
    would wait for the update)."""
    td, mask, q_taken = sequence_td_errors(q_network, target_network, batch, burn_in, seq_len, n_step, gamma)
    loss = sequence_loss(td, batch["weights"])
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(q_network.parameters(), max_grad_norm)
    optimizer.step()
    priorities = sequence_priorities(td.detach().abs(), mask, priority_eta)
    return loss, q_taken, mask, priorities, torch.isfinite(grad_norm)


def seconds_per_update(q_network, target_network, optimizer, rb: SequenceReplay, args: Args, device) -> float:
    """Seconds one update takes, timed before the loop for the progress line's first estimate: `train_step` on copies of
    the networks (and a fresh optimizer of the same kind) with `batch_size` sequences gathered from the replay's first,
    still empty, slots (zeros of the real shapes and dtypes), the median of 3 calls after an untimed one (which pays for
    first-call allocations). Every random generator is left as it was, so that the run's numbers do not depend on the
    timing."""
    rng = checkpoint_files.rng_states()
    online, target = copy.deepcopy(q_network), copy.deepcopy(target_network)
    timed_optimizer = type(optimizer)(online.parameters(), **optimizer.defaults)
    batch = rb.gather(np.zeros(args.batch_size, dtype=np.int64), device)
    batch["weights"] = torch.ones(args.batch_size, device=device)
    sizes = (args.burn_in, args.seq_len, args.n_step, args.gamma, args.max_grad_norm, args.priority_eta)
    times = []
    for _ in range(4):
        start = time.perf_counter()
        train_step(online, target, timed_optimizer, batch, *sizes)
        if device.type == "cuda":  # kernels run asynchronously: the update ends when the device is done
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    checkpoint_files.set_rng_states(rng)
    return sorted(times[1:])[1]


@torch.no_grad()
def play(model, envs, obs, mask_velocity: bool, device, epsilon: float) -> list[float]:
    """Plays one episode in each of the vectorized `envs`, from their first observations `obs`; returns the scores."""
    n = len(obs)
    state = (torch.zeros(n, model.lstm.hidden_size, device=device),) * 2
    last_action, last_reward = np.full(n, -1), np.zeros(n, dtype=np.float32)
    scores, returns, finished = [], np.zeros(n), np.zeros(n, dtype=bool)
    while not finished.all():
        inputs = to_step_inputs(hide_velocity(obs, mask_velocity), last_action, last_reward, np.zeros(n, bool), device)
        q, state = model(*inputs, state)
        explore = np.random.random(n) < epsilon
        actions = np.where(explore, np.random.randint(model.num_actions, size=n), q[0].argmax(-1).cpu().numpy())
        obs, reward, terminated, truncated, _ = envs.step(actions)
        returns += reward * ~finished
        scores.extend(returns[(terminated | truncated) & ~finished].tolist())
        finished |= terminated | truncated
        last_action, last_reward = actions, np.clip(reward, -1, 1).astype(np.float32)
    return scores


def evaluate(weights: dict, args: Args, device, video_folder: str) -> list[float]:
    """Runs the network with `weights` (a model file's) for one episode on each of `args.eval_episodes` fresh
    environments; returns their game scores. --capture-video records one more episode through gymnasium's renderer
    (envpool does not render) to `video_folder`."""
    if args.eval_episodes == 0:  # none to play (and envpool builds no zero envs)
        return []
    envs = make_env(args.env_id, args.eval_episodes, args.seed + EVAL_SEED_OFFSET)
    obs, _ = envs.reset()
    model = QNetwork(hide_velocity(obs, args.mask_velocity).shape[1:], int(envs.single_action_space.n), args.lstm_size).to(
        device
    )
    model_files.put_weights(model, weights, args.model_path)
    scores = play(model, envs, obs, args.mask_velocity, device, args.eval_epsilon)
    if args.capture_video:
        video_env = gym.vector.SyncVectorEnv([lambda: environments.make_video_env(args.env_id, video_folder)])
        play(
            model,
            video_env,
            video_env.reset(seed=args.seed + EVAL_SEED_OFFSET)[0],
            args.mask_velocity,
            device,
            args.eval_epsilon,
        )
        video_env.close()
    return scores


def to_step_inputs(obs, last_action, last_reward, is_first, device):
    """Numpy actor inputs for one step -> (1, N, ...) tensors for QNetwork.forward."""
    return [torch.as_tensor(a, device=device).unsqueeze(0) for a in (obs, last_action, last_reward, is_first)]


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
    with training_run.Run(args, checkpoint, __file__, CHECKPOINT_FORMAT, cpu_threads=1, memory=memory) as run:
        rng = np.random.default_rng(args.seed)
        device = run.device

        envs = make_env(args.env_id, args.num_envs, run.env_seed)
        num_envs, num_actions = args.num_envs, int(envs.single_action_space.n)
        obs, _ = envs.reset()  # the raw observation: resume checks the replayed environments against it
        obs_shape = hide_velocity(obs, args.mask_velocity).shape[1:]
        q_network = QNetwork(obs_shape, num_actions, args.lstm_size).to(device)
        target_network = QNetwork(obs_shape, num_actions, args.lstm_size).to(device)
        print(f"  torso: {q_network.torso_name}")
        target_network.load_state_dict(q_network.state_dict())
        optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, eps=args.adam_eps)
        rb = SequenceReplay(args, obs_shape, obs.dtype)  # as the env gives them: float32 vectors, MinAtar's bool planes
        per_observation = f"{replay_memory_bytes(args, obs_shape, rb.obs.dtype) / (rb.num_envs * rb.capacity):.1f} bytes"
        print(f"replay: {per_observation} per stored observation")
        run.writer.add_text("replay", f"{per_observation} per stored observation")
        updates_per_vector_step = num_envs * args.replay_ratio / (args.batch_size * args.seq_len)
        print(f"target network: {target_copies(args)} copies, one every {args.target_update_period} updates")

        h, c = torch.zeros(2, num_envs, args.lstm_size, device=device)  # the actors' LSTM state
        is_first, is_reset_step = np.ones(num_envs, dtype=bool), np.zeros(num_envs, dtype=bool)
        last_action, last_reward = np.full(num_envs, -1), np.zeros(num_envs, dtype=np.float32)
        stats = episode_scores.EpisodeStats(num_envs)
        update_credit, updates, learn_from = 0.0, 0, args.learning_starts  # updates once past learn_from
        num_iterations = args.total_timesteps // num_envs
        global_step = checkpoint["global_step"] if checkpoint else 0  # sets the log's length in checkpoint_state
        action_log = np.zeros((num_iterations, num_envs), dtype=np.min_scalar_type(num_actions - 1))

        def checkpoint_state(iterations_done: int) -> dict:
            """All a resume needs, as plain values."""
            learner = dict(q_network=q_network.state_dict(), target_network=target_network.state_dict())
            learner |= dict(optimizer=optimizer.state_dict(), updates=updates)
            actors = dict(obs=obs.copy(), h=h.cpu().clone(), c=c.cpu().clone(), is_first=is_first.copy())
            actors |= dict(is_reset_step=is_reset_step.copy(), last_action=last_action.copy(), last_reward=last_reward.copy())
            logs = dict(stats=stats.state_dict(), action_log=action_log[:iterations_done].copy())
            replay = dict(rb=rb.state_dict(), rng=rng.bit_generator.state, update_credit=update_credit)
            return learner | actors | logs | replay | dict(learn_from=learn_from)

        if checkpoint is not None:
            with run.restoring() as saved:
                q_network.load_state_dict(saved["q_network"])
                target_network.load_state_dict(saved["target_network"])
                optimizer.load_state_dict(saved["optimizer"])
                obs[:], is_first[:], is_reset_step[:] = saved["obs"], saved["is_first"], saved["is_reset_step"]
                last_action[:], last_reward[:] = saved["last_action"], saved["last_reward"]
                h.copy_(saved["h"])
                c.copy_(saved["c"])
                stats.load_state_dict(saved["stats"])
                action_log[: len(saved["action_log"])] = saved["action_log"]
                rb.load_state_dict(saved["rb"])
                rng.bit_generator.state = saved["rng"]
                update_credit, updates, learn_from = saved["update_credit"], saved["updates"], saved["learn_from"]
            envs, obs = run.fast_forward(envs, action_log[: global_step // num_envs], obs, stats)
            if args.resume_fresh_envs:  # new games: every env's next step is a reset step, which starts no episode
                is_reset_step[:], is_first[:] = True, False
                stats.drop_games_in_progress()  # the partial scores
                rb.truncated[:, (rb.pos - 1) % rb.capacity] = True  # the cut is a time-out: targets bootstrap from obs
            if not rb.save_arrays:  # the replay starts empty: collect again before learning
                learn_from = checkpoint["global_step"] + args.learning_starts
                run.note_empty_replay(learn_from)
        timed = seconds_per_update(q_network, target_network, optimizer, rb, args, device)
        progress = run.progress(global_step, updates_per_vector_step / num_envs, timed)
        # The NaN stop, kept on the device and read at logging intervals: no wait for the device at every update.
        updates_finite = torch.ones((), dtype=torch.bool, device=device)
        for iteration in range(global_step // num_envs, num_iterations):
            global_step = (iteration + 1) * num_envs
            keep = torch.as_tensor(~is_first, device=device).float().unsqueeze(-1)
            h, c = h * keep, c * keep  # episode start: zero state, no previous action or reward
            last_action, last_reward = np.where(is_first, -1, last_action), np.where(is_first, 0, last_reward)
            base_epsilon = linear_schedule(
                args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
            )
            epsilons = actor_epsilons(num_envs, base_epsilon, args.epsilon_alpha)
            visible_obs = hide_velocity(obs, args.mask_velocity)
            with torch.no_grad():
                q, (next_h, next_c) = q_network(
                    *to_step_inputs(visible_obs, last_action, last_reward, is_first, device), (h, c)
                )
            explore = rng.random(num_envs) < epsilons
            acting_q = q[0].cpu().numpy()
            actions = np.where(explore, rng.integers(num_actions, size=num_envs), acting_q.argmax(-1))
            next_obs, reward, terminated, truncated, _ = envs.step(actions)
            action_log[iteration] = actions
            rb.add(
                visible_obs,
                actions,
                reward,
                terminated,
                truncated,
                is_first,
                is_reset_step,
                h.cpu().numpy(),
                c.cpu().numpy(),
                acting_q,
            )
            stats.update(reward, is_reset_step, terminated | truncated, run.writer, global_step)
            obs, h, c = next_obs, next_h, next_c
            last_action, last_reward = actions, np.clip(reward, -1, 1).astype(np.float32)
            is_first, is_reset_step = is_reset_step, terminated | truncated

            if global_step > learn_from and rb.tree.root > 0:
                update_credit += updates_per_vector_step
            while update_credit >= 1:
                update_credit -= 1
                ids, batch = rb.sample(args.batch_size, rng, args.prioritized_replay_beta, device)
                loss, q_taken, mask, priorities, grads_finite = train_step(
                    q_network,
                    target_network,
                    optimizer,
                    batch,
                    args.burn_in,
                    args.seq_len,
                    args.n_step,
                    args.gamma,
                    args.max_grad_norm,
                    args.priority_eta,
                )
                updates_finite &= grads_finite
                rb.update_priorities(ids, priorities.cpu().numpy())
                updates += 1
                if updates % args.target_update_period == 0:
                    target_network.load_state_dict(q_network.state_dict())
                if updates % args.log_interval == 0:
                    run.check_finite(updates_finite, global_step)
                    run.writer.add_scalar("losses/td_loss", loss.item(), global_step)
                    run.writer.add_scalar("losses/q_values", (q_taken * mask).sum().item() / mask.sum().item(), global_step)
                    run.writer.add_scalar("charts/beta", args.prioritized_replay_beta, global_step)
                    run.writer.add_scalar("charts/epsilon", base_epsilon, global_step)  # the schedule's, as every script
                    run.writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                    run.writer.add_scalar("charts/SPS", progress.sps(global_step), global_step)
            progress.print(global_step, stats.recent, updates=updates)
            if run.checkpoint_due(global_step, num_envs, iteration + 1 == num_iterations):
                run.save(global_step, checkpoint_state(iteration + 1), learned=("q_network", "target_network", "optimizer"))
            if run.stopped:  # a signal asked to stop: the checkpoint says how to continue
                break

        if not run.stopped:  # the updates since the last log, before the model is saved
            run.check_finite(updates_finite, global_step)
        if args.save_model and not run.stopped and (model_path := run.save_model(q_network.state_dict())):
            run.log_evaluation(model_path, evaluate(q_network.state_dict(), args, device, run.video_folder))
        run.finish(stats.scores)
        envs.close()
    return stats.scores


if __name__ == "__main__":
    main(command_line.parse(Args, minatar=MINATAR_DEFAULTS))
