"""Implicit Quantile Networks (IQN) for vector observations (classic control).

IQN learns the whole distribution of returns: the network maps a state and a quantile level tau ~ U(0, 1) to the
tau-quantile of the return of each action, trained with the quantile Huber loss against quantiles of the n-step
target distribution; actions are greedy in the mean over K sampled quantiles. Same algorithm as `iqn_atari.py`, with
an MLP torso instead of the Nature CNN and defaults tuned for small tasks (3-step returns, as Dopamine's IQN).

Paper: Dabney, Ostrovski, Silver, Munos, "Implicit Quantile Networks for Distributional Reinforcement Learning",
ICML 2018. Docs: docs/rl-algorithms/iqn.md
"""

import cleanrl_q_utils.quiet_start  # noqa: F401  (first: a signal while torch loads exits quietly)

import copy
import os
import time
from dataclasses import dataclass
from typing import NamedTuple, Optional

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

envpool = classic_control.import_envpool()  # None off Linux (it has Linux wheels only): classic control is gymnasium's

# The layout of checkpoint.pt, which a resume checks.
CHECKPOINT_FORMAT = 2
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
    total_timesteps: int = 300_000
    """the total number of agent steps of the experiment, summed over all environments"""
    num_envs: int = 4
    """the number of parallel environments"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer"""
    adam_eps: float = 3.125e-4
    """the epsilon of the Adam optimizer"""
    anneal_lr: bool = True
    """if toggled, anneal the learning rate linearly to zero over training"""
    buffer_size: int = 200_000  # split evenly over the environments; the default holds 2/3 of the run
    """the replay capacity in transitions, summed over all environments"""
    gamma: float = 0.99
    """the discount factor gamma"""
    n_step: int = 3  # Dopamine's IQN: 3; the paper: 1; with 1, 4 of 10 CartPole seeds end < 475
    """the number of steps of the n-step return"""
    batch_size: int = 64
    """the number of transitions per gradient update"""
    learning_starts: int = 1_000  # acting uniformly at random
    """the number of agent steps collected before learning starts"""
    train_frequency: int = 4
    """the number of agent steps (summed over all environments) between two gradient updates"""
    target_network_frequency: int = 200
    """the number of agent steps (summed over all environments) between copies of the online network into the target network"""
    start_e: float = 1.0
    """the starting epsilon of the epsilon-greedy exploration"""
    end_e: float = 0.01
    """the final epsilon of the epsilon-greedy exploration"""
    exploration_fraction: float = 1 / 30  # 10k steps
    """the fraction of `total_timesteps` over which the epsilon schedule goes linearly from `start_e` to `end_e` (0: `end_e`
    from the first step)"""
    eval_epsilon: float = 0.001
    """the epsilon of the evaluation episodes"""
    num_tau_samples: int = 8
    """N: the number of quantile samples of the online network in the loss"""
    num_tau_prime_samples: int = 8
    """N': the number of quantile samples of the target network in the loss"""
    num_quantile_samples: int = 32
    """K: the number of quantile samples whose mean gives the Q-values that pick actions"""
    quantile_embedding_dim: int = 64
    """the number of cosine features cos(pi i tau), i = 1..dim, of the quantile embedding"""
    kappa: float = 1.0
    """the threshold of the Huber loss inside the quantile loss"""
    hidden_size: int = 64
    """the width of the MLP torso, of the quantile embedding and of the hidden layer of the head"""
    checkpoint_every: int = 0
    """write a resumable checkpoint every this many agent steps and at the end (0: only when a signal stops the run)"""
    checkpoint_replay: bool = False
    """also store the replay buffer in checkpoints (large, but the resumed run is then exact)"""
    resume: Optional[str] = None
    """continue the run saved in this checkpoint, in the same run directory (and W&B run)"""
    resume_fresh_envs: bool = False
    """with --resume: start new games instead of replaying every logged action (cost independent of the run's length;
    the games in progress are dropped, so the run is not bit-identical)"""


