"""R2D2 (Recurrent Replay Distributed DQN) for Atari, with envpool.

An LSTM Q-network learns from prioritized replay of fixed-length sequences: each sequence starts from the
recurrent state the actor had when it was collected, the first `burn_in` steps only warm that state up, and the
remaining steps are trained with n-step double-Q targets under value rescaling. Many vectorized environments act
with fixed per-actor epsilons in place of the paper's distributed actors. Frames are stored once, single and
uint8; the replay builds frame stacks and sequences from them as index windows.

Paper: Kapturowski et al., "Recurrent Experience Replay in Distributed Reinforcement Learning", ICLR 2019.
Docs: docs/rl-algorithms/r2d2.md
"""

import os
import random
import signal
import time
from dataclasses import dataclass, replace
from typing import Optional

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
    """if toggled, cuda will be used when available"""
    track: bool = False
    """if toggled, the experiment is tracked with Weights and Biases"""
    wandb_project_name: str = "cleanrl-q"
    """the wandb project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of the wandb project"""
    capture_video: bool = False
    """whether to record videos of the evaluation episodes to `videos/`"""
    save_model: bool = False
    """whether to save the model to `runs/{run_name}` and evaluate it"""
    eval_episodes: int = 10
    """the number of evaluation episodes after saving the model"""

    env_id: str = "Breakout-v5"
    """the envpool id of the environment"""
    total_timesteps: int = 10_000_000
    """total environment steps (4 frames each), summed over all environments"""
    num_envs: int = 32
    """the number of vectorized environments (actors)"""
    buffer_size: int = 1_000_000
    """replay capacity in stored frames (all environments together; about 7 KB each)"""
    learning_starts: int = 50_000
    """environment steps collected before learning starts"""
    batch_size: int = 64
    """sequences per learner update"""
    seq_len: int = 80
    """steps per replayed sequence, burn-in included"""
    burn_in: int = 40
    """first steps of a sequence that only warm up the recurrent state (no gradient)"""
    overlap: int = 40
    """steps shared by adjacent sequences of an episode"""
    n_step: int = 5
    """steps of the n-step return"""
    gamma: float = 0.997
    """the discount factor"""
    frame_stack: int = 4
    """frames per network input, stacked from the single stored frames"""
    learning_rate: float = 1e-4
    """Adam learning rate"""
    adam_eps: float = 1e-3
    """Adam epsilon"""
    max_grad_norm: float = 40.0
    """global gradient-norm clip"""
    target_update_interval: int = 2500
    """learner updates between copies of the online network into the target network"""
    replay_ratio: float = 4.0
    """average number of times each collected step is replayed as a trained (non burn-in) step"""
    priority_exponent: float = 0.9
    """priority exponent alpha of prioritized replay"""
    importance_exponent: float = 0.6
    """importance-sampling exponent beta (constant)"""
    priority_eta: float = 0.9
    """mix of max and mean absolute TD error in a sequence's priority"""
    base_epsilon: float = 0.4
    """base of the per-actor epsilons eps_i = base^(1 + alpha i / (N - 1))"""
    epsilon_alpha: float = 7.0
    """exponent range alpha of the per-actor epsilons"""
    final_base_epsilon: float = 0.4
    """base epsilon at the end of its linear decay"""
    epsilon_decay_fraction: float = 0.0
    """fraction of training over which the base epsilon decays linearly to `final_base_epsilon`"""
    hidden_size: int = 512
    """units of the LSTM and of each dueling head"""
    log_interval: int = 100
    """learner updates between logged losses"""
    checkpoint_every: int = 0
    """write a resumable checkpoint every this many agent steps (0: only when a SIGINT/SIGTERM stops the run)"""
    checkpoint_replay: bool = False
    """also store the replay buffer in checkpoints (large, but the resumed run is then exact)"""
    resume: Optional[str] = None
    """continue the run saved in this checkpoint, in the same run directory (and W&B run)"""


def make_env(env_id: str, num_envs: int, seed: int):
    # full games (no life-loss terminal), raw rewards (value rescaling instead of clipping), single frames
    return envpool.make(
        env_id,
        env_type="gymnasium",
        num_envs=num_envs,
        seed=seed,
        episodic_life=False,
        reward_clip=False,
        stack_num=1,
        noop_max=30,
        max_episode_steps=27000,
        repeat_action_probability=0.0,
        full_action_space=False,
    )


def push_frame(stack: np.ndarray, frame: np.ndarray, is_first: np.ndarray) -> np.ndarray:
    """The actor's frame stack (N, k, 84, 84): zeros before an episode's first frame, as the replay pads."""
    stack = np.where(is_first[:, None, None, None], 0, stack)
    return np.concatenate([stack[:, 1:], frame[:, None]], axis=1)


