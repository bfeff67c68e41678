"""Recurrent IQN for vector observations: R2D2's recurrent model and sequence replay combined with IQN's
implicit quantile head, n-step double-Q targets and a dueling output.

The same algorithm as recurrent_iqn_atari.py with an MLP torso, for classic control (by default CartPole
with the velocities hidden, a partially observed task that needs the LSTM's memory). Only the
environment, the torso and the defaults differ.

Papers: Dabney et al. 2018 (IQN, arXiv:1806.06923), Kapturowski et al. 2019 (R2D2), Hessel et al. 2018
(Rainbow); the algorithm follows the article "Fast Sample Efficient Q-Learning With Recurrent IQN" (RLtime).
Docs: docs/rl-algorithms/recurrent_iqn.md
"""

import os
import random
import signal
import time
from dataclasses import dataclass
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
    """if toggled, cuda will be enabled by default"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "cleanrl-q"
    """the wandb's project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to record videos of the evaluation episodes (into the `videos` folder)"""
    save_model: bool = False
    """whether to save the final model to `runs/{run_name}` and evaluate it"""
    eval_episodes: int = 10
    """the number of episodes the saved model is evaluated on"""

    env_id: str = "CartPole-v1"
    """the id of the envpool classic control environment"""
    total_timesteps: int = 300_000
    """total agent steps over all environments"""
    mask_velocity: bool = True
    """hide the velocities of CartPole (observe cart position and pole angle only)"""
    num_envs: int = 16
    """the number of parallel game environments (one actor epsilon each)"""
    buffer_size: int = 100_000
    """the replay memory size in transitions (each frame is stored once)"""
    seq_len: int = 20
    """the length of a replayed training sequence"""
    batch_size: int = 32
    """the number of sequences per training batch"""
    replay_ratio: float = 8.0
    """how many times each acted transition is replayed on average (32x20 batches: one update per 80 steps)"""
    burn_in: int = 10
    """the first steps of each sequence only warm up the recurrent state (no loss, no gradient); 0 = off"""
    n_step: int = 5
    """the number of steps of the multi-step return"""
    gamma: float = 0.99
    """the discount factor gamma"""
    learning_rate: float = 5e-4
    """the learning rate of the Adam optimizer"""
    anneal_lr: bool = True
    """whether to anneal the learning rate linearly to 0 over training"""
    adam_eps: float = 1e-5
    """the epsilon of the Adam optimizer"""
    max_grad_norm: float = 40.0
    """the maximum norm of the gradients"""
    target_network_frequency: int = 2_000
    """the number of agent steps between target network updates"""
    learning_starts: int = 2_000
    """the number of agent steps acted before learning starts"""
    lstm_size: int = 128
    """the size of the LSTM state"""
    hidden_size: int = 128
    """the width of the hidden layers of the advantage and value branches"""
    num_quantiles: int = 8
    """N: quantile samples of the online network in the loss"""
    num_target_quantiles: int = 8
    """N': quantile samples of the target network"""
    num_action_quantiles: int = 8
    """K: quantile samples for acting and for the double-Q action selection"""
    quantile_embedding_dim: int = 64
    """the number of cosine features of the quantile embedding"""
    kappa: float = 1.0
    """the threshold of the quantile Huber loss"""
    iqn_before_lstm: bool = False
    """place the IQN layer before the LSTM (state repeated per quantile sample, merged by the mean every step)"""
    start_epsilon: float = 1.0
    """the base epsilon of the per-actor exploration at the start (CartPole needs random play first)"""
    end_epsilon: float = 0.01
    """the base epsilon at the end of the decay, also the floor of every actor's epsilon"""
    exploration_fraction: float = 0.5
    """the fraction of `total_timesteps` over which the base epsilon decays"""
    epsilon_alpha: float = 7.0
    """actor i explores with epsilon base^(1 + alpha i / (num_envs - 1))"""
    eval_epsilon: float = 0.001
    """the epsilon of the evaluation policy"""
    prioritized_replay: bool = False
    """R2D2-style prioritized sequence replay (off: uniform, as in the article's results)"""
    priority_eta: float = 0.9
    """sequence priority = eta * max_t + (1 - eta) * mean_t of the mean absolute sampled TD error"""
    priority_exponent: float = 0.9
    """alpha: the priority exponent of prioritized replay"""
    importance_exponent: float = 0.6
    """beta: the importance-sampling exponent of prioritized replay"""
    value_rescaling: bool = True
    """apply the value rescaling h(x) = sign(x)(sqrt(|x|+1)-1) + 1e-3 x to the targets"""
    max_episode_steps: int = 500
    """the episode cap in agent steps (CartPole-v1: 500)"""
    log_interval: int = 100
    """the number of updates between loss logs (keeps device syncs out of the hot loop)"""
    checkpoint_every: int = 0
    """write a resumable checkpoint every this many agent steps and at the end (0: only on SIGINT/SIGTERM)"""
    checkpoint_replay: bool = False
    """also store the replay buffer in checkpoints (large, but the resumed run is then exact)"""
    resume: Optional[str] = None
    """continue the run saved in this checkpoint, in the same run directory (and W&B run)"""


def make_env(env_id, num_envs, seed, mask_velocity, max_episode_steps):
    envs = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, max_episode_steps=max_episode_steps)
    return HideVelocity(envs) if mask_velocity else envs