# The configuration a MinAtar id runs with (flags given on the command line win): Young & Tian's budget, replay size
# and exploration, and Revisiting Rainbow's update of a batch of 32 every 4 steps. The learning rate comes from a
# screen of 500k-step Breakout runs (docs/rl-algorithms/iqn.md, MinAtar): 2.5e-4 and 5e-4 reached about twice what
# 1e-4 did, and an Adam epsilon of 1e-5 did not help.
MINATAR_DEFAULTS = dict(
    total_timesteps=5_000_000,
    num_envs=4,
    buffer_size=100_000,
    learning_starts=5_000,
    batch_size=32,
    train_frequency=4,
    target_network_frequency=4_000,
    exploration_fraction=0.02,  # Young & Tian: epsilon 1 -> 0.1 over the first 100k steps
    end_e=0.01,
    learning_rate=2.5e-4,
)


def validate_args(args: Args) -> list:
    flag_checks.check_common_flags(args)
    spec = flag_checks.check_env_id(args.env_id, atari=False)
    if args.learning_starts < args.batch_size:
        flag_errors.flag_error("learning_starts", args.learning_starts, f"must be >= --batch-size={args.batch_size}")
    if args.buffer_size // args.num_envs < max(args.learning_starts // args.num_envs, 4):
        needs = f"must hold --learning-starts={args.learning_starts} steps and at least 4 steps per environment"
        flag_errors.flag_error("buffer_size", args.buffer_size, f"{needs} (--num-envs={args.num_envs})")
    return flag_checks.check_run_memory(args, memory_needs(args, spec.observation_space.shape, spec.action_space.n))


def network_sizes(args: Args, obs_shape: tuple, num_actions: int) -> tuple[int, int, int]:
    """(parameters, floats of every layer output per quantile level, and per observation) of QuantileNetwork, counted
    from its layers."""
    linear, inputs = flag_checks.linear_parameters, int(np.prod(obs_shape))
    if len(obs_shape) == 3:  # MinAtar grid
        features, hidden = 16 * (obs_shape[0] - 2) * (obs_shape[1] - 2), 128
        torso = flag_checks.conv_parameters(obs_shape[2], 16, 3)
    else:
        features = hidden = args.hidden_size
        torso = linear(inputs, hidden)
    embedding = args.quantile_embedding_dim
    parameters = torso + linear(embedding, features) + linear(features, hidden) + linear(hidden, num_actions)
    return parameters, embedding + 3 * features + 2 * hidden + num_actions, 2 * inputs + 2 * features


def memory_needs(args: Args, obs_shape: tuple, num_actions: int) -> list:
    """What a run allocates in proportion to its flags, for `flag_checks.check_run_memory`: the replay, the network
    with its target, gradients and two Adam moments, an update's activations (the online pass at N levels, the target
    pass at K + N', the loss's N x N' pairs), the environments (evaluation plays one)."""
    parameters, per_level, per_observation = network_sizes(args, obs_shape, num_actions)
    levels = args.num_tau_samples + args.num_quantile_samples + args.num_tau_prime_samples
    pairs = 6 * args.num_tau_samples * args.num_tau_prime_samples  # the loss's tensors over (N, N') pairs
    acting = per_observation + args.num_quantile_samples * per_level
    network_flags = ("hidden_size", "quantile_embedding_dim")
    needs = flag_checks.common_needs(args, parameters, 5, network_flags, 1, acting)
    if args.eval_only:
        return needs
    update = flag_checks.activation_memory_bytes(args.batch_size, 2 * per_observation + levels * per_level + pairs)
    flags = ("batch_size", "num_tau_samples", "num_tau_prime_samples", "num_quantile_samples") + network_flags
    return needs + [
        ("the replay", replay_memory_bytes(args, obs_shape), ("buffer_size",)),
        ("an update's activations", update, flags),
    ]


def make_env(env_id: str, num_envs: int, seed: int):
    if minatar.is_minatar(env_id):
        return minatar.make_envs(env_id, num_envs, seed)
    if envpool is None:  # stepped as envpool steps, NEXT_STEP autoreset included
        return classic_control.make_envs(env_id, num_envs, seed)
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed)


