"""Implicit Quantile Networks (IQN) for vector observations (classic control).

IQN learns the whole distribution of returns: the network maps a state and a quantile level tau ~ U(0, 1) to the
tau-quantile of the return of each action, trained with the quantile Huber loss against quantiles of the n-step
target distribution; actions are greedy in the mean over K sampled quantiles. Same algorithm as `iqn_atari.py`, with
an MLP torso instead of the Nature CNN and defaults tuned for small tasks (3-step returns, as Dopamine's IQN).

Paper: Dabney, Ostrovski, Silver, Munos, "Implicit Quantile Networks for Distributional Reinforcement Learning",
ICML 2018. Docs: docs/rl-algorithms/iqn.md
"""

import os
import random
import signal
import time
from dataclasses import dataclass
from typing import NamedTuple, Optional

import envpool
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
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
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "cleanrl-q"
    """the wandb's project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to record videos of the evaluation episodes (to `videos/<run_name>/`)"""
    save_model: bool = False
    """whether to save the model to `runs/<run_name>/` and evaluate it after training"""
    eval_episodes: int = 10
    """the number of episodes of the evaluation after training (with `--save-model`)"""

    env_id: str = "CartPole-v1"
    """the id of the envpool environment (classic control, vector observations)"""
    total_timesteps: int = 300_000
    """total environment steps of the experiment, summed over the vectorized environments"""
    num_envs: int = 4
    """the number of parallel environments"""
    learning_rate: float = 1e-3
    """the learning rate of the Adam optimizer"""
    adam_eps: float = 3.125e-4
    """the epsilon of the Adam optimizer"""
    anneal_lr: bool = True
    """if toggled, the learning rate decays linearly to 0 over training"""
    buffer_size: int = 200_000
    """the replay capacity in transitions (split evenly over the environments); the default holds 2/3 of the run"""
    gamma: float = 0.99
    """the discount factor"""
    n_step: int = 3
    """the number of steps of the n-step return (Dopamine's IQN: 3; the paper: 1; with 1, 4 of 10 CartPole seeds end < 475)"""
    batch_size: int = 64
    """the number of transitions per gradient update"""
    learning_starts: int = 1_000
    """environment steps of uniform-random acting before learning starts"""
    train_frequency: int = 4
    """environment steps per gradient update"""
    target_network_frequency: int = 200
    """environment steps between copies of the online network into the target network"""
    start_e: float = 1.0
    """the starting epsilon of the epsilon-greedy exploration"""
    end_e: float = 0.01
    """the final epsilon of the epsilon-greedy exploration"""
    exploration_steps: int = 10_000
    """environment steps over which epsilon decays linearly from `start_e` to `end_e`"""
    eval_epsilon: float = 0.001
    """the epsilon of the evaluation episodes"""
    num_tau_samples: int = 8
    """N: quantile samples of the online network per transition in the loss"""
    num_tau_prime_samples: int = 8
    """N': quantile samples of the target distribution per transition in the loss"""
    num_quantile_samples: int = 32
    """K: quantile samples whose mean gives the Q-values used to pick actions"""
    quantile_embedding_dim: int = 64
    """the number of cosine features cos(pi i tau), i = 1..dim, of the quantile embedding"""
    kappa: float = 1.0
    """the threshold of the Huber loss inside the quantile loss"""
    hidden_dim: int = 64
    """width of the MLP torso, of the quantile embedding and of the hidden layer of the head"""
    checkpoint_every: int = 0
    """write a resumable checkpoint every this many agent steps (0: only on SIGINT/SIGTERM)"""
    checkpoint_replay: bool = False
    """also store the replay buffer in checkpoints (large, but the resumed run is then exact)"""
    resume: Optional[str] = None
    """continue the run saved in this checkpoint, in the same run directory (and W&B run)"""


