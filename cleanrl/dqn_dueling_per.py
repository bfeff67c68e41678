"""Double DQN with a dueling head, n-step returns and proportional prioritized experience replay. An Atari id
(Breakout-v5) brings the papers' Atari configuration (ATARI_DEFAULTS), a MinAtar id Young & Tian's (MINATAR_DEFAULTS);
flags given on the command line win.

The online network picks the next action and the target network values it (Double DQN); the network splits into a
state-value and an advantage stream recombined as Q = V + A - mean_a A (dueling); and transitions are replayed with
probability proportional to |TD error|^alpha from a sum tree, with importance-sampling weights that correct the bias (PER).
On Atari the replay stores each frame once and rebuilds the 4-frame stacks.

Papers: van Hasselt et al. 2016 (arXiv:1509.06461), Wang et al. 2016 (arXiv:1511.06581), Schaul et al. 2016 (arXiv:1511.05952).
Docs: docs/rl-algorithms/dqn_dueling_per.md
"""

import cleanrl_q_utils.quiet_start  # noqa: F401  (first: a signal while torch loads exits quietly)

import copy
import math
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
from cleanrl_q_utils.segment_tree import SegmentTree

envpool = classic_control.import_envpool()  # None off Linux (it has Linux wheels only): classic control is gymnasium's

# The layout of checkpoint.pt, which a resume checks; 2: the state under one "state" entry, the buffer under "rb";
# 3: the --adam-eps flag, and on Atari a replay that stores each frame once (FrameReplayBuffer)
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

    env_id: str = "CartPole-v1"  # classic control, Atari (Breakout-v5) or MinAtar (MinAtar/Breakout-v0)
    """the id of the environment"""
    total_timesteps: int = 120_000
    """the total number of agent steps of the experiment, summed over all environments"""
    num_envs: int = 8
    """the number of parallel environments"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer"""
    adam_eps: float = 1e-8  # torch's default
    """the epsilon of the Adam optimizer"""
    anneal_lr: bool = True  # keeps the final policy stable
    """if toggled, anneal the learning rate linearly to zero over training"""
    buffer_size: int = 100_000  # n-step transitions; Atari stores each 84x84 frame once: about 7.1 KB each
    """the replay capacity in transitions, summed over all environments"""
    gamma: float = 0.99
    """the discount factor gamma"""
    n_step: int = 3  # 1 = one-step Double DQN
    """the number of steps of the n-step return"""
    target_network_frequency: int = 500
    """the number of agent steps (summed over all environments) between copies of the online network into the target network"""
    batch_size: int = 256
    """the number of transitions per gradient update"""
    train_frequency: int = 8  # a multiple of --num-envs
    """the number of agent steps (summed over all environments) between two gradient updates"""
    learning_starts: int = 5_000
    """the number of agent steps collected before learning starts"""
    start_e: float = 1.0
    """the starting epsilon of the epsilon-greedy exploration"""
    end_e: float = 0.02
    """the final epsilon of the epsilon-greedy exploration"""
    exploration_fraction: float = 0.2
    """the fraction of `total_timesteps` over which the epsilon schedule goes linearly from `start_e` to `end_e` (0: `end_e`
    from the first step)"""
    eval_epsilon: float = 0.001  # the dueling and tuned Double DQN papers' Atari evaluation
    """the epsilon of the evaluation episodes"""
    prioritized_replay_alpha: float = 0.6  # 0: uniform replay
    """the priority exponent alpha of prioritized replay"""
    prioritized_replay_beta: float = 0.4  # annealed linearly to 1 at the end of the run
    """the importance-sampling exponent beta of prioritized replay"""
    prioritized_replay_eps: float = 1e-6
    """added to |TD error| so that every transition keeps a non-zero priority"""
    max_grad_norm: float = 10.0
    """the global norm the gradients are clipped to"""
    hidden_size: int = 128
    """the width of the MLP torso and of each dueling stream (vector observations only)"""
    checkpoint_every: int = 0
    """write a resumable checkpoint every this many agent steps and at the end (0: only when a signal stops the run)"""
    checkpoint_replay: bool = False
    """also store the replay buffer in checkpoints (large, but the resumed run is then exact)"""
    resume: Optional[str] = None
    """continue the run saved in this checkpoint, in the same run directory (and W&B run)"""
    resume_fresh_envs: bool = False
    """with --resume: start new games instead of replaying every logged action (cost independent of the run's length;
    the games in progress are dropped, so the run is not bit-identical)"""


# The configuration a MinAtar id runs with (flags given on the command line win): Young & Tian's budget, replay,
# exploration, learning rate and target period (a copy every 1,000 updates), with Revisiting Rainbow's replay ratio of
# 8 replayed samples per agent step where theirs is 32: at Young & Tian's ratio, whole 5M-step runs learned less on
# Space Invaders and Asterix, a little more on Breakout, in two and a half times the wall time (docs page: the runs).
MINATAR_DEFAULTS = dict(
    total_timesteps=5_000_000,
    learning_rate=2.5e-4,
    batch_size=64,
    train_frequency=8,
    target_network_frequency=8_000,
    exploration_fraction=0.02,  # Young & Tian: epsilon 1 -> 0.1 over the first 100k steps
    end_e=0.01,
)