def cosine_embedding(taus: torch.Tensor, embedding_dim: int) -> torch.Tensor:
    """cos(pi * i * tau) for i = 1..embedding_dim. taus (B, N) -> (B, N, embedding_dim)."""
    i = torch.arange(1, embedding_dim + 1, device=taus.device, dtype=taus.dtype)
    return torch.cos(torch.pi * i * taus.unsqueeze(-1))


class QuantileNetwork(nn.Module):
    """Z(x, tau) = head(psi(x) * phi(tau)), the tau-quantiles of every action's return: x (B, *obs_shape) and taus (B, N)
    -> (B, N, num_actions). psi(x) is computed once per state, phi(tau) = ReLU(Linear(cos(pi i tau))) once per level."""

    def __init__(self, obs_shape: tuple, num_actions: int, embedding_dim: int, hidden_size: int):
        super().__init__()
        self.embedding_dim, self.is_grid = embedding_dim, len(obs_shape) == 3
        if self.is_grid:  # Young & Tian's MinAtar network
            height, width, channels = obs_shape
            self.torso = nn.Sequential(nn.Conv2d(channels, 16, 3), nn.ReLU(), nn.Flatten())
            features, hidden_size = 16 * (height - 2) * (width - 2), 128
            self.torso_name = f"convolutional (16 filters 3x3; head of 128 units) for {height}x{width}x{channels} grids"
        else:
            features = hidden_size
            self.torso = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(obs_shape)), hidden_size), nn.ReLU())
            self.torso_name = f"MLP of {hidden_size} units for vectors of {int(np.prod(obs_shape))}"
        self.tau_embedding = nn.Sequential(nn.Linear(embedding_dim, features), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(features, hidden_size), nn.ReLU(), nn.Linear(hidden_size, num_actions))

    def forward(self, x: torch.Tensor, taus: torch.Tensor) -> torch.Tensor:
        features = self.torso(x.permute(0, 3, 1, 2).float() if self.is_grid else x)
        tau_features = self.tau_embedding(cosine_embedding(taus, self.embedding_dim))
        return self.head(features.unsqueeze(1) * tau_features)

    def q_values(self, x: torch.Tensor, num_quantile_samples: int) -> torch.Tensor:
        """Mean over K = num_quantile_samples random quantiles: (B, num_actions)."""
        taus = torch.rand(x.shape[0], num_quantile_samples, device=x.device)
        return self(x, taus).mean(dim=1)


class Batch(NamedTuple):
    obs: torch.Tensor  # o_t
    actions: torch.Tensor  # a_t
    returns: torch.Tensor  # sum_{k<m} gamma^k r_{t+k}
    discounts: torch.Tensor  # gamma^m, or 0 if the episode terminated within the m steps
    next_obs: torch.Tensor  # o_{t+m}