def validate_args(args: Args) -> None:
    if args.env_id not in envpool.list_all_envs():
        raise SystemExit(f"error: --env-id={args.env_id}: not an envpool environment id")
    spec = envpool.make_spec(args.env_id)
    if not isinstance(spec.action_space, gym.spaces.Discrete):
        raise SystemExit(f"error: --env-id={args.env_id}: the action space must be Discrete")
    if len(spec.observation_space.shape) != 1:
        raise SystemExit(f"error: --env-id={args.env_id}: needs vector observations (for Atari use iqn_atari.py)")
    positive = ["total_timesteps", "num_envs", "n_step", "batch_size", "train_frequency", "target_network_frequency",
                "exploration_steps", "num_tau_samples", "num_tau_prime_samples", "num_quantile_samples",
                "quantile_embedding_dim", "hidden_dim", "learning_rate", "adam_eps", "kappa"]  # fmt: skip
    for name in positive:
        if getattr(args, name) <= 0:
            raise SystemExit(f"error: --{name.replace('_', '-')}={getattr(args, name)}: must be > 0")
    for name in ["gamma", "start_e", "end_e", "eval_epsilon"]:
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise SystemExit(f"error: --{name.replace('_', '-')}={getattr(args, name)}: must be in [0, 1]")
    if args.learning_starts < args.batch_size:
        raise SystemExit(f"error: --learning-starts={args.learning_starts}: must be >= --batch-size={args.batch_size}")
    if args.buffer_size // args.num_envs < max(args.learning_starts // args.num_envs, 2 * STACK_NUM + 2):
        raise SystemExit(
            f"error: --buffer-size={args.buffer_size}: must hold --learning-starts={args.learning_starts} steps "
            f"and at least {2 * STACK_NUM + 2} steps per environment (--num-envs={args.num_envs})"
        )
    if args.eval_episodes < 0:
        raise SystemExit(f"error: --eval-episodes={args.eval_episodes}: must be >= 0")
    if args.checkpoint_every < 0:
        raise SystemExit(f"error: --checkpoint-every={args.checkpoint_every}: must be >= 0 (0: only on a signal)")
    if args.resume is not None and not os.path.isfile(args.resume):
        raise SystemExit(f"error: --resume={args.resume}: no such file")


# Vector observations are not stacked; the replay below is shared with iqn_atari.py, where 4 frames are.
STACK_NUM = 1


def make_env(env_id: str, num_envs: int, seed: int):
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed)


def cosine_embedding(taus: torch.Tensor, embedding_dim: int) -> torch.Tensor:
    """cos(pi * i * tau) for i = 1..embedding_dim. taus (B, N) -> (B, N, embedding_dim)."""
    i = torch.arange(1, embedding_dim + 1, device=taus.device, dtype=taus.dtype)
    return torch.cos(torch.pi * i * taus.unsqueeze(-1))