# The configuration an Atari id (envpool's -v5) runs with (flags given on the command line win): the Atari settings of
# the dueling (Wang et al. 2016) and prioritized replay (Schaul et al. 2016) papers, both on the tuned Double DQN
# protocol (van Hasselt et al. 2016). Counts are agent steps of 4 frames, as DQN's code counts them; the docs page gives
# the source of each value and the deviations (Adam, 4 environments, the schedules' start).
ATARI_DEFAULTS = dict(
    total_timesteps=50_000_000,  # 200M frames
    num_envs=4,  # with a batch of 32 every 4 agent steps: the papers' replay ratio
    learning_rate=6.25e-5,  # DQN's 2.5e-4 / 4 (Schaul et al.); the dueling paper's lower learning rate
    adam_eps=1.5e-4,  # Rainbow's Adam at this learning rate (the papers use RMSProp)
    anneal_lr=False,
    buffer_size=1_000_000,
    n_step=1,
    target_network_frequency=30_000,  # the tuned Double DQN period (7,500 updates)
    batch_size=32,
    train_frequency=4,
    learning_starts=50_000,
    end_e=0.01,
    exploration_fraction=0.02,  # epsilon 1 -> 0.01 over the first 1M agent steps
)


def with_atari_defaults(args: Args) -> Args:
    """`args` with ATARI_DEFAULTS for an Atari id, except the flags given on the command line (they win), as
    `command_line.with_minatar_defaults` does for MinAtar ids. A resumed run keeps its checkpoint's flags and an
    evaluation its model file's."""
    if not is_atari(args.env_id) or args.resume is not None or args.eval_only:
        return args
    return command_line.with_configuration(args, ATARI_DEFAULTS, "the Atari configuration")


def is_atari(env_id: str) -> bool:
    return env_id.endswith("-v5")  # envpool's Atari ids


def validate_args(args: Args) -> list:
    flag_checks.check_common_flags(args)
    # The buffer must hold a batch, and the first n-step window of every env.
    minimum = max(args.batch_size, args.num_envs * args.n_step)
    at_least = f"must be >= max(--batch-size, --num-envs * --n-step) = {minimum}"
    multiple = f"must be a multiple of --num-envs={args.num_envs}"
    ring_min = args.n_step + FrameReplayBuffer.STACK_NUM
    in_ring = f"must hold --n-step + {FrameReplayBuffer.STACK_NUM} = {ring_min} steps of each of --num-envs={args.num_envs}"
    flag_errors.check_flags(
        [
            ("buffer_size", args.buffer_size, args.buffer_size >= minimum, at_least),
            ("learning_starts", args.learning_starts, args.learning_starts >= minimum, at_least),
            ("train_frequency", args.train_frequency, args.train_frequency % args.num_envs == 0, multiple),
            # An Atari transition's frames must stay in its environment's ring until the n-step window completes it.
            (
                "buffer_size",
                args.buffer_size,
                not is_atari(args.env_id) or args.buffer_size // args.num_envs >= ring_min,
                in_ring,
            ),
        ]
    )
    spec = flag_checks.check_env_id(args.env_id)
    # numpy allocates lazily, so an oversized buffer would only fail (or start swapping) hours into the run.
    return flag_checks.check_run_memory(args, memory_needs(args, spec.observation_space.shape, spec.action_space.n))


def network_sizes(args: Args, obs_shape: tuple, num_actions: int) -> tuple[int, int]:
    """(parameters, floats of every layer output for one observation) of DuelingQNetwork, counted from its layers."""
    linear, inputs = flag_checks.linear_parameters, int(np.prod(obs_shape))
    if len(obs_shape) == 3 and obs_shape[0] == obs_shape[1]:  # MinAtar grid
        features, hidden = 16 * (obs_shape[0] - 2) * (obs_shape[1] - 2), 128
        torso, floats = flag_checks.conv_parameters(obs_shape[2], 16, 3), 2 * inputs + 2 * features
    elif len(obs_shape) == 3:  # stacked Atari frames
        features, hidden = 3136, 512
        convs = [(obs_shape[0], 32, 8, 20), (32, 64, 4, 9), (64, 64, 3, 7)]  # (in, out, kernel, output side)
        torso = sum(flag_checks.conv_parameters(i, o, k) for i, o, k, _ in convs)
        floats = 2 * inputs + sum(2 * o * side * side for _, o, _, side in convs)
    else:
        features = hidden = args.hidden_size
        torso, floats = linear(inputs, hidden), inputs + 2 * hidden
    streams = 2 * linear(features, hidden) + linear(hidden, 1) + linear(hidden, num_actions)
    return torso + streams, floats + 4 * hidden + 1 + 3 * num_actions


def memory_needs(args: Args, obs_shape: tuple, num_actions: int) -> list:
    """What a run allocates in proportion to its flags, for `flag_checks.check_run_memory`: the replay, the network
    with its target, gradients and two Adam moments, an update's activations (the online pass that is
    differentiated and the two passes over the next observations), the environments."""
    parameters, floats = network_sizes(args, obs_shape, num_actions)
    needs = flag_checks.common_needs(args, parameters, 5, ("hidden_size",), args.eval_episodes, floats)
    if args.eval_only:
        return needs
    replay = replay_memory_bytes(args, obs_shape, buffer_obs_dtype(obs_shape))
    update = flag_checks.activation_memory_bytes(2 * args.batch_size, floats)
    return needs + [
        ("the replay", replay, ("buffer_size",)),
        ("an update's activations", update, ("batch_size", "hidden_size")),
    ]


def buffer_obs_dtype(obs_shape: tuple):
    """Images (Atari's stacked 84x84 frames, MinAtar's grids of bool planes) are stored as uint8, vectors as float32."""
    return np.uint8 if len(obs_shape) == 3 else np.float32