class ReplayBuffer:
    """Uniform replay that stores every observation once, in one ring of `capacity // num_envs` slots per environment.
    Slot t of environment e holds o_t, the action taken at o_t, and the reward and `terminated` flag of the step that
    followed; o_{t+1} is slot t + 1, so a transition costs one observation, not two. `valid[e, t]` is False when the
    step after t was envpool's reset step, never a transition. A sample from o_t runs over up to `n_step` steps of one
    episode: it stops after a termination, at an episode's last observation (a time-out, bootstrapped from there) and
    at the newest stored step. iqn_atari.py's buffer is this one plus the rebuilding of 4-frame stacks."""

    def __init__(self, capacity, num_envs, obs_shape, device, rng, n_step=1, gamma=0.99):
        self.ring = capacity // num_envs
        self.num_envs, self.device, self.rng, self.n_step, self.gamma = num_envs, device, rng, n_step, gamma
        self.obs = np.zeros((num_envs, self.ring, *obs_shape), dtype=np.float32)
        self.actions = np.zeros((num_envs, self.ring), dtype=np.int64)
        self.rewards = np.zeros((num_envs, self.ring), dtype=np.float32)
        self.terminated = np.zeros((num_envs, self.ring), dtype=np.float32)
        self.valid = np.zeros((num_envs, self.ring), dtype=bool)
        self.num_added = 0  # slots written per ring so far; slot of logical step t is t % ring

    ARRAYS = ("obs", "actions", "rewards", "terminated", "valid")

    def add(self, obs, actions, rewards, terminated, valid):
        """One step of every environment: o_t (num_envs, *obs_shape) and what followed it."""
        for name, value in zip(self.ARRAYS, (obs, actions, rewards, terminated, valid)):
            getattr(self, name)[:, self.num_added % self.ring] = value
        self.num_added += 1

    def sample(self, batch_size: int) -> Batch:
        # Logical steps still stored whose successor o_{t+1} is already written.
        low = max(0, self.num_added - self.ring)
        env, t = np.zeros(batch_size, dtype=np.int64), np.zeros(batch_size, dtype=np.int64)
        invalid = np.ones(batch_size, dtype=bool)
        while invalid.any():  # rejection keeps sampling uniform over real transitions, O(1) expected per item
            env[invalid] = self.rng.integers(self.num_envs, size=invalid.sum())
            t[invalid] = self.rng.integers(low, self.num_added - 1, size=invalid.sum())
            invalid = ~self.valid[env, t % self.ring]
        steps = t[:, None] + np.arange(self.n_step)  # t, ..., t + n - 1
        slots, rows = steps % self.ring, env[:, None]
        rewards, terminated = self.rewards[rows, slots], self.terminated[rows, slots]
        # Step t + k continues the sample if step t + k - 1 did not terminate, o_{t+k} is not an episode's last
        # observation, and the step after t + k is already stored.
        continues = (terminated[:, :-1] == 0) & self.valid[rows, slots[:, 1:]] & (steps[:, 1:] <= self.num_added - 2)
        returns, discounts, num_steps = n_step_targets(rewards, terminated, continues, self.gamma)
        slot, next_slot = t % self.ring, (t + num_steps) % self.ring
        batch = (self.obs[env, slot], self.actions[env, slot], returns, discounts, self.obs[env, next_slot])
        return Batch(*(torch.from_numpy(array).to(self.device) for array in batch))

    def state_dict(self) -> dict:
        """Tensors sharing the arrays' memory: torch.save writes them without the copy that pickling numpy makes."""
        return {**{name: torch.from_numpy(getattr(self, name)) for name in self.ARRAYS}, "num_added": self.num_added}

    def load_state_dict(self, state: dict) -> None:
        for name in self.ARRAYS:  # the checkpoint's flags made the same shapes
            setattr(self, name, state[name].numpy())
        self.num_added = state["num_added"]


