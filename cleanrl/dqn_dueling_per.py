"""Double DQN with a dueling head, n-step returns and proportional prioritized experience replay.

The online network picks the next action and the target network values it (Double DQN); the network
splits into a state-value and an advantage stream recombined as Q = V + A - mean_a A (dueling); and
transitions are replayed with probability proportional to |TD error|^alpha from a sum tree, with
importance-sampling weights that correct the bias (PER).

Papers: van Hasselt et al. 2016 (arXiv:1509.06461), Wang et al. 2016 (arXiv:1511.06581),
Schaul et al. 2016 (arXiv:1511.05952).
Docs: docs/rl-algorithms/dqn_dueling_per.md
"""

import contextlib
import os
import random
import signal
import time
import types
from dataclasses import dataclass
from typing import NamedTuple, Optional

import envpool
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda will be enabled when available"""
    track: bool = False
    """if toggled, the run is tracked with Weights and Biases"""
    wandb_project_name: str = "cleanrl-q"
    """the wandb project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of the wandb project"""
    capture_video: bool = False
    """if toggled, record videos of the evaluation episodes to `videos/` (needs the `video` extra)"""
    save_model: bool = False
    """if toggled, save the model to `runs/{run_name}` and evaluate it"""
    eval_episodes: int = 10
    """number of episodes of the evaluation after `--save-model`"""

    env_id: str = "CartPole-v1"
    """the id of the envpool environment (classic control or Atari, e.g. `Breakout-v5`)"""
    total_timesteps: int = 120_000
    """total environment steps of the experiment, summed over the vectorized environments"""
    num_envs: int = 8
    """the number of parallel environments"""
    learning_rate: float = 1e-3
    """the learning rate of the Adam optimizer"""
    anneal_lr: bool = True
    """if toggled, anneal the learning rate linearly to zero over the run (keeps the final policy stable)"""
    buffer_size: int = 100_000
    """the replay capacity in n-step transitions (Atari stores obs and next obs: about 56 KB each)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    n_step: int = 3
    """the number of steps of the n-step return (1 = one-step Double DQN)"""
    target_network_frequency: int = 500
    """the number of environment steps between two copies of the online network into the target network"""
    batch_size: int = 256
    """the number of transitions of one gradient step"""
    train_frequency: int = 8
    """the number of environment steps between two gradient steps (a multiple of --num-envs)"""
    learning_starts: int = 5_000
    """the environment step at which learning starts"""
    start_e: float = 1.0
    """the starting epsilon of the epsilon-greedy exploration"""
    end_e: float = 0.02
    """the final epsilon"""
    exploration_fraction: float = 0.2
    """the fraction of `total_timesteps` over which epsilon decays from start-e to end-e"""
    alpha: float = 0.6
    """the priority exponent: P(i) is proportional to p_i^alpha (0 = uniform replay)"""
    beta_start: float = 0.4
    """the initial importance-sampling exponent, annealed linearly to 1 at the end of the run"""
    priority_eps: float = 1e-6
    """added to |TD error| so that every transition keeps a non-zero priority"""
    max_grad_norm: float = 10.0
    """the global gradient-norm clip"""
    hidden_size: int = 128
    """the width of the MLP torso and of each dueling stream (vector observations only)"""
    checkpoint_every: int = 0
    """write a resumable checkpoint every this many agent steps (0: only on SIGINT/SIGTERM)"""
    checkpoint_replay: bool = False
    """also store the replay buffer in checkpoints (large, but the resumed run is then exact)"""
    resume: Optional[str] = None
    """continue the run saved in this checkpoint, in the same run directory (and W&B run)"""