class QNetwork(nn.Module):
    """Torso -> LSTM (input also gets the previous reward and one-hot previous action) -> dueling heads."""

    def __init__(self, frame_stack: int, num_actions: int, hidden_size: int):
        super().__init__()
        self.num_actions = num_actions
        self.torso = nn.Sequential(  # Nature CNN
            nn.Conv2d(frame_stack, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3136, hidden_size),
            nn.ReLU(),
        )
        self.lstm = nn.LSTM(hidden_size + num_actions + 1, hidden_size)
        self.value = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.ReLU(), nn.Linear(hidden_size, 1))
        self.advantage = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.ReLU(), nn.Linear(hidden_size, num_actions))

    def forward(self, obs, prev_action, prev_reward, is_first, state):
        """obs (T, B, ...), prev_action (T, B) long (-1: none), prev_reward (T, B), is_first (T, B) bool,
        state = (h, c) each (B, H). Returns q (T, B, A) and the final state."""
        steps, batch = is_first.shape
        features = self.torso(obs.flatten(0, 1).float() / 255.0).view(steps, batch, -1)
        one_hot = F.one_hot(prev_action.clamp(min=0), self.num_actions) * (prev_action >= 0).unsqueeze(-1)
        x = torch.cat([features, one_hot.float(), prev_reward.unsqueeze(-1)], dim=-1)
        # the state restarts from zero at an episode's first observation; episodes only begin in a sequence's
        # first steps, so the LSTM runs fused over the few segments between those positions
        h, c = state[0].unsqueeze(0), state[1].unsqueeze(0)
        outputs, start = [], 0
        for t in [*is_first.any(1).nonzero().flatten().tolist(), steps]:
            if t > start:
                out, (h, c) = self.lstm(x[start:t], (h, c))
                outputs.append(out)
            if t < steps:
                keep = (~is_first[t]).float().unsqueeze(-1)
                h, c = h * keep, c * keep
            start = t
        out = torch.cat(outputs)
        advantage = self.advantage(out)
        return self.value(out) + advantage - advantage.mean(-1, keepdim=True), (h[0], c[0])