def make_env(env_id: str, num_envs: int, seed: int):
    """Vectorized envpool environments, for training and evaluation alike; Atari with the DQN preprocessing: a lost life
    ends an episode (envpool then plays no-ops and FIRE) and rewards are clipped (true scores come from `true_game_end`)."""
    if minatar.is_minatar(env_id):
        return minatar.make_envs(env_id, num_envs, seed)
    if envpool is None:  # stepped as envpool steps, NEXT_STEP autoreset included
        return classic_control.make_envs(env_id, num_envs, seed)
    kwargs = dict(num_threads=1)  # cheaper than a thread pool for classic control's tiny steps
    if is_atari(env_id):
        stack = FrameReplayBuffer.STACK_NUM
        kwargs = dict(episodic_life=True, reward_clip=True, stack_num=stack, noop_max=30, repeat_action_probability=0.0)
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **kwargs)


def true_game_end(rewards, terminated, truncated, info) -> tuple[np.ndarray, np.ndarray]:
    """(raw rewards, game over) of one vectorized step: envpool Atari ends an episode at every lost life and clips its
    rewards, so both come from its info; classic control and ale-py's video env end episodes with the game."""
    if "reward" in info:  # envpool Atari
        return info["reward"], info["terminated"].astype(bool) | truncated
    return rewards, terminated | truncated