def validate_args(args: Args) -> None:
    """Stops with one clear message on a flag combination the algorithm cannot run."""
    checks = [
        ("total-timesteps", args.total_timesteps, args.total_timesteps > 0, "a positive integer"),
        ("num-envs", args.num_envs, args.num_envs >= 1, "an integer >= 1"),
        ("n-step", args.n_step, args.n_step >= 1, "an integer >= 1"),
        ("batch-size", args.batch_size, args.batch_size >= 1, "an integer >= 1"),
        ("buffer-size", args.buffer_size, args.buffer_size >= args.batch_size, f"at least --batch-size={args.batch_size}"),
        (
            "buffer-size",
            args.buffer_size,
            args.buffer_size >= args.num_envs * args.n_step,
            f"at least --num-envs * --n-step = {args.num_envs * args.n_step}",
        ),
        (
            "learning-starts",
            args.learning_starts,
            args.learning_starts >= max(args.batch_size, args.num_envs * args.n_step),
            f"at least --batch-size={args.batch_size} and --num-envs * --n-step = {args.num_envs * args.n_step}",
        ),
        ("eval-episodes", args.eval_episodes, args.eval_episodes >= 1, "an integer >= 1"),
        (
            "train-frequency",
            args.train_frequency,
            args.train_frequency > 0 and args.train_frequency % args.num_envs == 0,
            f"a positive multiple of --num-envs={args.num_envs}",
        ),
        ("target-network-frequency", args.target_network_frequency, args.target_network_frequency > 0, "a positive integer"),
        ("alpha", args.alpha, 0.0 <= args.alpha <= 1.0, "a number in [0, 1]"),
        ("beta-start", args.beta_start, 0.0 <= args.beta_start <= 1.0, "a number in [0, 1]"),
        ("gamma", args.gamma, 0.0 <= args.gamma <= 1.0, "a number in [0, 1]"),
        ("priority-eps", args.priority_eps, args.priority_eps > 0, "a positive number"),
        ("learning-rate", args.learning_rate, args.learning_rate > 0, "a positive number"),
        ("exploration-fraction", args.exploration_fraction, 0.0 < args.exploration_fraction <= 1.0, "a number in (0, 1]"),
        ("start-e", args.start_e, 0.0 <= args.start_e <= 1.0, "a number in [0, 1]"),
        ("end-e", args.end_e, 0.0 <= args.end_e <= 1.0, "a number in [0, 1]"),
        ("checkpoint-every", args.checkpoint_every, args.checkpoint_every >= 0, "an integer >= 0"),
    ]
    for flag, value, ok, allowed in checks:
        if not ok:
            raise SystemExit(f"error: --{flag}={value}: must be {allowed}")
    if args.env_id not in envpool.list_all_envs():
        raise SystemExit(f"error: --env-id={args.env_id}: not an envpool environment id")
    if not isinstance(envpool.make_spec(args.env_id).action_space, gym.spaces.Discrete):
        raise SystemExit(f"error: --env-id={args.env_id}: needs a discrete action space")
    if args.resume is not None and not os.path.isfile(args.resume):
        raise SystemExit(f"error: --resume={args.resume}: no such file")
    # numpy allocates lazily, so an oversized buffer would only fail (or start swapping) hours into the run.
    needed = replay_memory_bytes(args, envpool.make_spec(args.env_id).observation_space.shape, buffer_obs_dtype(args.env_id))
    available = available_memory_bytes()
    if needed > available:
        raise SystemExit(
            f"error: --buffer-size={args.buffer_size}: the replay needs about {needed / 1e9:,.1f} GB "
            f"but {available / 1e9:,.1f} GB are available; lower --buffer-size"
        )


def replay_memory_bytes(args: Args, obs_shape: tuple, obs_dtype) -> int:
    """Bytes that PrioritizedReplayBuffer(args.buffer_size, ...) and NStepWindow will allocate: obs and next
    obs, action (int64), return and discount (float32) per slot, two float64 segment trees, and the window."""
    obs_bytes = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize
    num_leaves = 1 << max(1, (args.buffer_size - 1).bit_length())
    per_transition = 2 * obs_bytes + 8 + 4 + 4
    window = args.n_step * args.num_envs * (obs_bytes + 8 + 8) + args.num_envs * 8
    return args.buffer_size * per_transition + 2 * (2 * num_leaves * 8) + window