class SumTree:
    """Sum tree over `capacity` leaves; vectorized updates and stratified sampling (no loop per item)."""

    def __init__(self, capacity: int):
        self.leaves = 1 << (capacity - 1).bit_length()
        self.nodes = np.zeros(2 * self.leaves, dtype=np.float64)

    def update(self, idx: np.ndarray, values: np.ndarray) -> None:
        idx = np.asarray(idx, dtype=np.int64) + self.leaves
        self.nodes[idx] = values
        while len(idx) and idx[0] > 1:  # all leaves sit at the same depth
            idx = np.unique(idx // 2)
            self.nodes[idx] = self.nodes[2 * idx] + self.nodes[2 * idx + 1]

    def total(self) -> float:
        return self.nodes[1]

    def get(self, idx: np.ndarray) -> np.ndarray:
        return self.nodes[np.asarray(idx) + self.leaves]

    def sample(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """One draw in each of `batch_size` equal segments of the total mass."""
        mass = (np.arange(batch_size) + rng.random(batch_size)) * (self.total() / batch_size)
        idx = np.ones(batch_size, dtype=np.int64)
        while idx[0] < self.leaves:
            left = self.nodes[2 * idx]
            go_right = mass >= left
            mass = np.where(go_right, mass - left, mass)
            idx = 2 * idx + go_right
        leaf = idx - self.leaves
        empty = self.nodes[idx] <= 0  # float rounding can end on an empty leaf next to the last full one
        if empty.any():
            leaf[empty] = leaf[~empty][0] if (~empty).any() else np.argmax(self.nodes[self.leaves :])
        return leaf


def max_sequences(capacity: int, num_envs: int, stride: int, window: int) -> int:
    """Sequence slots of the replay: short episodes start more windows than one per stride, so room for twice
    that many."""
    return 2 * capacity // stride + 4 * num_envs * (window // stride + 2)


class SequenceReplay:
    """Every observation is stored once, in one ring-buffered step stream per environment. A sequence is an
    index window into its stream: start slot, the positions [lo, hi) that belong to its episode (lo < 0: the
    episode began before the window), the actor's LSTM state before the first slot and a priority. A window
    spans `seq_len + n_step` slots (the last n only feed the targets) and never crosses an episode: positions
    outside [lo, hi) are padding. The first windows of an episode reach back before it (lo >= 0, zero state), so
    its first steps are trained too, not only used as burn-in."""

    def __init__(
        self,
        num_envs,
        capacity,
        obs_shape,
        obs_dtype,
        hidden_size,
        seq_len,
        burn_in,
        overlap,
        n_step,
        priority_exponent,
        frame_stack,
    ):
        self.num_envs, self.steps = num_envs, capacity // num_envs
        self.seq_len, self.burn_in, self.stride, self.window = seq_len, burn_in, seq_len - overlap, seq_len + n_step
        self.priority_exponent = priority_exponent
        self.frame_stack = frame_stack
        self.history = max(1, frame_stack - 1)  # slots read before a window: previous action, older frames
        self.obs = np.zeros((num_envs, self.steps, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((num_envs, self.steps), dtype=np.uint8)
        self.rewards = np.zeros((num_envs, self.steps), dtype=np.float32)
        self.terminated = np.zeros((num_envs, self.steps), dtype=bool)
        self.truncated = np.zeros((num_envs, self.steps), dtype=bool)
        self.max_seqs = max_sequences(capacity, num_envs, self.stride, self.window)
        self.seq_env = np.zeros(self.max_seqs, dtype=np.int64)
        self.seq_start = np.zeros(self.max_seqs, dtype=np.int64)  # absolute step of position 0
        self.seq_lo = np.zeros(self.max_seqs, dtype=np.int64)
        self.seq_hi = np.zeros(self.max_seqs, dtype=np.int64)
        self.seq_h = np.zeros((self.max_seqs, hidden_size), dtype=np.float32)
        self.seq_c = np.zeros((self.max_seqs, hidden_size), dtype=np.float32)
        self.tree = SumTree(self.max_seqs)
        self.open = np.zeros(0, dtype=np.int64)  # windows still being filled (priority 0 until complete)
        self.next_seq, self.t, self.max_priority = 0, 0, 1.0
        self.episode_start = np.zeros(num_envs, dtype=np.int64)

    def state_dict(self, with_arrays: bool) -> dict:
        """The write position and episode starts always (windows opened after a resume need them); the stored
        steps, sequences, open windows and sum tree only `with_arrays`. Arrays go out as tensors sharing their
        memory: torch.save writes those without a pickled copy of a large replay."""
        state = dict(t=self.t, episode_start=self.episode_start.copy())
        if with_arrays:
            names = [
                "obs",
                "actions",
                "rewards",
                "terminated",
                "truncated",
                "seq_env",
                "seq_start",
                "seq_lo",
                "seq_hi",
                "seq_h",
                "seq_c",
                "open",
            ]
            state.update({name: torch.from_numpy(getattr(self, name)) for name in names})
            state.update(tree=torch.from_numpy(self.tree.nodes), next_seq=self.next_seq, max_priority=self.max_priority)
        return state

    def load_state_dict(self, state: dict) -> None:
        for name, value in state.items():
            value = value.numpy() if isinstance(value, torch.Tensor) else value
            if name == "tree":
                self.tree.nodes = value
            else:
                setattr(self, name, value)

    def bytes_per_observation(self) -> float:
        arrays = [
            self.obs,
            self.actions,
            self.rewards,
            self.terminated,
            self.truncated,
            self.seq_env,
            self.seq_start,
            self.seq_lo,
            self.seq_hi,
            self.seq_h,
            self.seq_c,
        ]
        return (sum(a.nbytes for a in arrays) + self.tree.nodes.nbytes) / (self.num_envs * self.steps)

    def _new_windows(self, envs, starts, lo, h, c):
        ids = (self.next_seq + np.arange(len(envs))) % self.max_seqs
        self.next_seq += len(envs)
        self.tree.update(ids, np.zeros(len(ids)))  # evicts the oldest sequences (FIFO)
        self.seq_env[ids], self.seq_start[ids], self.seq_lo[ids] = envs, starts, lo
        self.seq_h[ids], self.seq_c[ids] = h, c
        self.open = np.concatenate([self.open, ids])

    def add(self, obs, actions, rewards, terminated, truncated, is_first, is_reset, h, c):
        """One vector step: obs (N, ...) fed to the network, its action, reward and flags. `is_reset` marks
        envpool's reset step (its obs is the previous episode's final one), h and c the LSTM state before obs."""
        t, slot = self.t, self.t % self.steps
        self.obs[:, slot], self.actions[:, slot], self.rewards[:, slot] = obs, actions, rewards
        self.terminated[:, slot], self.truncated[:, slot] = terminated, truncated
        if t % self.stride == 0:  # forget windows whose slots the ring is about to overwrite
            stale = self.seq_start - self.history <= t - self.steps + self.stride
            stale_ids = np.flatnonzero(stale & (self.tree.get(np.arange(self.max_seqs)) > 0))
            self.tree.update(stale_ids, np.zeros(len(stale_ids)))
        # close windows that are full or whose episode ended with this step's final observation
        env, start = self.seq_env[self.open], self.seq_start[self.open]
        ended, full = is_reset[env], t - start + 1 >= self.window
        close = ended | full
        hi = np.where(ended, t - start + 1, self.window)
        trained = np.where(ended, hi - 2, self.seq_len - 1) >= self.burn_in  # at least one trained step
        keep = self.open[close & trained]
        self.seq_hi[keep] = hi[close & trained]
        self.tree.update(keep, np.full(len(keep), self.max_priority**self.priority_exponent))
        self.open = self.open[~close]
        # open new windows; a window's trained part starts every `stride` steps of an episode
        first = np.flatnonzero(is_first)
        self.episode_start[first] = t
        since_start = t - self.episode_start + self.burn_in
        regular = np.flatnonzero(~is_first & ~is_reset & (since_start % self.stride == 0))
        if len(regular):
            lo = self.episode_start[regular] - t
            self._new_windows(regular, np.full(len(regular), t), lo, h[regular], c[regular])
        zeros = np.zeros((len(first), self.seq_h.shape[1]), dtype=np.float32)
        for offset in range(0, self.burn_in + 1, self.stride) if len(first) else []:  # reach back before it
            lo = np.full(len(first), self.burn_in - offset)
            self._new_windows(first, t - lo, lo, zeros, zeros)
        self.t += 1

    def sample(self, batch_size: int, rng: np.random.Generator, importance_exponent: float, device):
        """Prioritized draw of `batch_size` sequences with their normalized importance weights."""
        ids = self.tree.sample(batch_size, rng)
        probs = self.tree.get(ids) / self.tree.total()
        weights = (np.count_nonzero(self.tree.get(np.arange(self.max_seqs))) * probs) ** -importance_exponent
        batch = self.gather(ids, device)
        batch["weights"] = torch.as_tensor((weights / weights.max()).astype(np.float32), device=device)
        return ids, batch

    def gather(self, ids: np.ndarray, device) -> dict:
        """Time-major tensors over the `seq_len + n_step` positions of the sequences `ids`."""
        pos = np.arange(-self.history, self.window)[:, None]
        env = self.seq_env[ids][None]
        slots = (self.seq_start[ids][None] + pos) % self.steps
        valid = (pos >= self.seq_lo[ids][None]) & (pos < self.seq_hi[ids][None])  # padding: another episode
        frames = self.obs[env, slots]
        frames = frames * valid.reshape(*valid.shape, *([1] * (frames.ndim - 2))).astype(frames.dtype)
        obs = np.stack([frames[self.history - j : len(frames) - j] for j in reversed(range(self.frame_stack))], 2)
        actions = np.where(valid, self.actions[env, slots].astype(np.int64), -1)
        rewards = np.where(valid, self.rewards[env, slots], 0.0).astype(np.float32)
        done = valid & (self.terminated[env, slots] | self.truncated[env, slots])
        now, before = slice(self.history, None), slice(self.history - 1, -1)
        batch = dict(
            obs=obs,
            actions=actions[now],
            rewards=rewards[now],
            prev_action=actions[before],
            prev_reward=rewards[before],
            terminated=valid[now] & self.terminated[env, slots[now]],
            done=done[now],
            valid=valid[now],
            is_reset=done[before],
            is_first=valid[now] & ~valid[before],
            h=self.seq_h[ids],
            c=self.seq_c[ids],
        )
        batch = {k: torch.as_tensor(v, device=device) for k, v in batch.items()}
        batch["prev_reward"] = batch["prev_reward"].clamp(-1, 1)  # as the actor sees it
        return batch

    def update_priorities(self, ids: np.ndarray, priorities: np.ndarray) -> None:
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.update(ids, priorities**self.priority_exponent)


def replay_memory_bytes(args: Args, obs_shape: tuple, obs_dtype) -> int:
    """Bytes that SequenceReplay allocates for these flags: the step streams and the per-sequence records with
    their sum tree (computed from the flags, before anything is allocated)."""
    steps, stride, window = args.buffer_size // args.num_envs, args.seq_len - args.overlap, args.seq_len + args.n_step
    per_step = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize + 1 + 4 + 1 + 1  # obs, action, reward, flags
    max_seqs = max_sequences(args.buffer_size, args.num_envs, stride, window)
    per_sequence = 4 * 8 + 2 * args.hidden_size * 4  # env, start, lo, hi; h and c
    tree = 2 * (1 << (max_seqs - 1).bit_length()) * 8
    return args.num_envs * (steps * per_step + 8) + max_seqs * per_sequence + tree  # + each env's episode start


def available_memory_bytes() -> int:
    """MemAvailable of /proc/meminfo (free plus reclaimable), or the free pages where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


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
    mask = mask.to(abs_td.dtype)
    masked = abs_td * mask
    return eta * masked.amax(0) + (1 - eta) * masked.sum(0) / mask.sum(0).clamp(min=1)


def actor_epsilons(num_envs: int, base_epsilon: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """eps_i = base^(1 + alpha i / (N - 1)); a single actor gets `base`."""
    fraction = np.arange(num_envs) / max(num_envs - 1, 1)
    return base_epsilon ** (1 + alpha * fraction)


def sequence_td_errors(q_net, target_net, batch, burn_in: int, seq_len: int, n_step: int, gamma: float):
    """TD errors delta (T, B) in rescaled space, the trained-step mask (T, B) and Q(s, a) (T, B) for the
    T = seq_len - burn_in trained positions. Burn-in runs without gradient; the target network is unrolled over
    the same sequence from the same stored state."""
    inputs = [batch[k] for k in ("obs", "prev_action", "prev_reward", "is_first")]
    state = (batch["h"], batch["c"])
    with torch.no_grad():
        _, burned_in = q_net(*[x[:burn_in] for x in inputs], state)
        target_q, _ = target_net(*inputs, state)
    q, _ = q_net(*[x[burn_in:] for x in inputs], burned_in)  # positions burn_in .. seq_len + n_step - 1
    steps = seq_len - burn_in
    q_taken = q[:steps].gather(-1, batch["actions"][burn_in:seq_len].clamp(min=0).unsqueeze(-1)).squeeze(-1)
    # n-step return that stops at the episode end; only termination cuts the bootstrap, a time-out keeps it
    returns = torch.zeros_like(q_taken)
    alive = torch.ones_like(q_taken, dtype=torch.bool)
    offset = torch.full_like(batch["actions"][:steps], n_step)
    bootstrap = torch.ones_like(alive)
    for k in range(n_step):
        rows = slice(burn_in + k, seq_len + k)
        returns += alive * gamma**k * batch["rewards"][rows]
        ends = alive & batch["done"][rows]
        offset = torch.where(ends, k + 1, offset)
        bootstrap = torch.where(ends, ~batch["terminated"][rows], bootstrap)
        alive = alive & ~batch["done"][rows]
    with torch.no_grad():
        rows = offset + torch.arange(steps, device=offset.device).unsqueeze(-1)  # index into q (starts at burn_in)
        cols = torch.arange(q.shape[1], device=q.device).expand_as(rows)
        best = q.detach()[rows, cols].argmax(-1, keepdim=True)  # double Q: online net picks, target net rates
        next_value = target_q[rows + burn_in, cols].gather(-1, best).squeeze(-1)
        target = value_rescale(returns + bootstrap * gamma**offset * inverse_value_rescale(next_value))
    mask = batch["valid"][burn_in:seq_len] & ~batch["is_reset"][burn_in:seq_len]
    return (target - q_taken) * mask, mask, q_taken


def evaluate(
    model_path,
    env_id,
    eval_episodes,
    device,
    epsilon=0.001,
    frame_stack=4,
    hidden_size=512,
    capture_video=False,
    run_name="eval",
    seed=1,
):
    """Runs a saved model on fresh environments; returns the first `eval_episodes` game scores."""
    envs = make_env(env_id, eval_episodes, seed)
    obs, _ = envs.reset()
    num_actions = int(envs.action_space.n)
    model = QNetwork(frame_stack, num_actions, hidden_size).to(device)
    model.load_state_dict(torch.load(model_path, map_location=device, weights_only=True))
    if capture_video:
        record_video(model, env_id, frame_stack, device, run_name)
    state = (torch.zeros(eval_episodes, hidden_size, device=device),) * 2
    prev_action, prev_reward = np.full(eval_episodes, -1), np.zeros(eval_episodes, dtype=np.float32)
    stack = np.zeros((eval_episodes, frame_stack, 84, 84), np.uint8)
    stack = push_frame(stack, obs[:, -1], np.ones(eval_episodes, bool))
    scores, returns, finished = [], np.zeros(eval_episodes), np.zeros(eval_episodes, dtype=bool)
    while not finished.all():
        q, state = model(*to_step_inputs(stack, prev_action, prev_reward, device), state)
        actions = q[0].argmax(-1).cpu().numpy()
        explore = np.random.random(eval_episodes) < epsilon
        actions = np.where(explore, np.random.randint(num_actions, size=eval_episodes), actions)
        obs, reward, terminated, truncated, info = envs.step(actions)
        returns += info["reward"] * ~finished
        game_over = info["terminated"].astype(bool) | truncated
        for i in np.flatnonzero(game_over & ~finished):
            scores.append(float(returns[i]))
        finished |= game_over
        stack = push_frame(stack, obs[:, -1], np.zeros(eval_episodes, bool))
        prev_action, prev_reward = actions, np.clip(reward, -1, 1).astype(np.float32)
    return scores


def to_step_inputs(obs, prev_action, prev_reward, device, is_first=None):
    """Numpy actor inputs for one step -> (1, N, ...) tensors for QNetwork.forward."""
    is_first = np.zeros(len(obs), dtype=bool) if is_first is None else is_first
    arrays = (obs, np.asarray(prev_action, dtype=np.int64), prev_reward, is_first)
    return [torch.as_tensor(a, device=device).unsqueeze(0) for a in arrays]


def record_video(model, env_id, frame_stack, device, run_name):
    """Records one episode through ale-py with the training preprocessing (envpool does not render)."""
    try:
        import ale_py

        gym.register_envs(ale_py)
        env = gym.make(f"ALE/{env_id}", frameskip=1, repeat_action_probability=0.0, render_mode="rgb_array")
        env = gym.wrappers.AtariPreprocessing(
            env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False, grayscale_obs=True
        )
        env = gym.wrappers.RecordVideo(env, f"videos/{run_name}")
        frame, _ = env.reset(seed=0)
    except (ImportError, gym.error.DependencyNotInstalled) as e:
        raise SystemExit(f"error: --capture-video: needs the video extra (pip install 'cleanrl-q[video]'): {e}")
    state = (torch.zeros(1, model.lstm.hidden_size, device=device),) * 2
    stack = push_frame(np.zeros((1, frame_stack, 84, 84), np.uint8), frame[None], np.ones(1, bool))
    prev_action, prev_reward, done = [-1], np.zeros(1, dtype=np.float32), False
    while not done:
        q, state = model(*to_step_inputs(stack, prev_action, prev_reward, device), state)
        prev_action = [int(q[0, 0].argmax())]
        frame, reward, terminated, truncated, _ = env.step(prev_action[0])
        stack = push_frame(stack, frame[None], np.zeros(1, bool))
        prev_reward, done = np.array([np.clip(reward, -1, 1)], dtype=np.float32), terminated or truncated
    env.close()


def validate_args(args: Args) -> None:
    if args.env_id not in envpool.list_all_envs():
        raise SystemExit(f"error: --env-id={args.env_id}: not an envpool environment id")
    if not isinstance(envpool.make_spec(args.env_id).action_space, gym.spaces.Discrete):
        raise SystemExit(f"error: --env-id={args.env_id}: needs a discrete action space")
    checks = [
        ("num-envs", args.num_envs, args.num_envs >= 1, "at least 1"),
        ("seq-len", args.seq_len, args.seq_len >= 2, "at least 2"),
        ("frame-stack", args.frame_stack, args.frame_stack >= 1, "at least 1"),
        ("burn-in", args.burn_in, 0 <= args.burn_in < args.seq_len, f"0 <= burn-in < --seq-len={args.seq_len}"),
        ("overlap", args.overlap, 0 <= args.overlap < args.seq_len, f"0 <= overlap < --seq-len={args.seq_len}"),
        (
            "n-step",
            args.n_step,
            1 <= args.n_step <= args.seq_len - args.burn_in,
            f"1 <= n-step <= seq-len - burn-in = {args.seq_len - args.burn_in}",
        ),
        ("batch-size", args.batch_size, args.batch_size >= 1, "at least 1"),
        (
            "buffer-size",
            args.buffer_size,
            args.buffer_size // args.num_envs >= 2 * (args.seq_len + args.n_step),
            f"at least num-envs * 2 * (seq-len + n-step) = {args.num_envs * 2 * (args.seq_len + args.n_step)}",
        ),
        ("replay-ratio", args.replay_ratio, args.replay_ratio > 0, "> 0"),
        ("target-update-interval", args.target_update_interval, args.target_update_interval >= 1, "at least 1"),
        ("base-epsilon", args.base_epsilon, 0 <= args.base_epsilon <= 1, "in [0, 1]"),
        ("final-base-epsilon", args.final_base_epsilon, 0 <= args.final_base_epsilon <= 1, "in [0, 1]"),
        ("epsilon-decay-fraction", args.epsilon_decay_fraction, 0 <= args.epsilon_decay_fraction <= 1, "in [0, 1]"),
        ("priority-eta", args.priority_eta, 0 <= args.priority_eta <= 1, "in [0, 1]"),
        ("total-timesteps", args.total_timesteps, args.total_timesteps >= args.num_envs, "at least --num-envs"),
        ("checkpoint-every", args.checkpoint_every, args.checkpoint_every >= 0, "at least 0 (0: only on a signal)"),
    ]
    for flag, value, ok, allowed in checks:
        if not ok:
            raise SystemExit(f"error: --{flag}={value}: {allowed}")
    if args.resume is not None and not os.path.isfile(args.resume):
        raise SystemExit(f"error: --resume={args.resume}: no such file")
    frame_shape = envpool.make_spec(args.env_id).observation_space.shape[1:]  # the spec's is a stack of frames
    needed = replay_memory_bytes(args, frame_shape, np.uint8)
    available = available_memory_bytes()
    if needed > available:
        raise SystemExit(
            f"error: --buffer-size={args.buffer_size}: the replay needs about {needed / 1e9:,.1f} GB but "
            f"{available / 1e9:,.1f} GB are available; lower --buffer-size"
        )


class StopRequest:
    """The first SIGINT/SIGTERM asks the training loop to stop after the current step, with a checkpoint; a second
    one exits at once. `restore` puts the previous handlers back (tests call main in-process)."""

    def __init__(self):
        self.requested = False
        self.previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handle(self, signum, frame):
        if self.requested:
            self.restore()
            raise KeyboardInterrupt
        self.requested = True
        print("stopping after this step; a second signal exits at once")

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


CHECKPOINT_VERSION = 1
CHECKPOINT_KEYS = [
    "version",
    "args",
    "run_name",
    "wandb_id",
    "iteration",
    "global_step",
    "updates",
    "update_credit",
    "learn_from",
    "q_net",
    "target_net",
    "optimizer",
    "rng",
    "scores",
    "episode_return",
    "episode_length",
    "obs",
    "h",
    "c",
    "is_first",
    "is_reset",
    "prev_action",
    "prev_reward",
    "stack",
    "action_log",
    "replay",
]
FLAGS_KEPT_ON_RESUME = ["resume", "checkpoint_every", "cuda", "track"]


def rng_states(rng: np.random.Generator) -> dict:
    return dict(
        python=random.getstate(),
        numpy=np.random.get_state(),
        torch=torch.get_rng_state(),
        cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        generator=rng.bit_generator.state,
    )


def set_rng_states(states: dict, rng: np.random.Generator) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    rng.bit_generator.state = states["generator"]


def save_checkpoint(state: dict, path: str) -> None:
    """Written beside and then renamed over the previous one: a crash while writing leaves that one intact."""
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def load_checkpoint(path: str) -> dict:
    try:
        # weights_only=False: a checkpoint holds numpy and python RNG states (the model file stays weights-only)
        state = torch.load(path, map_location="cpu", weights_only=False)
        if not isinstance(state, dict):
            raise ValueError(f"holds a {type(state).__name__}, not a dict")
        if state.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"format version {state.get('version')!r}, expected {CHECKPOINT_VERSION}")
        missing = [key for key in CHECKPOINT_KEYS if key not in state]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        foreign = sorted(set(state["args"]) ^ set(vars(Args())))
        if foreign:
            raise ValueError(f"written by another script: flags {', '.join(foreign)} differ")
    except Exception as e:
        raise SystemExit(f"error: --resume={path}: not a readable checkpoint ({e})") from None
    return state


def resumed_args(saved: dict, given: Args) -> Args:
    """The checkpoint's flags, apart from those a later session may change; names the given flags it ignores."""
    defaults, given_values = vars(Args()), vars(given)
    ignored = [
        key
        for key, value in given_values.items()
        if key not in FLAGS_KEPT_ON_RESUME and value != saved.get(key) and value != defaults[key]
    ]
    if ignored:
        flags = ", ".join(f"--{key.replace('_', '-')}={given_values[key]}" for key in ignored)
        print(f"resume: these flags differ from the checkpoint's and are ignored: {flags}")
    return replace(Args(**saved), **{key: given_values[key] for key in FLAGS_KEPT_ON_RESUME})


def step_through(envs, action_log: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """Restores just reset environments by stepping them through the logged actions (envpool cannot save its
    state, but it is deterministic given its seed and the actions); returns the last observation."""
    print(f"resume: replaying {len(action_log)} logged environment steps")
    for actions in action_log:
        obs, *_ = envs.step(actions.astype(np.int64))
    return obs


def main(args: Args) -> list[float]:
    checkpoint = None
    if args.resume is not None:  # the run goes on with the checkpoint's flags: those are the ones to check
        checkpoint = load_checkpoint(args.resume)
        args = resumed_args(checkpoint["args"], args)
    validate_args(args)
    stop = StopRequest()
    try:
        return train(args, checkpoint, stop)
    finally:
        stop.restore()


def train(args: Args, checkpoint: Optional[dict], stop: StopRequest) -> list[float]:
    """The training loop, from the start or from `checkpoint`; stops early with a checkpoint when `stop` asks."""
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_name = checkpoint["run_name"] if checkpoint else run_name
    checkpoint_path = f"runs/{run_name}/checkpoint.pt"
    wandb_id = checkpoint["wandb_id"] if checkpoint else None  # kept for a later tracked resume
    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=vars(args),
            name=run_name,
            save_code=True,
            id=wandb_id,
            resume="allow",
        )
        wandb_id = wandb.run.id
    # a resumed run drops what the interrupted one logged after its checkpoint
    writer = SummaryWriter(f"runs/{run_name}", purge_step=checkpoint["global_step"] + 1 if checkpoint else None)
    if checkpoint is None:
        rows = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + rows)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    rng = np.random.default_rng(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    envs = make_env(args.env_id, args.num_envs, args.seed)
    num_envs, num_actions = args.num_envs, int(envs.action_space.n)
    obs, _ = envs.reset()
    obs = obs[:, -1]  # the newest frame (N, 84, 84)
    q_net = QNetwork(args.frame_stack, num_actions, args.hidden_size).to(device)
    target_net = QNetwork(args.frame_stack, num_actions, args.hidden_size).to(device)
    target_net.load_state_dict(q_net.state_dict())
    optimizer = torch.optim.Adam(q_net.parameters(), lr=args.learning_rate, eps=args.adam_eps)
    rb = SequenceReplay(
        num_envs,
        args.buffer_size,
        obs.shape[1:],
        np.uint8,
        args.hidden_size,
        args.seq_len,
        args.burn_in,
        args.overlap,
        args.n_step,
        args.priority_exponent,
        args.frame_stack,
    )
    print(f"replay: {rb.bytes_per_observation():.1f} bytes per stored observation")
    writer.add_text("replay", f"{rb.bytes_per_observation():.1f} bytes per stored observation")
    updates_per_vector_step = num_envs * args.replay_ratio / (args.batch_size * (args.seq_len - args.burn_in))

    h = torch.zeros(num_envs, args.hidden_size, device=device)
    c = torch.zeros_like(h)
    is_first, is_reset = np.ones(num_envs, dtype=bool), np.zeros(num_envs, dtype=bool)
    prev_action, prev_reward = np.full(num_envs, -1), np.zeros(num_envs, dtype=np.float32)
    stack = np.zeros((num_envs, args.frame_stack, *obs.shape[1:]), dtype=np.uint8)
    episode_return, episode_length = np.zeros(num_envs), np.zeros(num_envs, dtype=np.int64)
    scores, update_credit, updates = [], 0.0, 0
    num_iterations = args.total_timesteps // num_envs
    action_log = np.zeros((num_iterations, num_envs), dtype=np.min_scalar_type(num_actions - 1))
    start_iteration, learn_from, last_checkpoint = 0, args.learning_starts, None
    if checkpoint is not None:
        start_iteration = checkpoint["iteration"] + 1
        action_log[:start_iteration] = checkpoint["action_log"]
        obs = step_through(envs, action_log[:start_iteration], obs)[:, -1]
        if not np.array_equal(obs, checkpoint["obs"]):
            raise SystemExit(
                f"error: --resume={args.resume}: environment replay diverged from the checkpoint "
                "(another envpool version or machine?)"
            )
        q_net.load_state_dict(checkpoint["q_net"])
        target_net.load_state_dict(checkpoint["target_net"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        rb.load_state_dict(checkpoint["replay"])
        set_rng_states(checkpoint["rng"], rng)
        h, c = checkpoint["h"].to(device), checkpoint["c"].to(device)
        is_first, is_reset = checkpoint["is_first"], checkpoint["is_reset"]
        prev_action, prev_reward = checkpoint["prev_action"], checkpoint["prev_reward"]
        stack = checkpoint["stack"]
        episode_return, episode_length = checkpoint["episode_return"], checkpoint["episode_length"]
        scores, update_credit, updates = checkpoint["scores"], checkpoint["update_credit"], checkpoint["updates"]
        learn_from, last_checkpoint = checkpoint["learn_from"], args.resume
        if "obs" not in checkpoint["replay"]:  # the replay starts empty: collect again before learning
            learn_from = checkpoint["global_step"] + args.learning_starts
    start_step, stopping = start_iteration * num_envs, False
    start_time = last_print = time.time()
    for iteration in range(start_iteration, num_iterations):
        global_step = (iteration + 1) * num_envs
        keep = torch.as_tensor(~is_first, device=device).float().unsqueeze(-1)
        h, c = h * keep, c * keep  # episode start: zero state, no previous action or reward
        prev_action, prev_reward = np.where(is_first, -1, prev_action), np.where(is_first, 0, prev_reward)
        decay = min(global_step / max(args.epsilon_decay_fraction * args.total_timesteps, 1), 1.0)
        base_epsilon = args.base_epsilon + decay * (args.final_base_epsilon - args.base_epsilon)
        epsilons = actor_epsilons(num_envs, base_epsilon, args.epsilon_alpha)
        stack = push_frame(stack, obs, is_first)
        with torch.no_grad():
            q, (next_h, next_c) = q_net(*to_step_inputs(stack, prev_action, prev_reward, device, is_first), (h, c))
        actions = np.where(
            rng.random(num_envs) < epsilons, rng.integers(num_actions, size=num_envs), q[0].argmax(-1).cpu().numpy()
        )
        next_obs, reward, terminated, truncated, info = envs.step(actions)
        action_log[iteration] = actions
        rb.add(obs, actions, reward, terminated, truncated, is_first, is_reset, h.cpu().numpy(), c.cpu().numpy())

        # true game score (raw rewards, all lives); envpool's reset step is no part of an episode
        episode_return += np.where(is_reset, 0, info["reward"])
        episode_length += ~is_reset
        game_over = info["terminated"].astype(bool) | truncated
        for i in np.flatnonzero(game_over):
            scores.append(float(episode_return[i]))
            writer.add_scalar("charts/episodic_return", episode_return[i], global_step)
            writer.add_scalar("charts/episodic_length", episode_length[i], global_step)
        episode_return[game_over], episode_length[game_over] = 0, 0

        obs, h, c = next_obs[:, -1], next_h, next_c
        prev_action, prev_reward = actions, np.clip(reward, -1, 1).astype(np.float32)
        is_first, is_reset = is_reset, terminated | truncated

        if global_step > learn_from and rb.tree.total() > 0:
            update_credit += updates_per_vector_step
        while update_credit >= 1:
            update_credit -= 1
            ids, batch = rb.sample(args.batch_size, rng, args.importance_exponent, device)
            td, mask, q_taken = sequence_td_errors(
                q_net, target_net, batch, args.burn_in, args.seq_len, args.n_step, args.gamma
            )
            per_sequence = (0.5 * td**2).sum(0) / mask.sum(0).clamp(min=1)
            loss = (batch["weights"] * per_sequence).mean()
            optimizer.zero_grad()
            loss.backward()
            try:  # a NaN/inf loss or Q-value reaches the gradient norm: stop before it reaches the weights
                nn.utils.clip_grad_norm_(q_net.parameters(), args.max_grad_norm, error_if_nonfinite=True)
            except RuntimeError:
                raise SystemExit(
                    f"error: non-finite loss or Q-values at step {global_step}; last good checkpoint: "
                    f"{last_checkpoint or 'none written'}"
                ) from None
            optimizer.step()
            priorities = sequence_priorities(td.detach().abs(), mask, args.priority_eta)
            rb.update_priorities(ids, priorities.cpu().numpy())
            updates += 1
            if updates % args.target_update_interval == 0:
                target_net.load_state_dict(q_net.state_dict())
            if updates % args.log_interval == 0:
                writer.add_scalar("losses/td_loss", loss.item(), global_step)
                writer.add_scalar("losses/q_values", (q_taken * mask).sum().item() / mask.sum().item(), global_step)
                writer.add_scalar("charts/beta", args.importance_exponent, global_step)
                writer.add_scalar("charts/epsilon", float(epsilons.mean()), global_step)
                writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                sps = int((global_step - start_step) / (time.time() - start_time))
                writer.add_scalar("charts/SPS", sps, global_step)
        if time.time() - last_print > 10:
            last_print = time.time()
            sps = int((global_step - start_step) / (last_print - start_time))
            mean = np.mean(scores[-100:]) if scores else float("nan")
            eta = time.strftime("%H:%M:%S", time.gmtime((args.total_timesteps - global_step) / max(sps, 1)))
            print(f"step {global_step:>9}/{args.total_timesteps} | SPS {sps:>6} | return(100) {mean:8.2f} | ETA {eta}")

        every = args.checkpoint_every  # due when global_step crosses a multiple of it, and at the end
        crossed = every > 0 and global_step // every > (global_step - num_envs) // every
        due = crossed or (every > 0 and iteration + 1 == num_iterations)
        stopping = stop.requested  # read once: a signal arriving in between must not skip the checkpoint
        if due or stopping:
            save_checkpoint(
                dict(
                    version=CHECKPOINT_VERSION,
                    args=vars(args),
                    run_name=run_name,
                    wandb_id=wandb_id,
                    iteration=iteration,
                    global_step=global_step,
                    updates=updates,
                    update_credit=update_credit,
                    learn_from=learn_from,
                    q_net=q_net.state_dict(),
                    target_net=target_net.state_dict(),
                    optimizer=optimizer.state_dict(),
                    rng=rng_states(rng),
                    scores=scores,
                    episode_return=episode_return,
                    episode_length=episode_length,
                    obs=obs,
                    h=h.cpu(),
                    c=c.cpu(),
                    is_first=is_first,
                    is_reset=is_reset,
                    prev_action=prev_action,
                    prev_reward=prev_reward,
                    stack=stack,
                    action_log=action_log[: iteration + 1],
                    replay=rb.state_dict(with_arrays=args.checkpoint_replay),
                ),
                checkpoint_path,
            )
            last_checkpoint = checkpoint_path
        if stopping:
            print(
                f"checkpoint written to {checkpoint_path}; continue the run with:\n"
                f"  python {os.path.relpath(__file__)} --resume {checkpoint_path}"
            )
            break

    if args.save_model and not stopping:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        torch.save(q_net.state_dict(), model_path)
        print(f"model saved to {model_path}")
        eval_scores = evaluate(
            model_path,
            args.env_id,
            args.eval_episodes,
            device,
            frame_stack=args.frame_stack,
            hidden_size=args.hidden_size,
            capture_video=args.capture_video,
            run_name=run_name,
            seed=args.seed + 100,
        )
        for i, score in enumerate(eval_scores):
            writer.add_scalar("eval/episodic_return", score, i)
    envs.close()
    writer.close()
    if args.track:
        wandb.finish()
    return scores


if __name__ == "__main__":
    main(tyro.cli(Args))