def dueling_combine(value: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """Q = V + A - mean_a A. value: (B, 1), advantage: (B, A) -> (B, A)."""
    return value + advantage - advantage.mean(dim=1, keepdim=True)


class DuelingQNetwork(nn.Module):
    """A torso chosen by the observation's shape (named in `torso_name`), then two-layer value and advantage streams."""

    def __init__(self, obs_shape: tuple, num_actions: int, hidden_size: int = 128):
        super().__init__()
        self.is_image = len(obs_shape) == 3 and obs_shape[0] != obs_shape[1]  # (4, 84, 84): channels first
        self.is_grid = len(obs_shape) == 3 and obs_shape[0] == obs_shape[1]  # (10, 10, C): channels last
        if self.is_grid:  # Young & Tian's MinAtar network
            height, width, channels = obs_shape
            self.torso = nn.Sequential(nn.Conv2d(channels, 16, 3), nn.ReLU(), nn.Flatten())
            features, hidden_size = 16 * (height - 2) * (width - 2), 128
            self.torso_name = f"convolutional (16 filters 3x3, streams of 128 units) for {height}x{width}x{channels} grids"
        elif self.is_image:
            self.torso = nn.Sequential(
                nn.Conv2d(obs_shape[0], 32, 8, stride=4),
                nn.ReLU(),
                nn.Conv2d(32, 64, 4, stride=2),
                nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1),
                nn.ReLU(),
                nn.Flatten(),
            )
            features, hidden_size = 3136, 512
            self.torso_name = "Nature CNN (streams of 512 units) for stacked 84x84 frames"
        else:
            self.torso = nn.Sequential(nn.Linear(int(np.prod(obs_shape)), hidden_size), nn.ReLU())
            features = hidden_size
            self.torso_name = f"MLP of {hidden_size} units for vectors of {int(np.prod(obs_shape))}"
        self.value = nn.Sequential(nn.Linear(features, hidden_size), nn.ReLU(), nn.Linear(hidden_size, 1))
        self.advantage = nn.Sequential(nn.Linear(features, hidden_size), nn.ReLU(), nn.Linear(hidden_size, num_actions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 3, 1, 2) if self.is_grid else x
        z = self.torso(x.float() / 255.0 if self.is_image else x.float())
        if self.is_image and z.requires_grad:
            z.register_hook(lambda grad: grad * 2**-0.5)  # Wang et al. (Atari): gradient into the last conv layer / sqrt(2)
        return dueling_combine(self.value(z), self.advantage(z))


class PrioritizedReplayBuffer:
    """Proportional prioritized replay (Schaul et al. 2016) over n-step transitions, FIFO when full. A row holds obs,
    action, discounted n-step reward sum, gamma^k of the bootstrap (0 after a termination) and the observation to
    bootstrap from; the sum tree holds p_i^alpha for sampling, the min tree the smallest one for the max IS weight."""

    ARRAYS = ("obs", "actions", "returns", "discounts", "next_obs")  # the order of a sampled batch

    def __init__(self, capacity: int, obs_shape: tuple, obs_dtype, alpha: float, seed: Optional[int] = None):
        self.obs = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.next_obs = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros(capacity, dtype=np.int64)
        self.returns, self.discounts = np.zeros(capacity, dtype=np.float32), np.zeros(capacity, dtype=np.float32)
        self.pos, self.size = 0, 0
        self.start_priorities(capacity, alpha, seed)

    def start_priorities(self, capacity: int, alpha: float, seed: Optional[int]) -> None:
        self.capacity, self.alpha = capacity, alpha
        self.sum_tree = SegmentTree(capacity, np.add, 0.0)
        self.min_tree = SegmentTree(capacity, np.minimum, np.inf)
        self.max_priority = 1.0  # largest priority seen so far; new transitions enter with it
        self.rng = np.random.default_rng(seed)

    def add(self, obs, actions, returns, discounts, next_obs) -> None:
        """Stores a batch of K transitions, overwriting the oldest ones when full."""
        idx = (self.pos + np.arange(len(actions))) % self.capacity
        self.obs[idx], self.next_obs[idx] = obs, next_obs
        self.actions[idx], self.returns[idx], self.discounts[idx] = actions, returns, discounts
        self.give_max_priority(idx)
        self.pos = (self.pos + len(idx)) % self.capacity
        self.size = min(self.size + len(idx), self.capacity)

    def give_max_priority(self, indices: np.ndarray) -> None:
        priority = np.full(len(indices), self.max_priority**self.alpha)
        self.sum_tree.update(indices, priority)
        self.min_tree.update(indices, priority)

    def sample(self, batch_size: int, beta: float):
        """Stratified sampling: one uniform draw in each of `batch_size` equal segments of the total mass. Weights are
        (N P(i))^-beta divided by the largest weight over the whole buffer."""
        total = self.sum_tree.root
        mass = (np.arange(batch_size) + self.rng.random(batch_size)) * (total / batch_size)
        indices = self.sum_tree.find_prefix_sum(np.minimum(mass, total))
        weights = importance_weights(self.sum_tree.leaves(indices), self.min_tree.root, beta)
        return self.rows(indices), indices, weights

    def rows(self, indices: np.ndarray) -> tuple:
        """The transitions at `indices`: (obs, actions, returns, discounts, next_obs)."""
        return tuple(getattr(self, name)[indices] for name in self.ARRAYS)

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        self.max_priority = max(self.max_priority, float(np.max(priorities)))
        scaled = np.asarray(priorities, dtype=np.float64) ** self.alpha
        self.sum_tree.update(indices, scaled)
        self.min_tree.update(indices, scaled)

    def state_dict(self) -> dict:
        """The filled slots only, as tensors: torch.save writes their storage without the copy pickling numpy makes."""
        filled = {name: torch.from_numpy(getattr(self, name)[: self.size]) for name in self.ARRAYS}
        trees = dict(sum_tree=self.sum_tree.nodes.copy(), min_tree=self.min_tree.nodes.copy())
        return dict(filled, **trees, max_priority=self.max_priority, pos=self.pos, size=self.size)

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size, self.max_priority = state["pos"], state["size"], state["max_priority"]
        for name in self.ARRAYS:
            getattr(self, name)[: self.size] = state[name].numpy()
        self.sum_tree.nodes[:] = state["sum_tree"]
        self.min_tree.nodes[:] = state["min_tree"]


def importance_weights(scaled_priorities: np.ndarray, min_scaled_priority: float, beta: float) -> np.ndarray:
    """w_i = (N P(i))^-beta / max_j (N P(j))^-beta = (p_i^alpha / min_j p_j^alpha)^-beta: N and the total mass
    cancel. scaled_priorities: (B,) p_i^alpha -> (B,) float32 in (0, 1]."""
    return ((scaled_priorities / min_scaled_priority) ** -beta).astype(np.float32)


class NStepWindow:
    """Turns the per-step stream of `num_envs` envs into n-step transitions. Each env keeps its last n real transitions
    (newest in slot n-1); one leaves from slot 0 once the window is full, and at an episode end every pending one
    leaves with its shorter horizon. envpool's reset steps never enter, so no transition spans two episodes."""

    def __init__(self, n: int, num_envs: int, obs_shape: tuple, obs_dtype, gamma: float):
        self.n, self.gamma = n, gamma
        self.obs = np.zeros((n, num_envs, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((n, num_envs), dtype=np.int64)
        self.rewards = np.zeros((n, num_envs), dtype=np.float64)
        self.length = np.zeros(num_envs, dtype=np.int64)  # pending transitions per env
        # discount_matrix[k, j] = gamma^(j-k) for j >= k: row k sums the rewards from slot k onwards.
        k = np.arange(n)
        self.discount_matrix = np.triu(gamma ** (k[None, :] - k[:, None]).clip(min=0).astype(np.float64))

    def push(self, obs, actions, rewards, terminated, truncated, next_obs, is_reset_step):
        """Enters one step of every env not at its reset step; returns the finished transitions as
        (obs, actions, returns, discounts, next_obs) arrays of equal length."""
        self.obs[:-1], self.actions[:-1], self.rewards[:-1] = self.obs[1:], self.actions[1:], self.rewards[1:]
        self.obs[-1], self.actions[-1], self.rewards[-1] = obs, actions, rewards
        self.length = np.where(is_reset_step, self.length, np.minimum(self.length + 1, self.n))
        ended = ~is_reset_step & (terminated | truncated)
        slot = np.arange(self.n)[:, None]
        pending = slot >= self.n - self.length[None, :]
        leaving = pending & (ended[None, :] | (slot == 0))
        k, env = np.nonzero(leaving)
        returns = (self.discount_matrix @ self.rewards)[k, env]
        # Only a termination cuts the bootstrap; a time-out bootstraps from the real last observation.
        discounts = self.gamma ** (self.n - k) * (1.0 - terminated[env].astype(np.float64))
        self.length = np.where(ended, 0, self.length - (self.length == self.n))
        return self.obs[k, env], self.actions[k, env], returns, discounts, next_obs[env]

    def state_dict(self) -> dict:
        return dict(obs=self.obs.copy(), actions=self.actions.copy(), rewards=self.rewards.copy(), length=self.length.copy())

    def load_state_dict(self, state: dict) -> None:
        for name in ("obs", "actions", "rewards", "length"):
            getattr(self, name)[...] = state[name]


class FrameReplayBuffer(PrioritizedReplayBuffer):
    """The prioritized replay of Atari, which stores each 84x84 frame once instead of two stacks of 4 per transition.

    Each environment has a ring of `capacity // num_envs` slots; slot t holds the newest frame of observation o_t, and
    whether o_t's stack is that frame repeated (envpool's first observation of a game), where the stack's older frames
    are not in the slots before t. A stack is rebuilt from the `STACK_NUM` slots ending at t; after a lost life envpool
    runs the stack on, and so do the slots. The transition that starts at o_t (as the n-step window completes it: its
    action, return, discount and the number m of steps to its bootstrap observation o_{t+m}) is kept in slot t too, and
    its priority in leaf env * ring + t % ring of the trees. envpool's reset steps start no transition, so their slots
    keep a zero priority; their observation (an episode's last) is stored for bootstrapping and for the stacks that
    run on. Writing step t frees the transitions whose frames it overwrites: the one of its slot and the next
    `STACK_NUM - 1`, whose stacks reach into it. The trees learn of it at the next `add`, in the same update as the
    new transitions: an update costs a numpy call per tree level, whatever its size."""

    STACK_NUM = 4  # frames per observation
    ARRAYS = ("frames", "repeats_newest", "actions", "returns", "discounts", "horizons")  # the saved arrays

    def __init__(self, capacity: int, num_envs: int, obs_shape: tuple, alpha: float, n_step: int, seed=None):
        self.num_envs, self.ring = num_envs, capacity // num_envs
        self.frames = np.zeros((num_envs, self.ring, *obs_shape[1:]), dtype=np.uint8)
        self.repeats_newest = np.zeros((num_envs, self.ring), dtype=bool)
        self.actions = np.zeros((num_envs, self.ring), dtype=np.int64)
        self.returns = np.zeros((num_envs, self.ring), dtype=np.float32)
        self.discounts = np.zeros((num_envs, self.ring), dtype=np.float32)
        self.horizons = np.zeros((num_envs, self.ring), dtype=np.min_scalar_type(n_step))
        self.num_added = 0  # steps written to every ring; step t is in slot t % ring
        self.freed = np.zeros(0, dtype=np.int64)  # leaves of overwritten transitions, zeroed at the next `add`
        self.start_priorities(num_envs * self.ring, alpha, seed)

    def write(self, stacks: np.ndarray) -> None:
        """Stores the newest frame of every env's stack (num_envs, STACK_NUM, 84, 84) as the next step."""
        step = self.num_added
        if step >= self.ring:  # overwrites step - ring: free it and the transitions whose stacks reach into it
            slots = (step + np.arange(self.STACK_NUM)) % self.ring
            self.freed = np.concatenate([self.freed, (np.arange(self.num_envs)[:, None] * self.ring + slots).ravel()])
        self.frames[:, step % self.ring] = stacks[:, -1]
        self.repeats_newest[:, step % self.ring] = (stacks == stacks[:, -1:]).reshape(len(stacks), -1).all(axis=1)
        self.num_added += 1

    def begin(self, stacks: np.ndarray) -> None:
        """Stores the whole stacks of the current observations (at the start, or a resume without stored replay)."""
        for k in range(1, self.STACK_NUM + 1):
            self.write(stacks[:, :k])  # the older frames first: each write stores the newest frame it is given

    def append(self, next_stacks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Stores the observations an env step returned; returns the keys of the observations before and after the
        step (num_envs,) each, which the n-step window carries instead of stacks: env + num_envs * step."""
        self.write(next_stacks)
        keys = np.arange(self.num_envs) + self.num_envs * (self.num_added - 1)
        return keys - self.num_envs, keys

    def add(self, keys, actions, returns, discounts, next_keys) -> None:
        """Stores the transitions the n-step window completed, from o_t (`keys`) to o_{t+m} (`next_keys`)."""
        env, step = keys % self.num_envs, keys // self.num_envs
        slots = step % self.ring
        self.actions[env, slots], self.returns[env, slots], self.discounts[env, slots] = actions, returns, discounts
        self.horizons[env, slots] = next_keys // self.num_envs - step
        leaves, new = np.concatenate([self.freed, env * self.ring + slots]), len(keys)
        self.sum_tree.update(leaves, np.r_[np.zeros(len(self.freed)), np.full(new, self.max_priority**self.alpha)])
        self.min_tree.update(leaves, np.r_[np.full(len(self.freed), np.inf), np.full(new, self.max_priority**self.alpha)])
        self.freed = self.freed[:0]

    def stacks(self, env: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Observations o_t of envs `env` at steps `steps`, (B,) each -> (B, STACK_NUM, 84, 84): the slots t-3..t,
        where those before the latest repeated frame in the window are that frame."""
        window = steps[:, None] - np.arange(self.STACK_NUM - 1, -1, -1)
        repeated = self.repeats_newest[env[:, None], window % self.ring] & (window >= 0)
        window = np.maximum(window, np.where(repeated, window, -1).max(axis=1, keepdims=True))
        return self.frames[env[:, None], window % self.ring]

    def rows(self, indices: np.ndarray) -> tuple:
        env, slots = np.divmod(indices, self.ring)
        newest = self.num_added - 1
        steps = newest - (newest - slots) % self.ring  # the step a slot holds now
        horizons = self.horizons[env, slots].astype(np.int64)
        columns = (self.actions, self.returns, self.discounts)
        return self.stacks(env, steps), *(array[env, slots] for array in columns), self.stacks(env, steps + horizons)

    def state_dict(self) -> dict:
        """The written slots of each ring, as tensors (a full ring without a copy), the trees and the counters."""
        written = min(self.num_added, self.ring)
        arrays = {name: torch.from_numpy(np.ascontiguousarray(getattr(self, name)[:, :written])) for name in self.ARRAYS}
        trees = dict(sum_tree=self.sum_tree.nodes.copy(), min_tree=self.min_tree.nodes.copy())
        return dict(arrays, **trees, max_priority=self.max_priority, num_added=self.num_added)

    def load_state_dict(self, state: dict) -> None:
        self.num_added, self.max_priority = state["num_added"], state["max_priority"]
        written = min(self.num_added, self.ring)
        for name in self.ARRAYS:
            getattr(self, name)[:, :written] = state[name].numpy()
        self.sum_tree.nodes[:] = state["sum_tree"]
        self.min_tree.nodes[:] = state["min_tree"]


def replay_memory_bytes(args: Args, obs_shape: tuple, obs_dtype) -> int:
    """Bytes that the replay (PrioritizedReplayBuffer, or FrameReplayBuffer on Atari) and NStepWindow will allocate.
    Per slot: obs and next obs, or on Atari one frame, a repeat flag and the horizon; an int64 action, a float32
    return and discount. Two float64 segment trees; the window of n steps of every env (Atari: int64 keys)."""
    if is_atari(args.env_id):
        slots = args.buffer_size // args.num_envs * args.num_envs
        per_slot = int(np.prod(obs_shape[1:])) + 1 + np.min_scalar_type(args.n_step).itemsize + 8 + 4 + 4
        obs_bytes = 8
    else:
        obs_bytes = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize
        slots, per_slot = args.buffer_size, 2 * obs_bytes + 8 + 4 + 4
    num_leaves = 1 << max(1, (slots - 1).bit_length())
    window = args.n_step * args.num_envs * (obs_bytes + 8 + 8) + args.num_envs * 8
    return slots * per_slot + 2 * (2 * num_leaves * 8) + window


def double_q_targets(returns, discounts, next_q_online, next_q_target) -> torch.Tensor:
    """y = R + gamma^k (1 - d) Q_target(s', argmax_a Q_online(s', a)).
    returns, discounts: (B,); next_q_online, next_q_target: (B, A) -> (B,)."""
    next_actions = next_q_online.argmax(dim=1, keepdim=True)
    return returns + discounts * next_q_target.gather(1, next_actions).squeeze(1)


def weighted_huber_loss(q_taken, targets, weights) -> torch.Tensor:
    """Importance weights scale each sample's Huber loss, its share of the gradient. q_taken, targets, weights: (B,) -> ()."""
    return (weights * F.smooth_l1_loss(q_taken, targets, reduction="none")).mean()


def linear_schedule(start: float, end: float, duration: float, t):
    """Linear from `start` at agent step 0 to `end` at step `duration`, then `end`; a `duration` of 0 is `end` from the
    first step. `t` is a step or an array of steps; the result (float64) has its shape."""
    t = np.asarray(t, dtype=np.float64)
    value = start + (end - start) * t / duration if duration > 0 else np.full_like(t, end)
    return np.clip(value, min(start, end), max(start, end))


def act(q_network: nn.Module, obs: np.ndarray, epsilon: float, num_actions: int, device: torch.device) -> np.ndarray:
    """Epsilon-greedy actions of a batch of observations: (E, *obs_shape) -> (E,) int64."""
    with torch.no_grad():
        greedy = q_network(torch.as_tensor(obs, device=device)).argmax(dim=1).cpu().numpy()
    explore = np.random.rand(len(obs)) < epsilon
    return np.where(explore, np.random.randint(num_actions, size=len(obs)), greedy)


def evaluate(weights: dict, args: Args, device: torch.device, video_folder: str) -> list[float]:
    """True scores (raw, all lives) of --eval-episodes whole games (--eval-epsilon) of the network with `weights` (a
    model file's) on training's envs seeded --seed + EVAL_SEED_OFFSET, one per env; --capture-video plays them in turn
    on ale-py and records them to `video_folder`."""
    if args.eval_episodes == 0:  # none to play (and envpool builds no zero envs)
        return []
    spec = flag_checks.check_env_id(args.env_id)
    model = DuelingQNetwork(spec.observation_space.shape, spec.action_space.n, args.hidden_size).to(device)
    model_files.put_weights(model, weights, args.model_path)
    model.eval()
    seed, num_actions = args.seed + EVAL_SEED_OFFSET, spec.action_space.n
    if args.capture_video:  # envpool does not render: a gymnasium env with the training preprocessing
        envs = gym.vector.SyncVectorEnv(
            [lambda: environments.make_video_env(args.env_id, video_folder, max_episode_steps=27000)]
        )
    else:
        envs = make_env(args.env_id, args.eval_episodes, seed)
    obs, _ = envs.reset(seed=seed)  # envpool took its seed when built and ignores this one
    quota = np.full(envs.num_envs, args.eval_episodes // envs.num_envs)  # whole games each env plays and counts
    stats, is_reset_step = episode_scores.EpisodeStats(envs.num_envs), np.zeros(envs.num_envs, dtype=bool)
    while quota.sum() > 0:
        obs, rewards, terminated, truncated, info = envs.step(act(model, obs, args.eval_epsilon, num_actions, device))
        raw_rewards, game_over = true_game_end(rewards, terminated, truncated, info)
        counted = game_over & (quota > 0)
        stats.update(raw_rewards, is_reset_step, counted)
        quota -= counted
        is_reset_step = terminated | truncated  # the next step only resets (NEXT_STEP autoreset)
    envs.close()
    return stats.scores


def train_step(q_network, target_network, optimizer, batch: tuple, weights, max_grad_norm: float, priority_eps: float):
    """One gradient step on a sampled `batch` (obs, actions, returns, discounts, next_obs tensors) with importance
    `weights` (B,). Returns the loss and the mean Q(s, a) as device tensors, the new priorities |TD error| + eps (B,)
    as an array, and whether the gradient norm was finite (a device tensor, read at logging intervals)."""
    b_obs, b_actions, b_returns, b_discounts, b_next_obs = batch
    # One online pass over obs and next obs: for small networks the per-call overhead dominates.
    q_online, next_q_online = q_network(torch.cat([b_obs, b_next_obs])).split(len(b_obs))
    with torch.no_grad():
        targets = double_q_targets(b_returns, b_discounts, next_q_online, target_network(b_next_obs))
    q_taken = q_online.gather(1, b_actions[:, None]).squeeze(1)
    loss = weighted_huber_loss(q_taken, targets, weights)
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(q_network.parameters(), max_grad_norm)
    optimizer.step()
    priorities = (targets - q_taken).detach().abs().cpu().numpy() + priority_eps
    return loss.detach(), q_taken.detach().mean(), priorities, torch.isfinite(grad_norm)


def seconds_per_update(q_network, target_network, optimizer, args, obs_shape: tuple, device) -> float:
    """Seconds one update takes, timed before the loop for the progress line's first estimate: `train_step` on copies of
    the networks (and a fresh optimizer of the same kind) with a batch of zeros of the real shapes and dtypes, the
    median of 3 calls after an untimed one (which pays for first-call allocations). Every random generator is left
    as it was, so that the run's numbers do not depend on the timing."""
    rng = checkpoint_files.rng_states()
    online, target = copy.deepcopy(q_network), copy.deepcopy(target_network)
    timed_optimizer = type(optimizer)(online.parameters(), **optimizer.defaults)
    obs = torch.as_tensor(np.zeros((args.batch_size, *obs_shape), dtype=buffer_obs_dtype(obs_shape)), device=device)
    returns = torch.zeros(args.batch_size, device=device)
    batch = (obs, torch.zeros(args.batch_size, dtype=torch.int64, device=device), returns, returns.clone(), obs.clone())
    weights = torch.ones(args.batch_size, device=device)
    times = []
    for _ in range(4):
        start = time.perf_counter()
        train_step(online, target, timed_optimizer, batch, weights, args.max_grad_norm, args.prioritized_replay_eps)
        if device.type == "cuda":  # kernels run asynchronously: the update ends when the device is done
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    checkpoint_files.set_rng_states(rng)
    return sorted(times[1:])[1]


def main(args: Args) -> list[float]:
    args = with_atari_defaults(command_line.with_minatar_defaults(args, MINATAR_DEFAULTS))
    if args.eval_only:  # rebuild a saved agent from its model file and evaluate it, no training
        args, weights = model_files.read_for_evaluation(args, __file__)
        validate_args(args)
        device, video_folder = model_files.start_evaluation(args, __file__)
        return model_files.report_evaluation(args, evaluate(weights, args, device, video_folder), video_folder)
    args, checkpoint = command_line.resume(args, __file__, CHECKPOINT_FORMAT)
    memory = validate_args(args)  # the memory the run will take, said in the start-up block
    args = flag_checks.whole_iterations(args)
    # A small MLP only pays synchronization for intra-op threads; one thread also frees results from the core count.
    atari = is_atari(args.env_id)
    cpu_threads = None if atari else 1
    with training_run.Run(args, checkpoint, __file__, CHECKPOINT_FORMAT, cpu_threads, memory=memory) as run:
        envs = make_env(args.env_id, args.num_envs, run.env_seed)
        obs_shape, num_actions = envs.single_observation_space.shape, envs.single_action_space.n
        obs_dtype = buffer_obs_dtype(obs_shape)
        device = run.device
        q_network = DuelingQNetwork(obs_shape, num_actions, args.hidden_size).to(device)
        target_network = DuelingQNetwork(obs_shape, num_actions, args.hidden_size).to(device)
        print(f"  torso: {q_network.torso_name}")
        target_network.load_state_dict(q_network.state_dict())
        optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, eps=args.adam_eps, fused=True)
        alpha = args.prioritized_replay_alpha
        if atari:  # the window carries keys of the frames in the replay instead of stacks
            rb = FrameReplayBuffer(args.buffer_size, args.num_envs, obs_shape, alpha, args.n_step, seed=args.seed)
            window = NStepWindow(args.n_step, args.num_envs, (), np.int64, args.gamma)
        else:
            rb = PrioritizedReplayBuffer(args.buffer_size, obs_shape, obs_dtype, alpha, seed=args.seed)
            window = NStepWindow(args.n_step, args.num_envs, obs_shape, obs_dtype, args.gamma)
        stats = episode_scores.EpisodeStats(args.num_envs)

        num_iterations = args.total_timesteps // args.num_envs
        # Every envs.step's actions, so that a resumed run can bring the envs back by replaying them.
        action_log = np.zeros((num_iterations, args.num_envs), dtype=np.min_scalar_type(num_actions - 1))
        obs, _ = envs.reset()
        is_reset_step = np.zeros(args.num_envs, dtype=bool)
        losses, q_means = torch.zeros(100, device=device), torch.zeros(100, device=device)  # read only when logged
        start_iteration, updates, last_target_update = 0, 0, 0
        learn_from = args.learning_starts  # updates once past learn_from

        def checkpoint_state(iterations_done: int) -> dict:
            """All a resume needs, as plain values."""
            learner = dict(q_network=q_network.state_dict(), target_network=target_network.state_dict())
            learner |= dict(optimizer=optimizer.state_dict(), updates=updates)
            actors = dict(obs=obs.copy(), is_reset_step=is_reset_step.copy(), window=window.state_dict())
            logs = dict(iteration=iterations_done, stats=stats.state_dict(), action_log=action_log[:iterations_done].copy())
            logs |= dict(losses=losses.detach().cpu().clone(), q_means=q_means.detach().cpu().clone())
            # the sampling generator is saved even without the buffer: sampling goes on drawing from it
            replay = dict(rb=rb.state_dict() if args.checkpoint_replay else None, rng=rb.rng.bit_generator.state)
            replay |= dict(last_target_update=last_target_update)
            return learner | actors | logs | replay

        if checkpoint:
            with run.restoring() as saved:
                q_network.load_state_dict(saved["q_network"])
                target_network.load_state_dict(saved["target_network"])
                optimizer.load_state_dict(saved["optimizer"])
                obs[:] = saved["obs"]
                is_reset_step[:] = saved["is_reset_step"]
                window.load_state_dict(saved["window"])
                stats.load_state_dict(saved["stats"])
                action_log[: len(saved["action_log"])] = saved["action_log"]
                losses.copy_(saved["losses"])
                q_means.copy_(saved["q_means"])
                if args.checkpoint_replay:
                    rb.load_state_dict(saved["rb"])
                rb.rng.bit_generator.state = saved["rng"]
                start_iteration, updates = saved["iteration"], saved["updates"]
                last_target_update = saved["last_target_update"]
            if saved["rb"] is None:  # an empty buffer: act for another learning_starts steps before sampling from it
                learn_from = start_iteration * args.num_envs + args.learning_starts
                run.note_empty_replay(learn_from)
            envs, obs = run.fast_forward(envs, action_log[:start_iteration], obs, stats)
            if args.resume_fresh_envs:  # new games: every env's next step is a reset step; partial scores dropped
                is_reset_step[:] = True
                stats.drop_games_in_progress()
                window.length[:] = 0  # the dropped games' pending n-step transitions would add the new games' rewards
            if atari and saved["rb"] is None:
                window.length[:] = 0  # the frames of the pending transitions were not saved
        if atari and (not checkpoint or saved["rb"] is None):
            rb.begin(obs)  # the frames of the current stacks, which the next ones run on from
        # One update every train_frequency agent steps, made only at the iterations whose global_step is a multiple of it.
        updates_per_step = math.gcd(args.num_envs, args.train_frequency) / (args.train_frequency * args.num_envs)
        timed = seconds_per_update(q_network, target_network, optimizer, args, obs_shape, device)
        progress = run.progress(start_iteration * args.num_envs, updates_per_step, timed)
        # The NaN stop, kept on the device and read at logging intervals: no wait for the device at every update.
        updates_finite = torch.ones((), dtype=torch.bool, device=device)

        for iteration in range(start_iteration + 1, num_iterations + 1):
            global_step = iteration * args.num_envs
            epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step)
            actions = act(q_network, obs, epsilon, num_actions, device)
            action_log[iteration - 1] = actions
            next_obs, rewards, terminated, truncated, info = envs.step(actions)
            terminated = environments.terminated_at_step_cap(terminated, truncated, info)  # true score: all lives, unclipped
            raw_rewards, game_over = true_game_end(rewards, terminated, truncated, info)
            stats.update(raw_rewards, is_reset_step, game_over & ~is_reset_step, run.writer, global_step)
            held, next_held = rb.append(next_obs) if atari else (obs, next_obs)  # Atari: keys of the stored frames
            rb.add(*window.push(held, actions, rewards, terminated, truncated, next_held, is_reset_step))
            obs, is_reset_step = next_obs, terminated | truncated

            if global_step > learn_from and global_step % args.train_frequency == 0:
                beta = linear_schedule(args.prioritized_replay_beta, 1.0, args.total_timesteps, global_step)
                batch, indices, weights = rb.sample(args.batch_size, beta)
                batch = tuple(torch.as_tensor(x, device=device) for x in batch)
                if args.anneal_lr:
                    optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - global_step / args.total_timesteps)
                weights = torch.as_tensor(weights, device=device)
                loss, q_mean, priorities, finite = train_step(
                    q_network, target_network, optimizer, batch, weights, args.max_grad_norm, args.prioritized_replay_eps
                )
                updates_finite &= finite
                rb.update_priorities(indices, priorities)
                losses[updates % 100], q_means[updates % 100] = loss, q_mean
                updates += 1
                if global_step - last_target_update >= args.target_network_frequency:
                    target_network.load_state_dict(q_network.state_dict())
                    last_target_update = global_step
                if updates % 100 == 0:
                    run.check_finite(updates_finite, global_step)
                    run.writer.add_scalar("losses/td_loss", losses.mean().item(), global_step)
                    run.writer.add_scalar("losses/q_values", q_means.mean().item(), global_step)
                    run.writer.add_scalar("charts/beta", beta, global_step)
                    run.writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                    run.writer.add_scalar("charts/epsilon", epsilon, global_step)
                    run.writer.add_scalar("charts/SPS", progress.sps(global_step), global_step)

            is_last = iteration == num_iterations
            progress.print(global_step, stats.recent, force=is_last)
            due = run.checkpoint_due(global_step, args.num_envs, is_last)
            if due or is_last:  # also read between logging intervals: no checkpoint or model of weights a NaN reached
                run.check_finite(updates_finite, global_step)
            if due:
                keys = ("q_network", "target_network", "optimizer")
                run.save(global_step, checkpoint_state(iteration), learned=keys)
            if run.stopped:  # a signal asked to stop: the checkpoint says how to continue
                break

        envs.close()
        if args.save_model and not run.stopped and (model_path := run.save_model(q_network.state_dict())):
            run.log_evaluation(model_path, evaluate(q_network.state_dict(), args, device, run.video_folder))
        run.finish(stats.scores)
        return stats.scores


if __name__ == "__main__":
    main(command_line.parse(Args, minatar=MINATAR_DEFAULTS, atari=ATARI_DEFAULTS))