def replay_memory_bytes(args: Args, obs_shape: tuple) -> int:
    """Bytes of the arrays that ReplayBuffer allocates: per slot a float32 observation, an int64 action, a float32
    reward, a float32 terminated flag and a bool valid flag."""
    slots = (args.buffer_size // args.num_envs) * args.num_envs
    return slots * (int(np.prod(obs_shape)) * 4 + 8 + 4 + 4 + 1)


def quantile_huber_loss(quantiles, taus, target_quantiles, kappa: float = 1.0) -> torch.Tensor:
    """Quantile regression loss with a Huber core, per sample.

    quantiles (B, N) online Z_i at levels taus (B, N); target_quantiles (B, N') samples T_j of the target
    distribution. With delta_ij = T_j - Z_i, returns (B,): sum over i of the mean over j of
    |tau_i - 1{delta_ij < 0}| * Huber_kappa(delta_ij) / kappa.
    """
    delta = target_quantiles.unsqueeze(1) - quantiles.unsqueeze(2)  # (B, N, N')
    abs_delta = delta.abs()
    huber = torch.where(abs_delta <= kappa, 0.5 * delta**2, kappa * (abs_delta - 0.5 * kappa))
    weight = (taus.unsqueeze(2) - (delta.detach() < 0).float()).abs()
    return (weight * huber / kappa).mean(dim=2).sum(dim=1)


def n_step_targets(rewards, terminated, continues, gamma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n-step returns of a batch of samples that start at steps t.

    rewards, terminated (B, n): reward and termination flag of steps t, ..., t + n - 1; continues (B, n - 1): whether
    step t + k + 1 may follow step t + k in the sample. A sample takes the m steps up to the first False in
    `continues`. Returns (B,) each: sum_{k<m} gamma^k r_{t+k} (float32), gamma^m times 0 if step t + m - 1
    terminated else 1 (float32), and m (int64), so the target is returns + discounts * Z(o_{t+m}).
    """
    batch, n = rewards.shape
    taken = np.concatenate([np.ones((batch, 1), dtype=bool), np.cumprod(continues, axis=1, dtype=bool)], axis=1)
    num_steps = taken.sum(axis=1)
    returns = (rewards * taken * gamma ** np.arange(n)).sum(axis=1)
    last_terminated = terminated[np.arange(batch), num_steps - 1]
    discounts = gamma**num_steps * (1.0 - last_terminated)
    return returns.astype(np.float32), discounts.astype(np.float32), num_steps.astype(np.int64)


def linear_schedule(start: float, end: float, duration: float, t):
    """Linear from `start` at agent step 0 to `end` at step `duration`, then `end`; a `duration` of 0 is `end` from the
    first step. `t` is a step or an array of steps; the result (float64) has its shape."""
    t = np.asarray(t, dtype=np.float64)
    value = start + (end - start) * t / duration if duration > 0 else np.full_like(t, end)
    return np.clip(value, min(start, end), max(start, end))


def crossed(step: int, num_envs: int, every: int) -> int:
    """How many multiples of `every` the step counter passed while advancing by num_envs to `step`."""
    return step // every - (step - num_envs) // every


def iqn_loss(q_network: QuantileNetwork, target_network: QuantileNetwork, data: Batch, args: Args):
    """The quantile Huber loss of a batch against its n-step targets (mean over the batch), and the online quantiles
    Z(o_t, a_t) at the N sampled levels (B, N)."""
    N, N_prime, K, batch_size = args.num_tau_samples, args.num_tau_prime_samples, args.num_quantile_samples, len(data.obs)
    with torch.no_grad():
        # One target pass: K levels pick the greedy next action, N' levels give its return quantiles.
        next_z = target_network(data.next_obs, torch.rand(batch_size, K + N_prime, device=data.obs.device))
        next_actions = next_z[:, :K].mean(dim=1).argmax(dim=1)
        next_quantiles = next_z[:, K:, :].gather(2, next_actions.view(-1, 1, 1).expand(-1, N_prime, 1))
        target_quantiles = data.returns.unsqueeze(1) + data.discounts.unsqueeze(1) * next_quantiles.squeeze(2)
    taus = torch.rand(batch_size, N, device=data.obs.device)
    quantiles = q_network(data.obs, taus).gather(2, data.actions.view(-1, 1, 1).expand(-1, N, 1)).squeeze(2)
    return quantile_huber_loss(quantiles, taus, target_quantiles, args.kappa).mean(), quantiles


def train_step(q_network: QuantileNetwork, target_network: QuantileNetwork, optimizer, batch: Batch, args: Args):
    """One gradient step on a sampled `batch`. Returns the loss, the online quantiles (B, N) and whether the gradient
    norm was finite (a device tensor, read at logging intervals)."""
    loss, quantiles = iqn_loss(q_network, target_network, batch, args)
    optimizer.zero_grad()
    loss.backward()
    # max_norm inf leaves the gradients as they are: the norm is taken for the NaN stop
    grad_norm = torch.nn.utils.clip_grad_norm_(q_network.parameters(), float("inf"))
    optimizer.step()
    return loss, quantiles, torch.isfinite(grad_norm)


def seconds_per_update(q_network, target_network, optimizer, args: Args, obs_shape: tuple, device) -> float:
    """Seconds one update takes, timed before the loop for the progress line's first estimate: `train_step` on copies of
    the networks (and a fresh optimizer of the same kind) with a batch of zeros of the real shapes and dtypes, the
    median of 3 calls after an untimed one (which pays for first-call allocations). Every random generator is left as
    it was (the update draws its quantile levels from torch's), so that the run's numbers do not depend on the timing."""
    rng = checkpoint_files.rng_states()
    online, target = copy.deepcopy(q_network), copy.deepcopy(target_network)
    timed_optimizer = type(optimizer)(online.parameters(), **optimizer.defaults)
    obs = torch.as_tensor(np.zeros((args.batch_size, *obs_shape), dtype=np.float32), device=device)
    returns = torch.zeros(args.batch_size, device=device)
    actions = torch.zeros(args.batch_size, dtype=torch.int64, device=device)
    batch = Batch(obs, actions, returns, returns.clone(), obs.clone())
    times = []
    for _ in range(4):
        start = time.perf_counter()
        train_step(online, target, timed_optimizer, batch, args)
        if device.type == "cuda":  # kernels run asynchronously: the update ends when the device is done
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    checkpoint_files.set_rng_states(rng)
    return sorted(times[1:])[1]


def act(q_network: QuantileNetwork, obs, epsilon: float, num_quantile_samples: int, warm_up: bool = False) -> np.ndarray:
    """Epsilon-greedy actions (num_envs,) in the mean over K = num_quantile_samples quantiles; uniform in the warm-up."""
    num_envs, num_actions = len(obs), q_network.head[-1].out_features
    if warm_up:
        return np.random.randint(num_actions, size=num_envs)
    with torch.no_grad():
        q = q_network.q_values(torch.as_tensor(obs, device=next(q_network.parameters()).device), num_quantile_samples)
    actions = q.argmax(dim=1).cpu().numpy()
    explore = np.random.rand(num_envs) < epsilon
    actions[explore] = np.random.randint(num_actions, size=explore.sum())
    return actions


def evaluate(weights: dict, args: Args, device: torch.device, video_folder: str) -> list[float]:
    """Scores of --eval-episodes episodes of the network with `weights` (a model file's), epsilon-greedy (--eval-epsilon),
    on an env seeded --seed + EVAL_SEED_OFFSET; videos of them in `video_folder` with --capture-video."""
    if args.eval_episodes == 0:  # none to play
        return []
    seed = args.seed + EVAL_SEED_OFFSET
    if args.capture_video:
        envs = gym.vector.SyncVectorEnv([lambda: environments.make_video_env(args.env_id, video_folder)])
    else:
        envs = make_env(args.env_id, 1, seed)
    obs_shape, num_actions = envs.single_observation_space.shape, envs.single_action_space.n
    model = QuantileNetwork(obs_shape, num_actions, args.quantile_embedding_dim, args.hidden_size).to(device)
    model_files.put_weights(model, weights, args.model_path)
    obs, _ = envs.reset(seed=seed) if args.capture_video else envs.reset()
    stats, is_reset_step = episode_scores.EpisodeStats(1), np.zeros(1, dtype=bool)
    while len(stats.scores) < args.eval_episodes:
        obs, rewards, terminated, truncated, _ = envs.step(act(model, obs, args.eval_epsilon, args.num_quantile_samples))
        stats.update(rewards, is_reset_step, terminated | truncated)
        is_reset_step = terminated | truncated  # the next step only resets (NEXT_STEP autoreset)
    envs.close()
    return stats.scores


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
        envs = make_env(args.env_id, args.num_envs, run.env_seed)
        num_actions, obs_shape = envs.single_action_space.n, envs.single_observation_space.shape
        network_sizes = (obs_shape, num_actions, args.quantile_embedding_dim, args.hidden_size)
        q_network = QuantileNetwork(*network_sizes).to(device)
        print(f"  torso: {q_network.torso_name}")
        optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, eps=args.adam_eps)
        target_network = QuantileNetwork(*network_sizes).to(device)
        target_network.load_state_dict(q_network.state_dict())
        rng = np.random.default_rng(args.seed)  # the replay's sampling
        rb = ReplayBuffer(args.buffer_size, args.num_envs, obs_shape, device, rng, args.n_step, args.gamma)
        num_iterations = -(-args.total_timesteps // args.num_envs)
        # Every action sent to envs.step, reset steps included: a resume replays them to rebuild the environments.
        action_log = np.zeros((num_iterations, args.num_envs), dtype=np.min_scalar_type(num_actions - 1))
        stats = episode_scores.EpisodeStats(args.num_envs)
        obs, _ = envs.reset()  # envpool is seeded at construction
        is_reset_step = np.zeros(args.num_envs, dtype=bool)  # the step from o_t is envpool's reset step
        start_iteration, updates, learn_from = 0, 0, args.learning_starts  # updates once past learn_from

        def checkpoint_state(iterations_done: int) -> dict:
            """All a resume needs, as plain values."""
            learner = dict(q_network=q_network.state_dict(), target_network=target_network.state_dict())
            learner |= dict(optimizer=optimizer.state_dict(), updates=updates)
            actors = dict(obs=obs.copy(), is_reset_step=is_reset_step.copy())
            logs = dict(iteration=iterations_done, stats=stats.state_dict(), rng=rng.bit_generator.state)
            logs |= dict(action_log=action_log[:iterations_done].copy())
            replay = {"rb": rb.state_dict()} if args.checkpoint_replay else {}  # the replay is optional
            return learner | actors | logs | replay

        if checkpoint:
            with run.restoring() as saved:
                q_network.load_state_dict(saved["q_network"])
                target_network.load_state_dict(saved["target_network"])
                optimizer.load_state_dict(saved["optimizer"])
                obs[:] = saved["obs"]
                is_reset_step[:] = saved["is_reset_step"]
                stats.load_state_dict(saved["stats"])
                rng.bit_generator.state = saved["rng"]
                action_log[: len(saved["action_log"])] = saved["action_log"]
                if args.checkpoint_replay:
                    rb.load_state_dict(saved["rb"])
                start_iteration, updates = saved["iteration"], saved["updates"]
            envs, obs = run.fast_forward(envs, action_log[:start_iteration], obs, stats)
            if args.resume_fresh_envs:  # new games: every env's next step is a reset step; partial scores dropped
                is_reset_step[:] = True
                stats.drop_games_in_progress()
            if not args.checkpoint_replay:  # an empty buffer: act until it holds learning_starts steps again
                learn_from = start_iteration * args.num_envs + args.learning_starts
                run.note_empty_replay(learn_from)
        timed = seconds_per_update(q_network, target_network, optimizer, args, obs_shape, device)
        progress = run.progress(start_iteration * args.num_envs, 1 / args.train_frequency, timed)
        # The NaN stop, kept on the device and read at logging intervals: no wait for the device at every update.
        updates_finite = torch.ones((), dtype=torch.bool, device=device)
        for iteration in range(start_iteration + 1, num_iterations + 1):
            global_step = iteration * args.num_envs
            epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step)
            actions = act(q_network, obs, epsilon, args.num_quantile_samples, warm_up=global_step <= args.learning_starts)
            action_log[iteration - 1] = actions
            next_obs, rewards, terminated, truncated, infos = envs.step(actions)
            # NEXT_STEP autoreset: after a last step, envpool's next step is a reset step, never a transition.
            rb.add(obs, actions, rewards, terminated, valid=~is_reset_step)
            stats.update(rewards, is_reset_step, terminated | truncated, run.writer, global_step)  # time-outs too
            obs, is_reset_step = next_obs, terminated | truncated

            if global_step > learn_from:
                if args.anneal_lr:
                    optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - global_step / args.total_timesteps)
                for _ in range(crossed(global_step, args.num_envs, args.train_frequency)):
                    batch = rb.sample(args.batch_size)
                    loss, quantiles, finite = train_step(q_network, target_network, optimizer, batch, args)
                    updates_finite &= finite
                    updates += 1
                    if updates % 100 == 0:
                        run.check_finite(updates_finite, global_step)
                        run.writer.add_scalar("losses/quantile_loss", loss.item(), global_step)
                        run.writer.add_scalar("losses/q_values", quantiles.mean().item(), global_step)
                        run.writer.add_scalar("charts/epsilon", epsilon, global_step)
                        run.writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                        run.writer.add_scalar("charts/SPS", progress.sps(global_step), global_step)
                if crossed(global_step, args.num_envs, args.target_network_frequency):
                    target_network.load_state_dict(q_network.state_dict())

            progress.print(global_step, stats.recent)
            is_last = iteration == num_iterations
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
    main(command_line.parse(Args, minatar=MINATAR_DEFAULTS))