class HideVelocity:
    """CartPole observing only the cart position and the pole angle: the velocities must be inferred from
    the history, so the task needs memory."""

    def __init__(self, envs, keep=(0, 2)):
        self.envs, self.keep = envs, list(keep)
        self.action_space = envs.action_space
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (len(self.keep),), np.float32)

    def reset(self, **kwargs):
        obs, info = self.envs.reset(**kwargs)
        return obs[:, self.keep], info

    def step(self, actions):
        obs, *rest = self.envs.step(actions)
        return (obs[:, self.keep], *rest)

    def close(self):
        self.envs.close()


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class QNetwork(nn.Module):
    """MLP -> [features, one-hot last action, last reward, timestep] -> LSTM -> IQN layer -> dueling.

    With `iqn_before_lstm` the quantile embedding modulates the MLP features instead; the LSTM then runs
    once per quantile sample from a shared state, merged back by the mean after every step."""

    def __init__(self, obs_size, num_actions, args):
        super().__init__()
        self.num_actions, self.iqn_before_lstm = num_actions, args.iqn_before_lstm
        torso_size = args.hidden_size
        self.torso = nn.Sequential(layer_init(nn.Linear(obs_size, torso_size)), nn.ReLU())
        self.lstm = nn.LSTM(torso_size + num_actions + 2, args.lstm_size)
        for name, param in self.lstm.named_parameters():
            nn.init.orthogonal_(param) if "weight" in name else nn.init.constant_(param, 0.0)
        embedded_size = torso_size if args.iqn_before_lstm else args.lstm_size
        self.quantile_embedding = nn.Sequential(layer_init(nn.Linear(args.quantile_embedding_dim, embedded_size)), nn.ReLU())
        self.register_buffer("cosine_frequencies", torch.arange(1, args.quantile_embedding_dim + 1) * np.pi)
        self.advantage = nn.Sequential(
            layer_init(nn.Linear(args.lstm_size, args.hidden_size)),
            nn.ReLU(),
            layer_init(nn.Linear(args.hidden_size, num_actions), std=0.01),
        )
        self.value = nn.Sequential(
            layer_init(nn.Linear(args.lstm_size, args.hidden_size)),
            nn.ReLU(),
            layer_init(nn.Linear(args.hidden_size, 1), std=1.0),
        )

    def embed(self, taus):
        """taus (..., K) -> phi(tau) (..., K, embedded_size)."""
        return self.quantile_embedding(torch.cos(taus.unsqueeze(-1) * self.cosine_frequencies))

    def head(self, features, taus):
        """LSTM features (T, B, H) or (T, B, K, H) and taus (T, B, K) -> quantiles (T, B, K, A)."""
        if not self.iqn_before_lstm:
            features = features.unsqueeze(2) * self.embed(taus)
        advantage = self.advantage(features)
        return self.value(features) + advantage - advantage.mean(-1, keepdim=True)

    def core(self, obs, last_action, last_reward, timestep, episode_start, state, taus=None, bounds=None):
        """Observations (T, B, obs_size) and extras (T, B) -> LSTM features, final state.

        `episode_start` (T, B) zeroes the state before the first frame of an episode; `bounds` (host ints)
        are the steps where any sequence starts one, so the LSTM runs in one call between them."""
        T, B = obs.shape[:2]
        x = self.torso(obs.reshape(T * B, *obs.shape[2:])).view(T, B, -1)
        extras = [
            F.one_hot(last_action.long() + 1, self.num_actions + 1)[..., 1:].float(),  # -1 -> zeros
            last_reward.unsqueeze(-1),
            timestep.unsqueeze(-1),
        ]
        keep = (~episode_start).unsqueeze(-1).float()
        if self.iqn_before_lstm:
            x = x.unsqueeze(2) * self.embed(taus)
            x = torch.cat([x] + [e.unsqueeze(2).expand(-1, -1, x.shape[2], -1) for e in extras], -1)
            return unroll_lstm_merged(self.lstm, x, state, keep)
        x = torch.cat([x] + extras, -1)
        return unroll_lstm(self.lstm, x, state, keep, [0, T] if bounds is None else bounds)

    def forward(self, obs, last_action, last_reward, timestep, episode_start, state, taus, bounds=None):
        features, state = self.core(obs, last_action, last_reward, timestep, episode_start, state, taus, bounds)
        return self.head(features, taus), state