class QuantileNetwork(nn.Module):
    """Z(x, tau) = head(psi(x) * phi(tau)): the tau-quantiles of the return of every action.

    x (B, *obs_shape) and taus (B, N) -> (B, N, num_actions). The state features psi(x) are computed once per state
    and multiplied element-wise by the embedding phi(tau) = ReLU(Linear(cos(pi i tau))) of each quantile level.
    """

    def __init__(self, obs_dim: int, num_actions: int, embedding_dim: int, hidden_dim: int):
        super().__init__()
        self.embedding_dim = embedding_dim
        self.torso = nn.Sequential(nn.Flatten(), nn.Linear(obs_dim, hidden_dim), nn.ReLU())
        feature_dim = hidden_dim
        self.tau_embedding = nn.Sequential(nn.Linear(embedding_dim, feature_dim), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(feature_dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, num_actions))

    def forward(self, x: torch.Tensor, taus: torch.Tensor) -> torch.Tensor:
        features = self.torso(x)
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

    Slot t of environment e holds the newest frame of observation o_t, whether o_t starts a game, the action taken
    at o_t, and the reward and `terminated` flag of the step that followed. o_{t+1} is slot t + 1 of the same ring,
    so a transition costs one frame instead of two stacks of `stack_num` frames. A stack is rebuilt from the
    `stack_num` slots ending at t, the way envpool builds it: at the start of a game every stack position holds the
    game's first frame, while after a lost life (`episodic_life`) the stack runs on across the boundary.
    `valid[e, t]` is False when the step after t was envpool's reset step, which is never a transition.
    A sample from o_t runs over up to `n_step` steps of the same episode: it stops after a termination, at an
    episode's last observation (a time-out, bootstrapped from there) and at the newest stored step.
    """

    def __init__(
        self, capacity, num_envs, frame_shape, frame_dtype, stack_num, device, rng: np.random.Generator,
        n_step: int = 1, gamma: float = 0.99,
    ):  # fmt: skip
        self.ring = capacity // num_envs
        self.num_envs, self.stack_num, self.device, self.rng = num_envs, stack_num, device, rng
        self.n_step, self.gamma = n_step, gamma
        self.frames = np.zeros((num_envs, self.ring, *frame_shape), dtype=frame_dtype)
        self.game_start = np.zeros((num_envs, self.ring), dtype=bool)
        self.actions = np.zeros((num_envs, self.ring), dtype=np.int64)
        self.rewards = np.zeros((num_envs, self.ring), dtype=np.float32)
        self.terminated = np.zeros((num_envs, self.ring), dtype=np.float32)
        self.valid = np.zeros((num_envs, self.ring), dtype=bool)
        self.num_added = 0  # slots written per ring so far; slot of logical step t is t % ring

    def add(self, frames, game_start, actions, rewards, terminated, valid):
        """One step of every environment: the newest frame of o_t (num_envs, *frame_shape) and what followed it."""
        t = self.num_added % self.ring
        self.frames[:, t] = frames
        self.game_start[:, t] = game_start
        self.actions[:, t] = actions
        self.rewards[:, t] = rewards
        self.terminated[:, t] = terminated
        self.valid[:, t] = valid
        self.num_added += 1

    def stacks(self, env: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Observations o_t of envs `env` at logical steps `t`, (B,) each -> (B, stack_num, *frame_shape)."""
        window = t[:, None] - np.arange(self.stack_num - 1, -1, -1)  # t - stack_num + 1, ..., t
        # Positions before the latest game start inside the window repeat that start's frame.
        is_start = self.game_start[env[:, None], window % self.ring] & (window >= 0)
        latest_start = np.where(is_start, window, -1).max(axis=1, keepdims=True)
        window = np.maximum(window, latest_start)
        return self.frames[env[:, None], window % self.ring]

    def sample(self, batch_size: int) -> Batch:
        # Logical steps whose whole stack is still stored and whose successor o_{t+1} is already written.
        low = max(0, self.num_added - self.ring + self.stack_num - 1)
        env = self.rng.integers(self.num_envs, size=batch_size)
        t = self.rng.integers(low, self.num_added - 1, size=batch_size)
        invalid = ~self.valid[env, t % self.ring]
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
        to_tensor = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
        return Batch(
            obs=to_tensor(self.stacks(env, t)),
            actions=to_tensor(self.actions[env, t % self.ring]),
            returns=to_tensor(returns),
            discounts=to_tensor(discounts),
            next_obs=to_tensor(self.stacks(env, t + num_steps)),
        )

    ARRAYS = ("frames", "game_start", "actions", "rewards", "terminated", "valid")

    def state_dict(self) -> dict:
        """The stored steps as tensors sharing the arrays' memory: torch.save writes them without the full copy
        that pickling a numpy array makes."""
        return {**{name: torch.from_numpy(getattr(self, name)) for name in self.ARRAYS}, "num_added": self.num_added}

    def load_state_dict(self, state: dict) -> None:
        for name in self.ARRAYS:
            if tuple(state[name].shape) != getattr(self, name).shape:
                raise SystemExit(f"error: --resume: the stored replay {name} has shape {tuple(state[name].shape)}")
            setattr(self, name, state[name].numpy())
        self.num_added = state["num_added"]

    def add_history(self, stacks: np.ndarray) -> None:
        """Starts an empty buffer in the middle of games (a resume without stored replay): the older frames of the
        current stacks (num_envs, stack_num, ...) go in as slots that are not transitions, so that the stacks ending
        at the next slots are rebuilt exactly."""
        no = np.zeros(self.num_envs, dtype=bool)
        for k in range(self.stack_num - 1):
            self.add(stacks[:, k], no, no, no, no, valid=no)