def available_memory_bytes() -> int:
    """MemAvailable of /proc/meminfo (free RAM plus reclaimable caches); free pages where it is missing."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def is_atari(env_id: str) -> bool:
    """Image observations (stacked 84x84 frames) mean an Atari game."""
    return len(envpool.make_spec(env_id).observation_space.shape) == 3


def buffer_obs_dtype(env_id: str):
    """Frames are stored as uint8, vectors as float32."""
    return np.uint8 if is_atari(env_id) else np.float32


def make_env(env_id: str, num_envs: int, seed: int, training: bool = True):
    """Vectorized envpool environments; Atari with the DQN preprocessing (life loss and reward clipping
    only while training)."""
    kwargs = dict(num_threads=1)  # cheaper than a thread pool for classic control's tiny steps
    if is_atari(env_id):
        kwargs = dict(
            episodic_life=training,
            reward_clip=training,
            stack_num=4,
            noop_max=30,
            max_episode_steps=27000,
            repeat_action_probability=0.0,
        )
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **kwargs)


def dueling_combine(value: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """Q = V + A - mean_a A. value: (B, 1), advantage: (B, A) -> (B, A)."""
    return value + advantage - advantage.mean(dim=1, keepdim=True)


class DuelingQNetwork(nn.Module):
    """A shared torso (Nature CNN for frames, one dense layer for vectors) feeding a value and an
    advantage stream of two dense layers each."""

    def __init__(self, obs_shape: tuple, num_actions: int, hidden_size: int = 128):
        super().__init__()
        self.is_image = len(obs_shape) == 3
        if self.is_image:
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
        else:
            self.torso = nn.Sequential(nn.Linear(int(np.prod(obs_shape)), hidden_size), nn.ReLU())
            features = hidden_size
        self.value = nn.Sequential(nn.Linear(features, hidden_size), nn.ReLU(), nn.Linear(hidden_size, 1))
        self.advantage = nn.Sequential(nn.Linear(features, hidden_size), nn.ReLU(), nn.Linear(hidden_size, num_actions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float() / 255.0 if self.is_image else x.float()
        z = self.torso(x)
        return dueling_combine(self.value(z), self.advantage(z))


class SegmentTree:
    """A complete binary tree in one flat array: root at 1, leaf i at `num_leaves + i`, node k has
    children 2k and 2k+1. Each inner node holds `combine` (np.add or np.minimum) of its children.
    Batch updates and sum-tree searches walk all items of a batch up or down the tree together,
    one level per numpy operation: O(B log n) work, O(log n) Python steps."""

    def __init__(self, capacity: int, combine=np.add, neutral: float = 0.0):
        self.depth = max(1, (capacity - 1).bit_length())
        self.num_leaves = 1 << self.depth
        self.combine = combine
        self.nodes = np.full(2 * self.num_leaves, neutral, dtype=np.float64)

    @property
    def root(self) -> float:
        return self.nodes[1]

    def leaves(self, indices: np.ndarray) -> np.ndarray:
        return self.nodes[indices + self.num_leaves]

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Sets leaves `indices` to `values`; of repeated indices the last value wins."""
        indices, values = np.asarray(indices), np.asarray(values, dtype=np.float64)
        # Reversed np.unique keeps the last occurrence: fancy assignment alone leaves duplicates undefined.
        unique, last = np.unique(indices[::-1], return_index=True)
        nodes = unique + self.num_leaves
        self.nodes[nodes] = values[::-1][last]
        for _ in range(self.depth):
            nodes >>= 1
            # Parents are recomputed from their children rather than shifted by deltas: a parent
            # shared by several leaves gets the same value from each write, and the sums carry no
            # rounding drift however many updates are made.
            self.nodes[nodes] = self.combine(self.nodes[2 * nodes], self.nodes[2 * nodes + 1])

    def find_prefix_sum(self, mass: np.ndarray) -> np.ndarray:
        """Sum tree only. For each mass in [0, root], the leaf i with sum(leaves < i) <= mass <
        sum(leaves <= i). Never returns a zero leaf: at mass == root, or when rounding pushes the
        mass past a subtree, the descent stays in the last subtree with positive sum."""
        mass = np.array(mass, dtype=np.float64)
        nodes = np.ones(mass.shape, dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * nodes
            left_sum = self.nodes[left]
            go_right = (mass >= left_sum) & (self.nodes[left + 1] > 0)
            mass = np.where(go_right, mass - left_sum, mass)
            nodes = left + go_right
        return nodes - self.num_leaves


class ReplayBatch(NamedTuple):
    obs: np.ndarray  # (B, *obs_shape)
    actions: np.ndarray  # (B,) int64
    returns: np.ndarray  # (B,) discounted n-step reward sum
    discounts: np.ndarray  # (B,) gamma^k of the bootstrap, 0 after a termination
    next_obs: np.ndarray  # (B, *obs_shape) the observation to bootstrap from


class PrioritizedReplayBuffer:
    """Proportional prioritized replay (Schaul et al. 2016) over n-step transitions, FIFO when full.
    The sum tree holds p_i^alpha for sampling, the min tree the smallest one for the max IS weight."""

    def __init__(self, capacity: int, obs_shape: tuple, obs_dtype, alpha: float, seed: Optional[int] = None):
        self.capacity, self.alpha = capacity, alpha
        self.obs = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.next_obs = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros(capacity, dtype=np.int64)
        self.returns = np.zeros(capacity, dtype=np.float32)
        self.discounts = np.zeros(capacity, dtype=np.float32)
        self.sum_tree = SegmentTree(capacity, np.add, 0.0)
        self.min_tree = SegmentTree(capacity, np.minimum, np.inf)
        self.max_priority = 1.0  # largest priority seen so far; new transitions enter with it
        self.pos, self.size = 0, 0
        self.rng = np.random.default_rng(seed)

    def add(self, obs, actions, returns, discounts, next_obs) -> None:
        """Stores a batch of K transitions, overwriting the oldest ones when full."""
        idx = (self.pos + np.arange(len(actions))) % self.capacity
        self.obs[idx], self.next_obs[idx] = obs, next_obs
        self.actions[idx], self.returns[idx], self.discounts[idx] = actions, returns, discounts
        priority = np.full(len(idx), self.max_priority**self.alpha)
        self.sum_tree.update(idx, priority)
        self.min_tree.update(idx, priority)
        self.pos = (self.pos + len(idx)) % self.capacity
        self.size = min(self.size + len(idx), self.capacity)

    def sample(self, batch_size: int, beta: float):
        """Stratified sampling: one uniform draw in each of `batch_size` equal segments of the total
        mass. Weights are (N P(i))^-beta divided by the largest weight over the whole buffer."""
        total = self.sum_tree.root
        mass = (np.arange(batch_size) + self.rng.random(batch_size)) * (total / batch_size)
        indices = self.sum_tree.find_prefix_sum(np.minimum(mass, total))
        weights = importance_weights(self.sum_tree.leaves(indices), self.min_tree.root, beta)
        batch = ReplayBatch(
            self.obs[indices], self.actions[indices], self.returns[indices], self.discounts[indices], self.next_obs[indices]
        )
        return batch, indices, weights

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        self.max_priority = max(self.max_priority, float(np.max(priorities)))
        scaled = np.asarray(priorities, dtype=np.float64) ** self.alpha
        self.sum_tree.update(indices, scaled)
        self.min_tree.update(indices, scaled)

    def state_dict(self) -> dict:
        """Everything sampling depends on. The filled slots only, as tensors: torch.save writes tensor
        storage straight to the file, where pickling a numpy array would first copy it in memory."""
        filled = {
            name: torch.from_numpy(getattr(self, name)[: self.size])
            for name in ("obs", "next_obs", "actions", "returns", "discounts")
        }
        return dict(
            filled,
            sum_tree=self.sum_tree.nodes.copy(),
            min_tree=self.min_tree.nodes.copy(),
            max_priority=self.max_priority,
            pos=self.pos,
            size=self.size,
        )

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size, self.max_priority = state["pos"], state["size"], state["max_priority"]
        for name in ("obs", "next_obs", "actions", "returns", "discounts"):
            getattr(self, name)[: self.size] = state[name].numpy()
        self.sum_tree.nodes[:] = state["sum_tree"]
        self.min_tree.nodes[:] = state["min_tree"]


def importance_weights(scaled_priorities: np.ndarray, min_scaled_priority: float, beta: float) -> np.ndarray:
    """w_i = (N P(i))^-beta / max_j (N P(j))^-beta = (p_i^alpha / min_j p_j^alpha)^-beta: N and the
    total mass cancel. scaled_priorities: (B,) p_i^alpha -> (B,) float32 in (0, 1]."""
    return ((scaled_priorities / min_scaled_priority) ** -beta).astype(np.float32)


class NStepWindow:
    """Turns the per-step stream of `num_envs` environments into n-step transitions. Each env keeps its
    last n real transitions (newest in slot n-1); an n-step transition leaves from slot 0 once the window
    is full, and at an episode end every pending one leaves with its shorter horizon. Reset steps of
    the autoreset are never entered, so no transition spans two episodes."""

    def __init__(self, n: int, num_envs: int, obs_shape: tuple, obs_dtype, gamma: float):
        self.n, self.gamma = n, gamma
        self.obs = np.zeros((n, num_envs, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((n, num_envs), dtype=np.int64)
        self.rewards = np.zeros((n, num_envs), dtype=np.float64)
        self.length = np.zeros(num_envs, dtype=np.int64)  # pending transitions per env
        # discount_matrix[k, j] = gamma^(j-k) for j >= k: row k sums the rewards from slot k onwards.
        k = np.arange(n)
        self.discount_matrix = np.triu(gamma ** (k[None, :] - k[:, None]).clip(min=0).astype(np.float64))

    def push(self, obs, actions, rewards, terminated, truncated, next_obs, is_real):
        """Enters one step of every env whose `is_real` is set; returns the finished transitions as
        (obs, actions, returns, discounts, next_obs) arrays of equal length."""
        self.obs[:-1], self.actions[:-1], self.rewards[:-1] = self.obs[1:], self.actions[1:], self.rewards[1:]
        self.obs[-1], self.actions[-1], self.rewards[-1] = obs, actions, rewards
        self.length = np.where(is_real, np.minimum(self.length + 1, self.n), self.length)
        ended = is_real & (terminated | truncated)
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


def double_q_targets(returns, discounts, next_q_online, next_q_target) -> torch.Tensor:
    """y = R + gamma^k (1 - d) Q_target(s', argmax_a Q_online(s', a)).
    returns, discounts: (B,); next_q_online, next_q_target: (B, A) -> (B,)."""
    next_actions = next_q_online.argmax(dim=1, keepdim=True)
    return returns + discounts * next_q_target.gather(1, next_actions).squeeze(1)


def weighted_huber_loss(q_taken, targets, weights) -> torch.Tensor:
    """Importance weights scale each sample's Huber loss, i.e. its share of the gradient.
    q_taken, targets, weights: (B,) -> scalar."""
    return (weights * F.smooth_l1_loss(q_taken, targets, reduction="none")).mean()


def linear_schedule(start: float, end: float, duration: float, t: float) -> float:
    return start + (end - start) * min(t / duration, 1.0)


def evaluate(
    model_path: str,
    env_id: str,
    eval_episodes: int,
    device: torch.device,
    epsilon: float = 0.05,
    hidden_size: int = 128,
    seed: int = 1,
    capture_video: bool = False,
    run_name: str = "eval",
):
    """Plays `eval_episodes` full games epsilon-greedily with a saved model; returns their scores."""
    spec = envpool.make_spec(env_id)
    model = DuelingQNetwork(spec.observation_space.shape, spec.action_space.n, hidden_size).to(device)
    model.load_state_dict(torch.load(model_path, map_location=device, weights_only=True))
    model.eval()
    if capture_video:
        return evaluate_with_video(model, env_id, eval_episodes, device, epsilon, seed, run_name)
    envs = make_env(env_id, eval_episodes, seed, training=False)
    obs, _ = envs.reset()
    scores, score, done = np.zeros(eval_episodes), np.zeros(eval_episodes), np.zeros(eval_episodes, bool)
    while not done.all():
        with torch.no_grad():
            actions = model(torch.as_tensor(obs, device=device)).argmax(dim=1).cpu().numpy()
        explore = np.random.rand(eval_episodes) < epsilon
        actions = np.where(explore, np.random.randint(spec.action_space.n, size=eval_episodes), actions)
        obs, rewards, terminated, truncated, info = envs.step(actions)
        score += np.where(done, 0.0, info["reward"] if "reward" in info else rewards)
        game_over = (info["terminated"].astype(bool) if "lives" in info else terminated) | truncated
        scores = np.where(game_over & ~done, score, scores)
        done |= game_over  # each env plays exactly one game; later games of an env are ignored
    return scores.tolist()


def evaluate_with_video(model, env_id, eval_episodes, device, epsilon, seed, run_name):
    """Evaluation through a rendering gymnasium env (envpool does not render), recorded to videos/."""
    try:
        import moviepy  # noqa: F401

        if is_atari(env_id):
            import ale_py

            gym.register_envs(ale_py)
    except ImportError as error:
        raise SystemExit(f"error: --capture-video: needs the `video` extra (ale-py, moviepy): {error}")
    if is_atari(env_id):
        game = env_id.split("-")[0]
        env = gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0, render_mode="rgb_array")
        env = gym.wrappers.AtariPreprocessing(
            env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False, grayscale_obs=True
        )
        env = gym.wrappers.FrameStackObservation(env, 4)
    else:
        env = gym.make(env_id, render_mode="rgb_array")
    env = gym.wrappers.RecordVideo(env, f"videos/{run_name}", episode_trigger=lambda _: True)
    scores = []
    for episode in range(eval_episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, score = False, 0.0
        while not done:
            if random.random() < epsilon:
                action = env.action_space.sample()
            else:
                with torch.no_grad():
                    action = int(model(torch.as_tensor(np.asarray(obs)[None], device=device)).argmax())
            obs, reward, terminated, truncated, _ = env.step(action)
            score, done = score + float(reward), terminated or truncated
        scores.append(score)
    env.close()
    return scores


CHECKPOINT_FORMAT = 1
CHECKPOINT_KEYS = {
    "format",
    "args",
    "run_name",
    "wandb_id",
    "iteration",
    "global_step",
    "last_target_update",
    "q_network",
    "target_network",
    "optimizer",
    "rng",
    "episode_scores",
    "score",
    "length",
    "is_reset_step",
    "obs",
    "window",
    "action_log",
    "losses",
    "q_means",
    "replay",
}
# These keep their command-line value on --resume; every other flag comes from the checkpoint.
RESUME_OVERRIDES = ("resume", "checkpoint_every", "cuda", "track")


@contextlib.contextmanager
def stop_on_signals():
    """The first SIGINT/SIGTERM asks the loop to checkpoint and stop after the current step; a second one
    exits at once. The previous handlers come back on exit, since tests call main in-process."""
    stop = types.SimpleNamespace(requested=False)

    def handler(signum, frame):
        if stop.requested:
            raise KeyboardInterrupt
        stop.requested = True
        print("stopping after this step; a second signal exits at once", flush=True)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old_handler in previous.items():
            signal.signal(sig, old_handler)


def rng_states(replay_rng: np.random.Generator) -> dict:
    return dict(
        python=random.getstate(),
        numpy=np.random.get_state(),
        torch=torch.get_rng_state(),
        cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        replay=replay_rng.bit_generator.state,
    )


def set_rng_states(states: dict, replay_rng: np.random.Generator) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    replay_rng.bit_generator.state = states["replay"]


def save_checkpoint(state: dict, path: str) -> None:
    """Atomic: a crash while writing leaves the previous checkpoint intact."""
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def load_checkpoint(path: str) -> dict:
    def unreadable(reason):
        return SystemExit(f"error: --resume={path}: not a readable checkpoint ({reason})")

    try:
        # weights_only=False: the checkpoint holds numpy RNG states; only load checkpoints you wrote.
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # a truncated or garbage file can fail in many ways inside torch/pickle
        raise unreadable(f"{type(error).__name__}: {error}") from None
    if not isinstance(checkpoint, dict):
        raise unreadable(f"holds a {type(checkpoint).__name__}, not a dict")
    if checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise unreadable(f"format {checkpoint.get('format')!r}, expected {CHECKPOINT_FORMAT}")
    missing = CHECKPOINT_KEYS - checkpoint.keys()
    if missing:
        raise unreadable(f"missing {', '.join(sorted(missing))}")
    return checkpoint


def resumed_args(given: Args, saved: dict) -> Args:
    """The checkpoint's flags, except RESUME_OVERRIDES from the command line; says which given flags
    (those that differ from the defaults) are ignored because they differ from the checkpoint."""
    defaults, fields = vars(Args()), vars(given)
    saved = {k: v for k, v in saved.items() if k in fields}
    ignored = [
        k for k, v in fields.items() if k not in RESUME_OVERRIDES and v != defaults[k] and v != saved.get(k, defaults[k])
    ]
    if ignored:
        print(
            "--resume: ignoring flags that differ from the checkpoint: "
            + ", ".join(f"--{k.replace('_', '-')}={fields[k]}" for k in ignored)
        )
    return Args(**{**saved, **{k: fields[k] for k in RESUME_OVERRIDES}})


def replay_actions(envs, action_log: np.ndarray) -> np.ndarray:
    """Brings freshly reset envs back to where the checkpoint left them: envpool cannot save its state,
    but it is deterministic given its seed and the actions. Returns the last observation."""
    print(
        f"--resume: replaying {len(action_log)} logged environment steps ({len(action_log) * envs.num_envs} "
        "agent steps) to restore the environments"
    )
    obs, _ = envs.reset()
    for actions in action_log:
        obs, *_ = envs.step(actions.astype(np.int64))
    return obs


def main(args: Args) -> list[float]:
    with stop_on_signals() as stop:
        validate_args(args)
        checkpoint = None
        if args.resume is not None:
            checkpoint = load_checkpoint(args.resume)
            args = resumed_args(args, checkpoint["args"])
            validate_args(args)  # the memory pre-flight, now for the checkpoint's buffer size
        run_name = checkpoint["run_name"] if checkpoint else f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
        run_dir = f"runs/{run_name}"
        checkpoint_path = f"{run_dir}/checkpoint.pt"
        wandb_id = None
        if args.track:
            import wandb

            saved_id = checkpoint["wandb_id"] if checkpoint else None
            wandb.init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                sync_tensorboard=True,
                config=vars(args),
                name=run_name,
                save_code=True,
                id=saved_id,
                resume="allow" if saved_id else None,
            )
            wandb_id = wandb.run.id
        if checkpoint:
            # purge_step drops the events a killed run logged after its checkpoint's step (those at the
            # step itself belong to the checkpoint and are not logged again).
            writer = SummaryWriter(run_dir, purge_step=checkpoint["global_step"] + 1)
        else:
            writer = SummaryWriter(run_dir)
            writer.add_text(
                "hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())
            )

        random.seed(args.seed)
        np.random.seed(args.seed)
        torch.manual_seed(args.seed)
        torch.backends.cudnn.deterministic = args.torch_deterministic
        device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

        envs = make_env(args.env_id, args.num_envs, args.seed)
        obs_shape, num_actions = envs.observation_space.shape, envs.action_space.n
        obs_dtype = buffer_obs_dtype(args.env_id)
        if device.type == "cpu" and len(obs_shape) == 1:
            # An MLP this small only pays synchronization for intra-op threads, and results stop depending on
            # the core count.
            torch.set_num_threads(1)
        q_network = DuelingQNetwork(obs_shape, num_actions, args.hidden_size).to(device)
        target_network = DuelingQNetwork(obs_shape, num_actions, args.hidden_size).to(device)
        target_network.load_state_dict(q_network.state_dict())
        optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)
        rb = PrioritizedReplayBuffer(args.buffer_size, obs_shape, obs_dtype, args.alpha, seed=args.seed)
        window = NStepWindow(args.n_step, args.num_envs, obs_shape, obs_dtype, args.gamma)

        num_iterations = args.total_timesteps // args.num_envs
        steps_per_update = args.train_frequency // args.num_envs
        # Every envs.step's actions, so that a resumed run can bring the envs back by replaying them.
        action_log = np.zeros((num_iterations, args.num_envs), dtype=np.min_scalar_type(num_actions - 1))
        episode_scores: list[float] = []
        score = np.zeros(args.num_envs)
        length = np.zeros(args.num_envs, dtype=np.int64)
        is_reset_step = np.zeros(args.num_envs, dtype=bool)
        start_iteration, last_target_update, learning_starts = 1, 0, args.learning_starts
        losses, q_means = [], []
        if checkpoint:
            start_iteration = checkpoint["iteration"] + 1
            q_network.load_state_dict(checkpoint["q_network"])
            target_network.load_state_dict(checkpoint["target_network"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            window.load_state_dict(checkpoint["window"])
            episode_scores = list(checkpoint["episode_scores"])
            score, length, is_reset_step = checkpoint["score"], checkpoint["length"], checkpoint["is_reset_step"]
            last_target_update = checkpoint["last_target_update"]
            losses, q_means = list(checkpoint["losses"]), list(checkpoint["q_means"])
            if checkpoint["replay"] is not None:
                rb.load_state_dict(checkpoint["replay"])
            else:  # an empty buffer: act for another learning_starts steps before sampling from it
                learning_starts = checkpoint["global_step"] + args.learning_starts
            action_log[: checkpoint["iteration"]] = checkpoint["action_log"]
            obs = replay_actions(envs, checkpoint["action_log"])
            if not np.array_equal(obs, checkpoint["obs"]):
                raise SystemExit(
                    f"error: --resume={args.resume}: environment replay diverged from the checkpoint "
                    "(different envpool version or platform?)"
                )
            set_rng_states(checkpoint["rng"], rb.rng)  # last: building the networks consumed random numbers
            print(f"--resume: continuing {run_name} from step {checkpoint['global_step']}")
        else:
            obs, _ = envs.reset()
        global_step = (start_iteration - 1) * args.num_envs
        last_checkpoint = None
        start_time = last_print = time.time()
        start_step = global_step

        def checkpoint_state() -> dict:
            return dict(
                format=CHECKPOINT_FORMAT,
                args=vars(args),
                run_name=run_name,
                wandb_id=wandb_id,
                iteration=iteration,
                global_step=global_step,
                last_target_update=last_target_update,
                q_network=q_network.state_dict(),
                target_network=target_network.state_dict(),
                optimizer=optimizer.state_dict(),
                rng=rng_states(rb.rng),
                episode_scores=list(episode_scores),
                score=score.copy(),
                length=length.copy(),
                is_reset_step=is_reset_step.copy(),
                obs=obs.copy(),
                window=window.state_dict(),
                action_log=action_log[:iteration].copy(),
                losses=list(losses),
                q_means=list(q_means),
                replay=rb.state_dict() if args.checkpoint_replay else None,
            )

        for iteration in range(start_iteration, num_iterations + 1):
            global_step = iteration * args.num_envs
            epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step)
            with torch.no_grad():
                actions = q_network(torch.as_tensor(obs, device=device)).argmax(dim=1).cpu().numpy()
            explore = np.random.rand(args.num_envs) < epsilon
            actions = np.where(explore, np.random.randint(num_actions, size=args.num_envs), actions)
            action_log[iteration - 1] = actions
            next_obs, rewards, terminated, truncated, info = envs.step(actions)

            # True game score: unclipped, over all lives, ended by game over or time-out.
            is_real = ~is_reset_step
            score += np.where(is_real, info["reward"] if "reward" in info else rewards, 0.0)
            length += is_real
            game_over = is_real & ((info["terminated"].astype(bool) if "lives" in info else terminated) | truncated)
            for env in np.flatnonzero(game_over):
                episode_scores.append(float(score[env]))
                writer.add_scalar("charts/episodic_return", score[env], global_step)
                writer.add_scalar("charts/episodic_length", length[env], global_step)
            score[game_over], length[game_over] = 0.0, 0

            rb.add(*window.push(obs, actions, rewards, terminated, truncated, next_obs, is_real))
            obs = next_obs
            is_reset_step = terminated | truncated

            if global_step > learning_starts and iteration % steps_per_update == 0:
                beta = linear_schedule(args.beta_start, 1.0, args.total_timesteps, global_step)
                batch, indices, weights = rb.sample(args.batch_size, beta)
                b_obs, b_actions, b_returns, b_discounts, b_next_obs = (torch.as_tensor(x, device=device) for x in batch)
                # One online pass over obs and next obs: for small networks the per-call overhead dominates.
                q_online, next_q_online = q_network(torch.cat([b_obs, b_next_obs])).split(args.batch_size)
                with torch.no_grad():
                    targets = double_q_targets(b_returns, b_discounts, next_q_online, target_network(b_next_obs))
                q_taken = q_online.gather(1, b_actions[:, None]).squeeze(1)
                td_errors = targets - q_taken
                loss = weighted_huber_loss(q_taken, targets, torch.as_tensor(weights, device=device))
                if args.anneal_lr:
                    optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - global_step / args.total_timesteps)
                optimizer.zero_grad()
                loss.backward()
                try:  # a NaN/inf loss or Q-value reaches the gradient norm: stop before it reaches the weights
                    nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm, error_if_nonfinite=True)
                except RuntimeError:
                    raise SystemExit(
                        f"error: non-finite loss or Q-values at step {global_step}; "
                        f"last good checkpoint: {last_checkpoint or 'none written'}"
                    ) from None
                optimizer.step()
                rb.update_priorities(indices, td_errors.detach().abs().cpu().numpy() + args.priority_eps)
                losses.append(loss.detach())
                q_means.append(q_taken.detach().mean())

                if global_step - last_target_update >= args.target_network_frequency:
                    target_network.load_state_dict(q_network.state_dict())
                    last_target_update = global_step
                if len(losses) == 100:
                    writer.add_scalar("losses/td_loss", torch.stack(losses).mean().item(), global_step)
                    writer.add_scalar("losses/q_values", torch.stack(q_means).mean().item(), global_step)
                    writer.add_scalar("charts/beta", beta, global_step)
                    writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                    writer.add_scalar("charts/epsilon", epsilon, global_step)
                    sps = int((global_step - start_step) / (time.time() - start_time))
                    writer.add_scalar("charts/SPS", sps, global_step)
                    losses, q_means = [], []

            if time.time() - last_print > 10 or iteration == num_iterations:
                last_print = time.time()
                sps = int((global_step - start_step) / (last_print - start_time))
                mean = np.mean(episode_scores[-100:]) if episode_scores else float("nan")
                eta = time.strftime("%H:%M:%S", time.gmtime((args.total_timesteps - global_step) / max(sps, 1)))
                print(f"step {global_step:>9}/{args.total_timesteps} | SPS {sps:>6} | return(100) {mean:8.2f} | ETA {eta}")

            every = args.checkpoint_every
            periodic = every > 0 and (
                global_step // every > (global_step - args.num_envs) // every or iteration == num_iterations
            )
            if periodic or stop.requested:
                save_checkpoint(checkpoint_state(), checkpoint_path)
                last_checkpoint = checkpoint_path
            if stop.requested:
                print(
                    f"checkpoint written to {checkpoint_path}; continue with: "
                    f"python cleanrl/dqn_dueling_per.py --resume {checkpoint_path}"
                )
                break

        envs.close()
        if args.save_model and not stop.requested:
            model_path = f"{run_dir}/{args.exp_name}.cleanrl_model"
            torch.save(q_network.state_dict(), model_path)
            print(f"model saved to {model_path}")
            eval_scores = evaluate(
                model_path,
                args.env_id,
                args.eval_episodes,
                device,
                epsilon=0.05,
                hidden_size=args.hidden_size,
                seed=args.seed + 1,
                capture_video=args.capture_video,
                run_name=run_name,
            )
            for episode, eval_score in enumerate(eval_scores):
                writer.add_scalar("eval/episodic_return", eval_score, episode)
        writer.close()
        if args.track:
            wandb.finish()
        return episode_scores


if __name__ == "__main__":
    main(tyro.cli(Args))