def lstm_step(input_gates, h, c, lstm):
    """One LSTM step given the input's share of the gates (x W_ih^T + b), PyTorch's gate order i, f, g, o."""
    i, f, g, o = (input_gates + h @ lstm.weight_hh_l0.T).chunk(4, -1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def unroll_lstm(lstm, x, state, keep, bounds, segmented=None):
    """Runs `lstm` over x (T, B, D) from state (h, c), multiplying the state by keep (T, B, 1) before every
    step. keep only changes at `bounds` (steps where some sequence restarts), so on a GPU each stretch
    between them is one cuDNN call; on a CPU one matmul projects the inputs of all steps and only
    h W_hh^T runs per step, which measured faster there (docs page, "Speed")."""
    h, c = state
    outputs = []
    if x.is_cuda if segmented is None else segmented:
        for start, end in zip(bounds[:-1], bounds[1:]):
            out, (h, c) = lstm(x[start:end], ((h * keep[start])[None], (c * keep[start])[None]))
            h, c = h[0], c[0]
            outputs.append(out)
        return torch.cat(outputs), (h, c)
    input_gates = F.linear(x, lstm.weight_ih_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0)
    for t in range(x.shape[0]):
        h, c = lstm_step(input_gates[t], h * keep[t], c * keep[t], lstm)
        outputs.append(h)
    return torch.stack(outputs), (h, c)


def unroll_lstm_merged(lstm, x, state, keep):
    """x (T, B, K, D): the state (B, H) is shared by the K quantile samples of a step (the same as repeating
    it; h W_hh^T is computed once) and merged back by the mean after every step. -> (T, B, K, H), state."""
    h, c = state
    input_gates = F.linear(x, lstm.weight_ih_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0)
    outputs = []
    for t in range(x.shape[0]):
        out, c = lstm_step(input_gates[t], (h * keep[t]).unsqueeze(1), (c * keep[t]).unsqueeze(1), lstm)
        h, c = out.mean(1), c.mean(1)
        outputs.append(out)
    return torch.stack(outputs), (h, c)


def segment_bounds(episode_start):
    """episode_start (T, B) numpy bool -> [0, t1, ..., T]: the steps t > 0 where any sequence restarts."""
    restarts = np.flatnonzero(episode_start[1:].any(1)) + 1
    return [0] + restarts.tolist() + [episode_start.shape[0]]


class SumTree:
    """Vectorized sum tree over a fixed number of leaves: O(log n) batched updates and stratified sampling."""

    def __init__(self, size):
        self.leaves = 1 << max(size - 1, 1).bit_length()
        self.tree = np.zeros(2 * self.leaves)

    def update(self, index, priority):
        index = np.asarray(index) + self.leaves
        self.tree[index] = priority
        while index[0] > 1:
            index = np.unique(index // 2)
            self.tree[index] = self.tree[2 * index] + self.tree[2 * index + 1]

    def sample(self, batch_size):
        total = self.tree[1]
        mass = (np.arange(batch_size) + np.random.rand(batch_size)) * total / batch_size
        mass = np.minimum(mass, np.nextafter(total, 0))
        index = np.ones(batch_size, dtype=np.int64)
        while index[0] < self.leaves:
            left = self.tree[2 * index]
            go_right = mass >= left
            mass -= left * go_right
            index = 2 * index + go_right
        return index - self.leaves, self.tree[index] / total


class SequenceReplay:
    """Per-environment step streams in a ring; a training sequence is a window of `seq_len + n_step` slots
    starting at a multiple of `seq_len`, with the recurrent state stored when its first slot was acted.

    Slot t holds the observation o_t and what the agent fed with it (last action, last clipped reward,
    timestep, episode start), the action a_t, the clipped reward r_t and the end flags of that step, and
    whether the step from o_t was envpool's reset step (its action was ignored; never trained on)."""

    def __init__(self, args, obs_shape, obs_dtype, state_size, device):
        self.seq_len, self.window = args.seq_len, args.seq_len + args.n_step
        self.capacity = args.buffer_size // args.num_envs // args.seq_len * args.seq_len  # per environment
        self.num_windows = self.capacity // args.seq_len
        N, C = args.num_envs, self.capacity
        self.obs = np.zeros((N, C, *obs_shape), dtype=obs_dtype)
        self.last_action, self.action = np.zeros((N, C), dtype=np.int16), np.zeros((N, C), dtype=np.int16)
        self.last_reward, self.reward, self.timestep = (np.zeros((N, C), dtype=np.float32) for _ in range(3))
        self.episode_start, self.reset_step, self.terminated, self.truncated = (np.zeros((N, C), dtype=bool) for _ in range(4))
        self.state = torch.zeros((N, self.num_windows, 2, state_size), device=device)
        self.pos = 0  # steps written per environment
        self.priorities = SumTree(N * self.num_windows) if args.prioritized_replay else None
        self.max_priority = 1.0

    def add(self, state, **slot):
        """Writes one step of every environment; `state` (h, c) is the state before o_t (kept at window starts)."""
        t = self.pos % self.capacity
        window = t // self.seq_len
        if t % self.seq_len == 0:
            self.state[:, window] = torch.stack(state, 1)
            if self.priorities is not None:  # the old window here is being overwritten
                self.priorities.update(self.window_ids(window), 0.0)
        for key, value in slot.items():
            getattr(self, key)[:, t] = value
        self.pos += 1
        done = self.pos - self.window  # first slot of the window that just became complete
        if self.priorities is not None and done >= 0 and done % self.seq_len == 0:
            self.priorities.update(self.window_ids(done % self.capacity // self.seq_len), self.max_priority)

    def window_ids(self, window):
        return np.arange(self.obs.shape[0]) * self.num_windows + window

    def valid_windows(self):
        """The first and last window number whose slots are all written and none overwritten."""
        return max(0, -(-(self.pos - self.capacity) // self.seq_len)), (self.pos - self.window) // self.seq_len

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
            ids, probs = self.priorities.sample(batch_size)
            envs, windows = ids // self.num_windows, ids % self.num_windows
        slots = (windows[None] * self.seq_len + np.arange(self.window)[:, None]) % self.capacity  # (T, B)
        keys = [
            "obs",
            "last_action",
            "last_reward",
            "timestep",
            "episode_start",
            "reset_step",
            "action",
            "reward",
            "terminated",
            "truncated",
        ]
        batch = {key: getattr(self, key)[envs[None], slots] for key in keys}
        state = self.state[torch.from_numpy(envs), torch.from_numpy(windows)]
        return batch, (state[:, 0], state[:, 1]), ids, probs

    def update_priorities(self, ids, priorities):
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.priorities.update(ids, priorities)

    ARRAYS = [
        "obs",
        "last_action",
        "action",
        "last_reward",
        "reward",
        "timestep",
        "episode_start",
        "reset_step",
        "terminated",
        "truncated",
    ]

    def state_dict(self):
        # Tensors sharing the arrays' memory: torch.save writes them without a pickled copy of the whole buffer.
        arrays = {key: torch.from_numpy(getattr(self, key)) for key in self.ARRAYS}
        return dict(
            arrays,
            state=self.state,
            pos=self.pos,
            max_priority=self.max_priority,
            priorities=None if self.priorities is None else self.priorities.tree,
        )

    def load_state_dict(self, saved):
        for key in self.ARRAYS:
            setattr(self, key, saved[key].numpy())
        self.state = saved["state"].to(self.state.device)
        self.pos, self.max_priority = saved["pos"], saved["max_priority"]
        if self.priorities is not None:
            self.priorities.tree = saved["priorities"]


def replay_memory_bytes(args, obs_shape, obs_dtype):
    """The bytes SequenceReplay allocates for these flags: the slots of every stream, the stored states of
    every window and the sum tree (a Python-int count, so absurd sizes do not overflow)."""
    capacity = args.buffer_size // args.num_envs // args.seq_len * args.seq_len
    slot = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize + 2 * 2 + 3 * 4 + 4  # int16 x2, float32 x3, bool x4
    windows = args.num_envs * (capacity // args.seq_len)
    tree = 2 * 8 * (1 << max(windows - 1, 1).bit_length()) if args.prioritized_replay else 0
    return args.num_envs * capacity * slot + windows * 2 * args.lstm_size * 4 + tree


def available_memory_bytes():
    """MemAvailable of /proc/meminfo (free memory plus what the kernel can reclaim), else the free pages."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def n_step_targets(reward, terminated, truncated, gamma, n):
    """Multi-step returns that stop at episode ends, for the first T - n slots of a window.

    reward, terminated, truncated: (T, B). Returns (returns, discounts, bootstrap), each (T - n, B):
    target_t = returns_t + discounts_t * Z(o_{bootstrap_t}), bootstrap_t in [t+1, t+n]. An episode that ends
    at step t+k stops the sum there; a time-out bootstraps from its final observation o_{t+k+1}, a
    termination has discount 0."""
    T = reward.shape[0] - n
    returns = torch.zeros_like(reward[:T])
    discounts = torch.ones_like(reward[:T])
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


def base_epsilon_schedule(global_step, total_timesteps, start=0.4, end=0.01, fraction=0.5):
    """The base of the per-actor epsilons: linear from `start` to `end` over `fraction` of training."""
    progress = min(global_step / (fraction * total_timesteps), 1.0)
    return start + progress * (end - start)


def actor_epsilons(num_envs, base_epsilon, alpha=7.0, min_epsilon=0.01):
    """epsilon_i = base^(1 + alpha i / (num_envs - 1)) for actor i, never below `min_epsilon` (num_envs,)."""
    exponents = 1 + alpha * np.arange(num_envs) / max(num_envs - 1, 1)
    return np.maximum(base_epsilon**exponents, min_epsilon)


class Agent:
    """Acting bookkeeping for a batch of environments: recurrent state and the extra LSTM inputs."""

    def __init__(self, network, num_envs, args, device):
        self.network, self.args, self.device = network, args, device
        self.state = (torch.zeros(num_envs, args.lstm_size, device=device),) * 2
        self.last_action = np.full(num_envs, -1, dtype=np.int64)
        self.last_reward = np.zeros(num_envs, dtype=np.float32)
        self.episode_start = np.ones(num_envs, dtype=bool)
        self.game_steps = np.zeros(num_envs, dtype=np.int64)  # agent steps since the game began
        self.game_over = np.zeros(num_envs, dtype=bool)

    def state_dict(self):
        return dict(
            state=self.state,
            last_action=self.last_action,
            last_reward=self.last_reward,
            episode_start=self.episode_start,
            game_steps=self.game_steps,
            game_over=self.game_over,
        )

    def load_state_dict(self, saved):
        self.state = tuple(x.to(self.device) for x in saved["state"])
        for key in ["last_action", "last_reward", "episode_start", "game_steps", "game_over"]:
            setattr(self, key, saved[key])

    def inputs(self):
        return dict(
            last_action=self.last_action,
            last_reward=self.last_reward,
            timestep=(self.game_steps / self.args.max_episode_steps).astype(np.float32),
            episode_start=self.episode_start,
        )

    @torch.no_grad()
    def act(self, obs, epsilons):
        inputs = {k: torch.as_tensor(v, device=self.device)[None] for k, v in self.inputs().items()}
        taus = torch.rand(1, len(obs), self.args.num_action_quantiles, device=self.device)
        quantiles, self.state = self.network(
            torch.as_tensor(obs, device=self.device)[None], **inputs, state=self.state, taus=taus
        )
        actions = quantiles[0].mean(1).argmax(1).cpu().numpy()
        explore = np.random.rand(len(obs)) < epsilons
        return np.where(explore, np.random.randint(self.network.num_actions, size=len(obs)), actions)

    def observe(self, actions, reward, reset_step, game_over):
        """After a step: the next frame's extra inputs. A reset step's frame starts a new episode (or life);
        the timestep restarts only with a new game."""
        self.game_steps = np.where(reset_step & self.game_over, 0, self.game_steps + ~reset_step)
        self.game_over = game_over
        self.episode_start = reset_step.copy()
        self.last_action = np.where(reset_step, -1, actions)
        self.last_reward = np.where(reset_step, 0.0, np.clip(reward, -1, 1)).astype(np.float32)


def train_step(args, network, target_network, optimizer, rb, device):
    """One update on batch_size sequences; returns the loss and mean Q as device tensors (no sync)."""
    batch, initial_state, ids, probs = rb.sample(args.batch_size)
    bounds = window_bounds = segment_bounds(batch["episode_start"])
    b = {k: torch.as_tensor(v, device=device) for k, v in batch.items()}
    inputs = {k: b[k] for k in ["obs", "last_action", "last_reward", "timestep", "episode_start"]}
    T, B, L, n, burn_in = rb.window, args.batch_size, args.seq_len, args.n_step, args.burn_in
    rand = lambda k: torch.rand(T, B, k, device=device)  # noqa: E731
    with torch.no_grad():
        target_quantiles, _ = target_network(
            **inputs, state=initial_state, taus=rand(args.num_target_quantiles), bounds=window_bounds
        )
        returns, discounts, bootstrap = n_step_targets(b["reward"], b["terminated"], b["truncated"], args.gamma, n)
    taus, state = rand(args.num_quantiles), initial_state
    if burn_in > 0:  # the burn-in only warms up the stored state: no gradient, no loss
        with torch.no_grad():
            _, state = network.core(
                **{k: v[:burn_in] for k, v in inputs.items()},
                state=state,
                taus=taus[:burn_in],
                bounds=[t for t in bounds if t < burn_in] + [burn_in],
            )
        bounds = [0] + [t - burn_in for t in bounds if t > burn_in]
    features, _ = network.core(**{k: v[burn_in:] for k, v in inputs.items()}, state=state, taus=taus[burn_in:], bounds=bounds)
    quantiles = network.head(features[: L - burn_in], taus[burn_in:L])  # (L - burn_in, B, N, A)
    with torch.no_grad():
        select_taus = rand(args.num_action_quantiles)
        if args.iqn_before_lstm:  # the quantile samples enter the LSTM: the selection pass needs its own unroll
            select_quantiles, _ = network(**inputs, state=initial_state, taus=select_taus, bounds=window_bounds)
        else:  # reuse the LSTM features, new quantile samples in the head
            select_quantiles = F.pad(network.head(features, select_taus[burn_in:]), (0, 0, 0, 0, 0, 0, burn_in, 0))
        # Double Q: the online network picks the bootstrap action, the target network values it.
        gather = lambda z: z.gather(0, bootstrap.view(L, B, 1, 1).expand(-1, -1, *z.shape[2:]))  # noqa: E731
        next_actions = gather(select_quantiles).mean(2).argmax(2, keepdim=True)  # (L, B, 1)
        next_quantiles = (
            gather(target_quantiles)
            .gather(3, next_actions.unsqueeze(2).expand(-1, -1, args.num_target_quantiles, 1))
            .squeeze(3)
        )  # (L, B, N')
        if args.value_rescaling:
            next_quantiles = inverse_value_rescale(next_quantiles)
        targets = returns.unsqueeze(2) + discounts.unsqueeze(2) * next_quantiles
        if args.value_rescaling:
            targets = value_rescale(targets)
        targets = targets[burn_in:]
    actions = b["action"][burn_in:L].long()
    chosen = quantiles.gather(3, actions.view(*actions.shape, 1, 1).expand(-1, -1, args.num_quantiles, 1)).squeeze(3)
    loss = quantile_huber_loss(chosen.flatten(0, 1), taus[burn_in:L].flatten(0, 1), targets.flatten(0, 1), args.kappa).view(
        L - burn_in, B
    )
    # Reset steps (the action was ignored) and the burn-in are never trained on.
    mask = (~b["reset_step"][burn_in:L]).float()
    weights = torch.ones(B, device=device)
    if probs is not None:  # importance sampling, normalized by the largest weight in the batch
        w = (rb.num_valid() * probs) ** -args.importance_exponent
        weights = torch.as_tensor(w / w.max(), dtype=torch.float32, device=device)
    loss_value = (loss * mask * weights).sum() / mask.sum().clamp(min=1.0)
    optimizer.zero_grad(set_to_none=True)
    loss_value.backward()
    # A NaN or inf in the loss or the Q-values reaches the gradient norm: raise instead of training on it.
    nn.utils.clip_grad_norm_(network.parameters(), args.max_grad_norm, error_if_nonfinite=True)
    optimizer.step()
    if probs is not None:  # R2D2's sequence priority from the mean absolute sampled TD error of each step
        td = ((targets.unsqueeze(2) - chosen.detach().unsqueeze(3)).abs().mean((2, 3)) * mask).cpu().numpy()
        mean_td = td.sum(0) / np.maximum(mask.sum(0).cpu().numpy(), 1)
        priority = args.priority_eta * td.max(0) + (1 - args.priority_eta) * mean_td
        rb.update_priorities(ids, priority**args.priority_exponent + 1e-6)
    return loss_value.detach(), (chosen.detach().mean(2) * mask).sum() / mask.sum().clamp(min=1.0)


def make_video_env(env_id, mask_velocity, run_name):
    """One recorded gymnasium environment (envpool does not render)."""

    def thunk():
        env = gym.wrappers.RecordVideo(
            gym.make(env_id, render_mode="rgb_array"), f"videos/{run_name}", episode_trigger=lambda _: True
        )
        if mask_velocity:
            env = gym.wrappers.TransformObservation(env, lambda obs: obs[[0, 2]], gym.spaces.Box(-np.inf, np.inf, (2,)))
        return env

    return gym.vector.SyncVectorEnv([thunk])


def evaluate(model_path, env_id, eval_episodes, device, epsilon=0.001, args=None, capture_video=False, run_name="eval"):
    """Plays `eval_episodes` episodes with the saved model and returns their returns.
    Episodes are split evenly over the environments so short ones are not favoured."""
    args = args or Args(env_id=env_id)
    if capture_video:
        envs = make_video_env(env_id, args.mask_velocity, run_name)
    else:
        envs = make_env(env_id, min(eval_episodes, 32), args.seed + 1000, args.mask_velocity, args.max_episode_steps)
    num_envs = envs.num_envs if capture_video else min(eval_episodes, 32)
    obs_size = envs.single_observation_space.shape[0] if capture_video else envs.observation_space.shape[0]
    network = QNetwork(obs_size, int(envs.single_action_space.n if capture_video else envs.action_space.n), args).to(device)
    network.load_state_dict(torch.load(model_path, map_location=device, weights_only=True))
    network.eval()
    agent = Agent(network, num_envs, args, device)
    quota = np.array([eval_episodes // num_envs + (i < eval_episodes % num_envs) for i in range(num_envs)])
    scores, score = [], np.zeros(num_envs)
    obs, _ = envs.reset()
    reset_step = np.zeros(num_envs, dtype=bool)
    while len(scores) < eval_episodes:
        actions = agent.act(obs, epsilon)
        obs, reward, terminated, truncated, info = envs.step(actions)
        score += reward
        game_over = terminated | truncated
        for i in np.flatnonzero(game_over & (quota > 0)):
            scores.append(float(score[i]))
            quota[i] -= 1
        score[game_over] = 0.0
        agent.observe(actions, reward, reset_step, game_over)
        reset_step = game_over
    envs.close()
    return scores


def validate_args(args):
    if args.mask_velocity and not args.env_id.startswith("CartPole"):
        raise SystemExit(f"error: --mask-velocity: only defined for CartPole, not --env-id={args.env_id}")
    if args.env_id not in envpool.list_all_envs():
        raise SystemExit(f"error: --env-id={args.env_id}: not an envpool environment id")
    if not isinstance(envpool.make_spec(args.env_id).action_space, gym.spaces.Discrete):
        raise SystemExit(f"error: --env-id={args.env_id}: needs a discrete action space")
    for flag, value in [
        ("--num-envs", args.num_envs),
        ("--seq-len", args.seq_len),
        ("--batch-size", args.batch_size),
        ("--n-step", args.n_step),
        ("--num-quantiles", args.num_quantiles),
        ("--num-target-quantiles", args.num_target_quantiles),
        ("--num-action-quantiles", args.num_action_quantiles),
        ("--eval-episodes", args.eval_episodes),
    ]:
        if value < 1:
            raise SystemExit(f"error: {flag}={value}: must be at least 1")
    if not 0 <= args.burn_in < args.seq_len:
        raise SystemExit(f"error: --burn-in={args.burn_in}: must be in [0, --seq-len={args.seq_len})")
    if args.buffer_size // args.num_envs < 2 * (args.seq_len + args.n_step):
        raise SystemExit(
            f"error: --buffer-size={args.buffer_size}: must hold at least two sequences of "
            f"--seq-len + --n-step steps per environment ({2 * (args.seq_len + args.n_step) * args.num_envs})"
        )
    if args.replay_ratio <= 0:
        raise SystemExit(f"error: --replay-ratio={args.replay_ratio}: must be positive")
    if args.checkpoint_every < 0:
        raise SystemExit(f"error: --checkpoint-every={args.checkpoint_every}: must be at least 0")
    if args.resume is not None and not os.path.isfile(args.resume):
        raise SystemExit(f"error: --resume={args.resume}: no such file")
    space = envpool.make_spec(args.env_id).observation_space  # the spec only: no environment is built
    need = replay_memory_bytes(args, (2,) if args.mask_velocity else space.shape, space.dtype)
    available = available_memory_bytes()
    if need > available:
        raise SystemExit(
            f"error: --buffer-size={args.buffer_size}: the replay needs about {need / 1e9:,.1f} GB but "
            f"{available / 1e9:,.1f} GB are available; lower --buffer-size"
        )
    if args.capture_video:
        try:
            import moviepy  # noqa: F401
            import pygame  # noqa: F401
        except ImportError:
            raise SystemExit(
                "error: --capture-video: needs moviepy and pygame (pip install moviepy 'gymnasium[classic-control]')"
            )


CHECKPOINT_VERSION = 1
CHECKPOINT_KEYS = {
    "format_version",
    "args",
    "run_name",
    "wandb_id",
    "global_step",
    "iteration",
    "updates",
    "learning_starts_at",
    "network",
    "target_network",
    "optimizer",
    "rng",
    "agent",
    "obs",
    "reset_step",
    "episode_returns",
    "episode_return",
    "episode_length",
    "logs",
    "action_log",
    "replay",
}


def rng_states():
    """Every random number generator the run draws from (this script owns no np.random.Generator)."""
    return dict(
        python=random.getstate(),
        numpy=np.random.get_state(),
        torch=torch.get_rng_state(),
        cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    )


def set_rng_states(saved):
    random.setstate(saved["python"])
    np.random.set_state(saved["numpy"])
    torch.set_rng_state(saved["torch"])
    if saved["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])


def save_checkpoint(state, path):
    """Writes through a temporary file, so a run killed while writing keeps its previous checkpoint whole."""
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def load_checkpoint(path):
    try:  # numpy RNG states and arrays are not weights: the full unpickler is needed
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # a truncated or corrupted file fails anywhere inside the unpickler
        reason = f"{type(error).__name__}: {error}"
    else:
        if not isinstance(checkpoint, dict) or checkpoint.get("format_version") != CHECKPOINT_VERSION:
            reason = f"not a format {CHECKPOINT_VERSION} checkpoint of this script"
        elif CHECKPOINT_KEYS - set(checkpoint):
            reason = f"missing {', '.join(sorted(CHECKPOINT_KEYS - set(checkpoint)))}"
        else:
            return checkpoint
    raise SystemExit(f"error: --resume={path}: not a readable checkpoint ({reason})")


def resumed_args(given, saved):
    """The checkpoint's flags, except the few a resumed run may change; says which other given flags are ignored."""
    kept = ["resume", "checkpoint_every", "cuda", "track"]
    defaults = Args()
    ignored = [
        f"--{key.replace('_', '-')}={value}"
        for key, value in vars(given).items()
        if key not in kept and value != getattr(defaults, key) and value != saved.get(key)
    ]
    if ignored:
        print(f"resuming with the checkpoint's flags; ignored: {' '.join(ignored)}")
    return Args(**{**saved, **{key: getattr(given, key) for key in kept}})


def replay_actions(envs, action_log, saved_obs):
    """envpool cannot save its state but is deterministic given its seed and the actions: a fresh pool stepped
    through every logged action (reset steps included) is back where the checkpoint left it."""
    print(f"replaying {len(action_log)} environment steps to restore the environments")
    obs, _ = envs.reset()
    for actions in action_log:
        obs = envs.step(actions.astype(np.int64))[0]
    if not np.array_equal(obs, saved_obs):
        raise SystemExit("error: environment replay diverged from the checkpoint (a different envpool version?)")
    return obs


def install_stop_handlers():
    """The first SIGINT/SIGTERM asks the loop to stop after the current step (it then writes a checkpoint); a
    second exits at once. Returns the request flag and the previous handlers, to be restored."""
    stop = {"requested": False}

    def handler(signum, frame):
        if stop["requested"]:
            raise KeyboardInterrupt
        stop["requested"] = True
        print("stopping after this step; a second signal exits at once")

    return stop, {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def restore_handlers(previous):
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def main(args: Args) -> list[float]:
    validate_args(args)
    checkpoint = load_checkpoint(args.resume) if args.resume else None
    if checkpoint is not None:
        args = resumed_args(args, checkpoint["args"])
        validate_args(args)  # the checkpoint's flags, against this machine's memory
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    if checkpoint is not None:
        run_name = checkpoint["run_name"]
    wandb_id = None
    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=vars(args),
            name=run_name,
            save_code=True,
            **(dict(id=checkpoint["wandb_id"], resume="allow") if checkpoint else {}),
        )
        wandb_id = wandb.run.id
    # A resumed run drops the events logged after its checkpoint, which the resumed run logs again.
    writer = SummaryWriter(f"runs/{run_name}", purge_step=checkpoint["global_step"] if checkpoint else None)
    if checkpoint is None:
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items()))

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    torch.set_float32_matmul_precision("high")  # TF32 matmuls on GPUs that have them
    if device.type == "cpu":
        torch.set_num_threads(1)  # a network this small only pays synchronization for intra-op threads

    envs = make_env(args.env_id, args.num_envs, args.seed, args.mask_velocity, args.max_episode_steps)
    num_actions = int(envs.action_space.n)
    network = QNetwork(envs.observation_space.shape[0], num_actions, args).to(device)
    target_network = QNetwork(envs.observation_space.shape[0], num_actions, args).to(device)
    target_network.load_state_dict(network.state_dict())
    optimizer = torch.optim.Adam(network.parameters(), lr=args.learning_rate, eps=args.adam_eps)
    rb = SequenceReplay(args, envs.observation_space.shape, envs.observation_space.dtype, args.lstm_size, device)
    agent = Agent(network, args.num_envs, args, device)
    # One update of batch_size x seq_len slots per this many agent steps keeps the replay ratio.
    update_every = max(1, round(args.batch_size * args.seq_len / args.replay_ratio / args.num_envs))
    target_every = max(1, args.target_network_frequency // (args.num_envs * update_every))
    num_iterations = args.total_timesteps // args.num_envs
    # The actions of every envs.step call: replaying them rebuilds the environments on resume.
    action_log = np.zeros((num_iterations, args.num_envs), dtype=np.min_scalar_type(num_actions - 1))

    episode_returns, episode_return = [], np.zeros(args.num_envs)
    episode_length = np.zeros(args.num_envs, dtype=np.int64)
    reset_step = np.zeros(args.num_envs, dtype=bool)
    updates, global_step, start_iteration, logs = 0, 0, 1, None
    learning_starts_at, checkpoint_path = args.learning_starts, None
    if checkpoint is None:
        obs, _ = envs.reset()
    else:
        network.load_state_dict(checkpoint["network"])
        target_network.load_state_dict(checkpoint["target_network"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        agent.load_state_dict(checkpoint["agent"])
        global_step, updates = checkpoint["global_step"], checkpoint["updates"]
        logs = None if checkpoint["logs"] is None else tuple(x.to(device) for x in checkpoint["logs"])
        start_iteration, learning_starts_at = checkpoint["iteration"] + 1, checkpoint["learning_starts_at"]
        if checkpoint["replay"] is not None:
            rb.load_state_dict(checkpoint["replay"])
        else:  # an empty buffer: act for learning_starts steps again before learning
            learning_starts_at = global_step + args.learning_starts
        episode_returns, episode_return = checkpoint["episode_returns"], checkpoint["episode_return"]
        episode_length, reset_step = checkpoint["episode_length"], checkpoint["reset_step"]
        action_log[: checkpoint["iteration"]] = checkpoint["action_log"]
        obs = replay_actions(envs, checkpoint["action_log"], checkpoint["obs"])
        set_rng_states(checkpoint["rng"])
        checkpoint_path = args.resume
    # Installed only now, so that every way out of the loop below restores them (main also runs inside tests).
    stop, previous_handlers = install_stop_handlers()
    start_time = last_print = time.time()
    start_step = global_step
    for iteration in range(start_iteration, num_iterations + 1):
        global_step = iteration * args.num_envs
        base_epsilon = base_epsilon_schedule(
            global_step, args.total_timesteps, args.start_epsilon, args.end_epsilon, args.exploration_fraction
        )
        epsilons = actor_epsilons(args.num_envs, base_epsilon, args.epsilon_alpha, args.end_epsilon)
        state_before = agent.state
        inputs = agent.inputs()
        actions = agent.act(obs, epsilons)
        action_log[iteration - 1] = actions
        next_obs, reward, terminated, truncated, info = envs.step(actions)
        rb.add(
            state_before,
            obs=obs,
            action=actions,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            reset_step=reset_step,
            **inputs,
        )

        # Episode return, logged at termination or time-out; reset steps add nothing.
        game_over = terminated | truncated
        episode_return += reward
        episode_length += ~reset_step
        for i in np.flatnonzero(game_over):
            episode_returns.append(float(episode_return[i]))
            writer.add_scalar("charts/episodic_return", episode_return[i], global_step)
            writer.add_scalar("charts/episodic_length", episode_length[i], global_step)
        episode_return[game_over], episode_length[game_over] = 0.0, 0
        agent.observe(actions, reward, reset_step, game_over)
        reset_step = terminated | truncated
        obs = next_obs

        if global_step > learning_starts_at and iteration % update_every == 0 and rb.pos >= rb.window:
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - (iteration - 1) / num_iterations)
            try:
                loss, q_values = train_step(args, network, target_network, optimizer, rb, device)
            except RuntimeError as error:
                if "non-finite" not in str(error):
                    raise
                envs.close()
                writer.close()
                restore_handlers(previous_handlers)
                raise SystemExit(
                    f"error: non-finite loss or Q-values at step {global_step}; last good checkpoint: "
                    f"{checkpoint_path or 'none written'}"
                ) from error
            updates += 1
            logs = (loss, q_values) if logs is None else (logs[0] + loss, logs[1] + q_values)
            if updates % args.log_interval == 0:
                writer.add_scalar("losses/quantile_loss", logs[0].item() / args.log_interval, global_step)
                writer.add_scalar("losses/q_values", logs[1].item() / args.log_interval, global_step)
                writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                writer.add_scalar("charts/epsilon", base_epsilon, global_step)
                if args.prioritized_replay:
                    writer.add_scalar("charts/beta", args.importance_exponent, global_step)
                logs = None
            if updates % target_every == 0:
                target_network.load_state_dict(network.state_dict())

        if time.time() - last_print > 10 or iteration == num_iterations:
            last_print = time.time()
            sps = int((global_step - start_step) / (last_print - start_time))
            writer.add_scalar("charts/SPS", sps, global_step)
            mean = np.mean(episode_returns[-100:]) if episode_returns else float("nan")
            eta = time.strftime("%H:%M:%S", time.gmtime((args.total_timesteps - global_step) / max(sps, 1)))
            print(f"step {global_step:>9}/{args.total_timesteps} | SPS {sps:>6} | return(100) {mean:8.2f} | ETA {eta}")

        every = args.checkpoint_every
        if stop["requested"] or (every > 0 and (global_step % every < args.num_envs or iteration == num_iterations)):
            state = dict(
                format_version=CHECKPOINT_VERSION,
                args=vars(args),
                run_name=run_name,
                wandb_id=wandb_id,
                global_step=global_step,
                iteration=iteration,
                updates=updates,
                learning_starts_at=learning_starts_at,
                network=network.state_dict(),
                target_network=target_network.state_dict(),
                optimizer=optimizer.state_dict(),
                rng=rng_states(),
                agent=agent.state_dict(),
                obs=obs,
                reset_step=reset_step,
                episode_returns=episode_returns,
                episode_return=episode_return,
                episode_length=episode_length,
                logs=logs,
                action_log=action_log[:iteration],
                replay=rb.state_dict() if args.checkpoint_replay else None,
            )
            checkpoint_path = save_checkpoint(state, f"runs/{run_name}/checkpoint.pt")
        if stop["requested"]:
            print(
                f"checkpoint written to {checkpoint_path}; resume with: "
                f"python cleanrl/{os.path.basename(__file__)} --resume {checkpoint_path}"
            )
            break

    envs.close()
    restore_handlers(previous_handlers)
    if args.save_model and not stop["requested"]:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        torch.save(network.state_dict(), model_path)
        print(f"model saved to {model_path}")
        scores = evaluate(
            model_path,
            args.env_id,
            args.eval_episodes,
            device,
            args.eval_epsilon,
            args=args,
            capture_video=args.capture_video,
            run_name=f"{run_name}-eval",
        )
        for idx, score in enumerate(scores):
            writer.add_scalar("eval/episodic_return", score, idx)
        print(f"evaluation over {len(scores)} games: mean score {np.mean(scores):.2f}")
    writer.close()
    if args.track:
        wandb.finish()
    return episode_returns


if __name__ == "__main__":
    main(tyro.cli(Args))