def replay_memory_bytes(args: Args, frame_shape: tuple, frame_dtype) -> int:
    """Bytes of the arrays that ReplayBuffer allocates: per slot one frame, a bool game start, an int64 action, a
    float32 reward, a float32 terminated flag and a bool valid flag."""
    slots = (args.buffer_size // args.num_envs) * args.num_envs
    frame_bytes = int(np.prod(frame_shape)) * np.dtype(frame_dtype).itemsize
    return slots * (frame_bytes + 1 + 8 + 4 + 4 + 1)


def available_memory_bytes() -> int:
    """MemAvailable of /proc/meminfo (free RAM plus what the kernel can reclaim), else the free physical pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_replay_memory(args: Args) -> None:
    """Refuses, before anything is built, a replay that would not fit in RAM (numpy would fail or swap much later)."""
    needed = replay_memory_bytes(args, envpool.make_spec(args.env_id).observation_space.shape, np.float32)
    available = available_memory_bytes()
    if needed > available:
        raise SystemExit(
            f"error: --buffer-size={args.buffer_size}: the replay needs about {needed / 1e9:,.1f} GB but "
            f"{available / 1e9:,.1f} GB are available; lower --buffer-size"
        )


def quantile_huber_loss(
    quantiles: torch.Tensor, taus: torch.Tensor, target_quantiles: torch.Tensor, kappa: float = 1.0
) -> torch.Tensor:
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


def n_step_targets(
    rewards: np.ndarray, terminated: np.ndarray, continues: np.ndarray, gamma: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n-step returns of a batch of samples that start at steps t.

    rewards, terminated (B, n): reward and termination flag of steps t, ..., t + n - 1; continues (B, n - 1): whether
    step t + k + 1 may follow step t + k in the sample. A sample takes the m steps up to the first False in
    `continues`. Returns (B,) each: sum_{k<m} gamma^k r_{t+k} (float32), gamma^m times 0 if step t + m - 1
    terminated else 1 (float32), and m (int64), so the target is returns + discounts * Z(o_{t+m}).
    """
    batch, n = rewards.shape
    taken = np.concatenate([np.ones((batch, 1), dtype=bool), np.cumprod(continues, axis=1, dtype=bool)], axis=1)
    num_steps = taken.sum(axis=1)
    powers = gamma ** np.arange(n)
    returns = (rewards * taken * powers).sum(axis=1)
    last_terminated = terminated[np.arange(batch), num_steps - 1]
    discounts = gamma**num_steps * (1.0 - last_terminated)
    return returns.astype(np.float32), discounts.astype(np.float32), num_steps.astype(np.int64)


def linear_schedule(start_e: float, end_e: float, duration: int, t: int) -> float:
    return max(end_e, start_e + (end_e - start_e) * t / duration)


def crossed(step: int, num_envs: int, every: int) -> int:
    """How many multiples of `every` the step counter passed while advancing by num_envs to `step`."""
    return step // every - (step - num_envs) // every


# Checkpoints. envpool cannot save its state, but it is deterministic given its seed and the actions: a checkpoint
# holds the log of every action sent to envs.step, and a resume rebuilds the environments by replaying it.
CHECKPOINT_VERSION = 1
CHECKPOINT_KEYS = ("format_version", "script", "args", "run_name", "wandb_id", "global_step", "iteration",
                   "num_updates", "q_network", "target_network", "optimizer", "rng", "scores", "episode_return",
                   "episode_length", "obs_starts_game", "obs_is_last", "obs_ends_game", "obs", "action_log",
                   "replay")  # fmt: skip
RESUME_FLAGS = ("resume", "checkpoint_every", "cuda", "track")  # taken from the command line, the rest from the file


class StopRequest:
    """Installs SIGINT/SIGTERM handlers: the first signal asks the loop to stop after the current step (it then
    writes a checkpoint), a second one exits at once. `restore()` puts back the previous handlers, since main can be
    called in-process."""

    def __init__(self):
        self.requested = False
        self.previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handle(self, signum, frame):
        if self.requested:
            self.restore()
            raise KeyboardInterrupt
        self.requested = True
        print("stopping after this step; a second signal exits at once")

    def restore(self):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def rng_states(replay_rng: np.random.Generator) -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "replay": replay_rng.bit_generator.state,
    }


def set_rng_states(states: dict, replay_rng: np.random.Generator) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    replay_rng.bit_generator.state = states["replay"]


def save_checkpoint(state: dict, path: str) -> str:
    """Writes atomically: a run killed while writing keeps its previous checkpoint intact."""
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def load_checkpoint(path: str) -> dict:
    size, available = os.path.getsize(path), available_memory_bytes()
    if size > available:
        raise SystemExit(
            f"error: --resume={path}: the checkpoint takes {size / 1e9:,.1f} GB but {available / 1e9:,.1f} GB are available"
        )
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)  # holds numpy RNG states
        if not isinstance(checkpoint, dict):
            raise ValueError(f"holds a {type(checkpoint).__name__}, not a dict")
        missing = [key for key in CHECKPOINT_KEYS if key not in checkpoint]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        if checkpoint["format_version"] != CHECKPOINT_VERSION:
            raise ValueError(f"format version {checkpoint['format_version']}, expected {CHECKPOINT_VERSION}")
        if checkpoint["script"] != os.path.basename(__file__):
            raise ValueError(f"written by {checkpoint['script']}")
    except Exception as e:
        raise SystemExit(f"error: --resume={path}: not a readable checkpoint ({e})") from None
    return checkpoint


def resumed_args(given: Args, saved: dict) -> Args:
    """The checkpoint's args with this command's RESUME_FLAGS; says which other given flags are ignored."""
    args = Args(**{**saved, **{name: getattr(given, name) for name in RESUME_FLAGS}})
    defaults = Args()
    ignored = [
        f"--{name.replace('_', '-')}={getattr(given, name)}"
        for name in saved
        if name not in RESUME_FLAGS and getattr(given, name) not in (getattr(defaults, name), saved[name])
    ]
    if ignored:
        print(f"--resume: the run continues with its saved flags; ignoring {' '.join(ignored)}")
    return args


def replay_actions(envs, action_log: np.ndarray, expected_obs: np.ndarray) -> np.ndarray:
    """Steps freshly reset environments through the logged actions; returns the observation they reach."""
    print(f"resume: replaying {len(action_log)} logged steps of the environments to restore their state")
    obs = None
    for actions in action_log:
        obs, *_ = envs.step(actions.astype(np.int64))
    if obs is None or not np.array_equal(obs, expected_obs):
        raise SystemExit(
            "error: --resume: environment replay diverged from the checkpoint's observation "
            "(another envpool version or environment settings?)"
        )
    return obs


def evaluate(
    model_path: str,
    env_id: str,
    eval_episodes: int,
    device: torch.device,
    epsilon: float = 0.001,
    num_quantile_samples: int = 32,
    quantile_embedding_dim: int = 64,
    hidden_dim: int = 64,
    seed: int = 0,
    capture_video: bool = False,
    run_name: str = "eval",
) -> list[float]:
    """Plays `eval_episodes` episodes with an epsilon-greedy saved agent; returns their scores."""
    if capture_video:
        envs = gym.vector.SyncVectorEnv(
            [lambda: gym.wrappers.RecordVideo(gym.make(env_id, render_mode="rgb_array"), f"videos/{run_name}")]
        )
    else:
        envs = make_env(env_id, 1, seed)
    model = QuantileNetwork(
        int(np.prod(envs.single_observation_space.shape)), envs.single_action_space.n, quantile_embedding_dim, hidden_dim
    ).to(device)
    model.load_state_dict(torch.load(model_path, map_location=device, weights_only=True))
    model.eval()
    obs, _ = envs.reset(seed=seed) if capture_video else envs.reset()
    scores, score = [], 0.0
    while len(scores) < eval_episodes:
        if random.random() < epsilon:
            actions = np.array([envs.single_action_space.sample()])
        else:
            with torch.no_grad():
                q = model.q_values(torch.as_tensor(obs, device=device), num_quantile_samples)
            actions = q.argmax(dim=1).cpu().numpy()
        obs, rewards, terminated, truncated, _ = envs.step(actions)
        score += float(rewards[0])  # the reset step between episodes has reward 0
        if terminated[0] or truncated[0]:
            scores.append(score)
            score = 0.0
    envs.close()
    return scores


def main(args: Args) -> list[float]:
    validate_args(args)
    checkpoint = None
    if args.resume is not None:
        checkpoint = load_checkpoint(args.resume)
        args = resumed_args(args, checkpoint["args"])
    if checkpoint is None or checkpoint["replay"] is None:  # a stored replay is in memory already, as the buffer
        check_replay_memory(args)
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    if checkpoint is not None:
        run_name = checkpoint["run_name"]  # the same run directory and W&B run
    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=vars(args),
            name=run_name,
            save_code=True,
            id=checkpoint["wandb_id"] if checkpoint else None,
            resume="allow" if checkpoint else None,
        )
    wandb_id = wandb.run.id if args.track else None
    # On resume, TensorBoard drops the events the interrupted run logged after its checkpoint.
    writer = SummaryWriter(f"runs/{run_name}", purge_step=checkpoint["global_step"] if checkpoint else None)
    checkpoint_path = f"runs/{run_name}/checkpoint.pt"
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])),
    )

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)  # a network this small only pays synchronization for intra-op threads

    envs = make_env(args.env_id, args.num_envs, args.seed)
    num_actions = envs.single_action_space.n
    obs_shape = envs.single_observation_space.shape

    def make_network():
        return QuantileNetwork(int(np.prod(obs_shape)), num_actions, args.quantile_embedding_dim, args.hidden_dim)

    q_network = make_network().to(device)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, eps=args.adam_eps)
    target_network = make_network().to(device)
    target_network.load_state_dict(q_network.state_dict())
    rb = ReplayBuffer(
        args.buffer_size,
        args.num_envs,
        obs_shape,
        np.float32,
        STACK_NUM,
        device,
        np.random.default_rng(args.seed),
        args.n_step,
        args.gamma,
    )
    N, N_prime, K = args.num_tau_samples, args.num_tau_prime_samples, args.num_quantile_samples
    num_iterations = -(-args.total_timesteps // args.num_envs)
    # Every action sent to envs.step, reset steps included: a resume replays them to rebuild the environments.
    action_log = np.zeros((num_iterations, args.num_envs), dtype=np.min_scalar_type(num_actions - 1))

    obs, _ = envs.reset()  # envpool is seeded at construction
    obs_starts_game = np.ones(args.num_envs, dtype=bool)  # o_t is the first observation of a game
    obs_is_last = np.zeros(args.num_envs, dtype=bool)  # the step that returned o_t ended an episode
    obs_ends_game = np.zeros(args.num_envs, dtype=bool)  # ... and the game with it (no further life)
    episode_return = np.zeros(args.num_envs)
    episode_length = np.zeros(args.num_envs, dtype=np.int64)
    scores: list[float] = []
    global_step = iteration = num_updates = 0
    learn_after = args.learning_starts  # global_step after which updates run
    last_checkpoint = args.resume
    if checkpoint is not None:
        obs = replay_actions(envs, checkpoint["action_log"], checkpoint["obs"])
        action_log[: len(checkpoint["action_log"])] = checkpoint["action_log"]
        q_network.load_state_dict(checkpoint["q_network"])
        target_network.load_state_dict(checkpoint["target_network"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        global_step, iteration, num_updates = (checkpoint[k] for k in ("global_step", "iteration", "num_updates"))
        scores, episode_return, episode_length = (checkpoint[k] for k in ("scores", "episode_return", "episode_length"))
        obs_starts_game, obs_is_last, obs_ends_game = (
            checkpoint[k] for k in ("obs_starts_game", "obs_is_last", "obs_ends_game")
        )
        if checkpoint["replay"] is not None:
            rb.load_state_dict(checkpoint["replay"])
        else:  # an empty buffer: act until it holds learning_starts steps again
            rb.add_history(obs)
            learn_after = global_step + args.learning_starts
        set_rng_states(checkpoint["rng"], rb.rng)
        del checkpoint  # the replay arrays now belong to rb

    def checkpoint_state() -> dict:
        """Everything the loop needs to continue exactly from the current step."""
        return {
            "format_version": CHECKPOINT_VERSION,
            "script": os.path.basename(__file__),
            "args": vars(args),
            "run_name": run_name,
            "wandb_id": wandb_id,
            "global_step": global_step,
            "iteration": iteration,
            "num_updates": num_updates,
            "q_network": q_network.state_dict(),
            "target_network": target_network.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": rng_states(rb.rng),
            "scores": scores,
            "episode_return": episode_return,
            "episode_length": episode_length,
            "obs_starts_game": obs_starts_game,
            "obs_is_last": obs_is_last,
            "obs_ends_game": obs_ends_game,
            "obs": obs,
            "action_log": action_log[:iteration],
            "replay": rb.state_dict() if args.checkpoint_replay else None,
        }

    # Installed only now, so that a failed setup leaves the caller's handlers in place.
    stop = StopRequest()
    start_step, start_time = global_step, time.time()
    last_print = start_time
    while global_step < args.total_timesteps:
        global_step += args.num_envs
        epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_steps, global_step)
        if global_step <= args.learning_starts:
            actions = np.random.randint(num_actions, size=args.num_envs)
        else:
            with torch.no_grad():
                q = q_network.q_values(torch.as_tensor(obs, device=device), K)
            actions = q.argmax(dim=1).cpu().numpy()
            explore = np.random.rand(args.num_envs) < epsilon
            actions[explore] = np.random.randint(num_actions, size=explore.sum())
        action_log[iteration] = actions
        iteration += 1
        next_obs, rewards, terminated, truncated, infos = envs.step(actions)

        # NEXT_STEP autoreset: after a last step, envpool's next step is a reset step, never a transition.
        is_reset_step = obs_is_last
        rb.add(obs, obs_starts_game, actions, rewards, terminated, valid=~is_reset_step)

        # True game scores; time-limit truncations are logged too.
        live = ~is_reset_step
        episode_return += rewards * live
        episode_length += live
        game_over = terminated | truncated
        for i in np.flatnonzero(game_over):
            scores.append(float(episode_return[i]))
            writer.add_scalar("charts/episodic_return", episode_return[i], global_step)
            writer.add_scalar("charts/episodic_length", episode_length[i], global_step)
        episode_return[game_over] = 0.0
        episode_length[game_over] = 0
        obs_starts_game = obs_ends_game
        obs_is_last, obs_ends_game = terminated | truncated, game_over
        obs = next_obs

        if global_step > learn_after:
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - global_step / args.total_timesteps)
            for _ in range(crossed(global_step, args.num_envs, args.train_frequency)):
                data = rb.sample(args.batch_size)
                with torch.no_grad():
                    # One target pass: K levels pick the greedy next action, N' levels give its return quantiles.
                    next_z = target_network(data.next_obs, torch.rand(args.batch_size, K + N_prime, device=device))
                    next_actions = next_z[:, :K].mean(dim=1).argmax(dim=1)
                    next_quantiles = next_z[:, K:, :].gather(2, next_actions.view(-1, 1, 1).expand(-1, N_prime, 1))
                    target_quantiles = data.returns.unsqueeze(1) + data.discounts.unsqueeze(1) * next_quantiles.squeeze(2)
                taus = torch.rand(args.batch_size, N, device=device)
                z = q_network(data.obs, taus)
                quantiles = z.gather(2, data.actions.view(-1, 1, 1).expand(-1, N, 1)).squeeze(2)
                loss = quantile_huber_loss(quantiles, taus, target_quantiles, args.kappa).mean()
                optimizer.zero_grad()
                loss.backward()
                try:  # a NaN or inf in the loss or the Q-values reaches the gradient norm: never step on it
                    nn.utils.clip_grad_norm_(q_network.parameters(), float("inf"), error_if_nonfinite=True)
                except RuntimeError:
                    stop.restore()
                    envs.close()
                    writer.close()
                    raise SystemExit(
                        f"error: non-finite loss or Q-values at step {global_step}; "
                        f"last good checkpoint: {last_checkpoint or 'none written'}"
                    ) from None
                optimizer.step()
                num_updates += 1
                if num_updates % 100 == 0:
                    writer.add_scalar("losses/quantile_loss", loss.item(), global_step)
                    writer.add_scalar("losses/q_values", quantiles.mean().item(), global_step)
                    writer.add_scalar("charts/epsilon", epsilon, global_step)
                    writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                    sps = int((global_step - start_step) / (time.time() - start_time))
                    writer.add_scalar("charts/SPS", sps, global_step)
            if crossed(global_step, args.num_envs, args.target_network_frequency):
                target_network.load_state_dict(q_network.state_dict())

        if time.time() - last_print > 10:
            last_print = time.time()
            sps = int((global_step - start_step) / (last_print - start_time))
            mean = np.mean(scores[-100:]) if scores else float("nan")
            eta = time.strftime("%H:%M:%S", time.gmtime((args.total_timesteps - global_step) / max(sps, 1)))
            print(f"step {global_step:>9}/{args.total_timesteps} | SPS {sps:>6} | return(100) {mean:8.2f} | ETA {eta}")

        periodic = args.checkpoint_every > 0 and (
            crossed(global_step, args.num_envs, args.checkpoint_every) or global_step >= args.total_timesteps
        )
        if stop.requested or periodic:
            last_checkpoint = save_checkpoint(checkpoint_state(), checkpoint_path)
        if stop.requested:
            print(f"checkpoint saved to {checkpoint_path}; resume with: python {__file__} --resume {checkpoint_path}")
            break

    stop.restore()
    envs.close()
    if args.save_model and not stop.requested:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        torch.save(q_network.state_dict(), model_path)
        print(f"model saved to {model_path}")
        eval_scores = evaluate(
            model_path,
            args.env_id,
            args.eval_episodes,
            device,
            epsilon=args.eval_epsilon,
            num_quantile_samples=K,
            quantile_embedding_dim=args.quantile_embedding_dim,
            hidden_dim=args.hidden_dim,
            seed=args.seed + 1,
            capture_video=args.capture_video,
            run_name=run_name,
        )
        for idx, score in enumerate(eval_scores):
            writer.add_scalar("eval/episodic_return", score, idx)
    writer.close()
    if args.track:
        wandb.finish()
    return scores


if __name__ == "__main__":
    main(tyro.cli(Args))
