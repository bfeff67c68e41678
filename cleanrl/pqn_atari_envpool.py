"""Parallel Q-Network (PQN) for Atari games through envpool, with a 4-frame stack.

PQN is Q-learning without a replay buffer and without a target network: many vectorized environments
collect a short rollout with an epsilon-greedy policy, Q(lambda) targets are computed once from the
Q-values stored while acting, and a LayerNorm network trains on the rollout for a few epochs of minibatches.
Training uses life-loss episode ends and clipped rewards; the logged scores are the true game scores.

Paper: Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning" (arXiv:2407.04811).
Docs: docs/rl-algorithms/pqn.md
"""

import os
import random
import signal
import time
from collections import deque
from dataclasses import dataclass
from typing import Optional

import envpool
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
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
    """if toggled, use CUDA when it is available"""
    track: bool = False
    """if toggled, sync the run to Weights & Biases"""
    wandb_project_name: str = "cleanrl-q"
    """the Weights & Biases project"""
    wandb_entity: Optional[str] = None
    """the Weights & Biases entity (team)"""
    capture_video: bool = False
    """if toggled, record videos of the evaluation episodes to `videos/<run_name>/`"""
    save_model: bool = False
    """if toggled, save the model to `runs/<run_name>/` and evaluate it"""
    eval_episodes: int = 10
    """the number of episodes `evaluate` plays with a saved model"""

    env_id: str = "Breakout-v5"
    """the id of the envpool Atari environment"""
    total_timesteps: int = 10_000_000
    """total environment steps of the experiment, summed over all environments"""
    learning_rate: float = 2.5e-4
    """the learning rate of the RAdam optimizer"""
    anneal_lr: bool = True
    """if toggled, anneal the learning rate linearly to zero over training"""
    num_envs: int = 8
    """the number of parallel environments"""
    num_steps: int = 128
    """the number of steps each environment takes per rollout"""
    num_minibatches: int = 4
    """the number of minibatches each rollout is split into"""
    update_epochs: int = 4
    """the number of passes over each rollout"""
    gamma: float = 0.99
    """the discount factor"""
    q_lambda: float = 0.65
    """the lambda of the Q(lambda) targets"""
    start_e: float = 1.0
    """the starting epsilon of the epsilon-greedy policy"""
    end_e: float = 0.01
    """the final epsilon of the epsilon-greedy policy"""
    exploration_fraction: float = 0.1
    """the fraction of `total_timesteps` over which epsilon decays linearly from `start_e` to `end_e`"""
    max_grad_norm: float = 10.0
    """the global norm the gradients are clipped to"""
    eval_epsilon: float = 0.05
    """the epsilon of the epsilon-greedy policy in `evaluate`"""
    checkpoint_every: int = 0
    """write a resumable checkpoint every this many agent steps and at the end (0: only on SIGINT/SIGTERM)"""
    resume: Optional[str] = None
    """continue the run saved in this checkpoint, in the same run directory (and W&B run)"""


def available_memory_bytes() -> int:
    """RAM the kernel says can be allocated without swapping (MemAvailable), else the free pages."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def rollout_memory_bytes(args: Args, obs_shape: tuple, obs_dtype: np.dtype) -> int:
    """Bytes of the rollout storage `main` allocates: (num_steps, num_envs) observations, then per step an int64
    action, float32 reward, termination and max-Q, and a bool reset flag."""
    steps = args.num_steps * args.num_envs
    per_step = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize + 8 + 4 + 4 + 4 + 1
    return steps * per_step


def validate_args(args: Args) -> None:
    """Stops with one clear message on flags that cannot work, before anything is built."""
    if args.env_id not in envpool.list_all_envs():
        raise SystemExit(f"error: --env-id={args.env_id}: not an envpool environment (e.g. Breakout-v5, Pong-v5)")
    spec = envpool.make_spec(args.env_id)
    if len(spec.observation_space.shape) != 3:
        raise SystemExit(f"error: --env-id={args.env_id}: not an Atari game (image observations); use cleanrl/pqn.py")
    action_space = spec.action_space
    if not isinstance(action_space, gym.spaces.Discrete):
        raise SystemExit(
            f"error: --env-id={args.env_id}: has a {type(action_space).__name__} action space; PQN needs discrete actions"
        )
    for flag in ("num_envs", "num_steps", "num_minibatches", "update_epochs", "total_timesteps", "eval_episodes"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"error: --{flag.replace('_', '-')}={getattr(args, flag)}: must be at least 1")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        raise SystemExit(f"error: --num-minibatches={args.num_minibatches}: must divide num_envs * num_steps = {batch_size}")
    if args.total_timesteps < batch_size:
        raise SystemExit(
            f"error: --total-timesteps={args.total_timesteps}: must be at least num_envs * num_steps = {batch_size}"
        )
    if not 0.0 <= args.q_lambda <= 1.0:
        raise SystemExit(f"error: --q-lambda={args.q_lambda}: must lie in [0, 1]")
    if not 0.0 <= args.gamma <= 1.0:
        raise SystemExit(f"error: --gamma={args.gamma}: must lie in [0, 1]")
    if not 0.0 < args.exploration_fraction <= 1.0:
        raise SystemExit(f"error: --exploration-fraction={args.exploration_fraction}: must lie in (0, 1]")
    if args.checkpoint_every < 0:
        raise SystemExit(f"error: --checkpoint-every={args.checkpoint_every}: must be at least 0 (0: only on a signal)")
    if args.resume is not None and not os.path.isfile(args.resume):
        raise SystemExit(f"error: --resume={args.resume}: no such file")
    needed = rollout_memory_bytes(args, spec.observation_space.shape, spec.observation_space.dtype)
    available = available_memory_bytes()
    if needed > available:
        raise SystemExit(
            f"error: --num-envs={args.num_envs} --num-steps={args.num_steps}: the rollout storage needs about "
            f"{needed / 1e9:,.1f} GB but {available / 1e9:,.1f} GB are available; lower --num-envs or --num-steps"
        )


def make_env(env_id: str, num_envs: int, seed: int, episodic_life: bool = True, reward_clip: bool = True):
    """envpool Atari: 84x84 gray, 4 stacked frames, frame skip 4, 1-30 no-ops, no sticky actions, 108k-frame cap."""
    return envpool.make(
        env_id,
        env_type="gymnasium",
        num_envs=num_envs,
        seed=seed,
        episodic_life=episodic_life,
        reward_clip=reward_clip,
        stack_num=4,
        max_episode_steps=27_000,
        noop_max=30,
        repeat_action_probability=0.0,
    )


def make_video_env(env_id: str, run_name: str):
    """A rendering ale-py environment with the same preprocessing, for `--capture-video` (envpool does not render)."""
    try:
        import ale_py
    except ImportError as error:
        raise SystemExit("error: --capture-video needs ale-py and moviepy: pip install -e '.[video]'") from error
    gym.register_envs(ale_py)
    env = gym.make(f"ALE/{env_id}", frameskip=1, repeat_action_probability=0.0, render_mode="rgb_array")
    env = gym.wrappers.RecordVideo(env, f"videos/{run_name}")
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False)
    return gym.wrappers.FrameStackObservation(env, 4)


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class QNetwork(nn.Module):
    """Nature CNN with LayerNorm before every hidden ReLU: it is what keeps TD learning stable without a target network."""

    def __init__(self, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.LayerNorm([32, 20, 20]),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.LayerNorm([64, 9, 9]),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.LayerNorm([64, 7, 7]),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(3136, 512)),
            nn.LayerNorm(512),
            nn.ReLU(),
            layer_init(nn.Linear(512, num_actions)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: uint8 frames (B, 4, 84, 84)."""
        return self.network(x.float() / 255.0)


def linear_schedule(start: float, end: float, duration: float, t: np.ndarray) -> np.ndarray:
    """Linear decay from `start` to `end` over `duration` steps, constant afterwards; `t` may be an array."""
    return np.maximum(start + (end - start) * np.asarray(t, dtype=np.float64) / duration, min(start, end))


def q_lambda_returns(
    rewards: torch.Tensor, next_dones: torch.Tensor, next_max_q: torch.Tensor, gamma: float, q_lambda: float
) -> torch.Tensor:
    """Peng's Q(lambda) targets of one rollout, all tensors of shape (num_steps, num_envs).

    `next_dones[t]` is 1 where the episode ended after step t (no bootstrap), `next_max_q[t] = max_a Q(s_{t+1}, a)`.
    G_{T-1} = r + gamma (1 - d) next_max_q, and
    G_t = r_t + gamma (1 - d_t) (lambda G_{t+1} + (1 - lambda) next_max_q[t]).
    """
    returns = torch.empty_like(rewards)
    not_done = 1.0 - next_dones
    returns[-1] = rewards[-1] + gamma * not_done[-1] * next_max_q[-1]
    for t in range(rewards.shape[0] - 2, -1, -1):
        bootstrap = q_lambda * returns[t + 1] + (1.0 - q_lambda) * next_max_q[t]
        returns[t] = rewards[t] + gamma * not_done[t] * bootstrap
    return returns


def fold_reset_steps(
    rewards: torch.Tensor, terminations: torch.Tensor, max_q: torch.Tensor, is_reset_step: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards and episode ends for `q_lambda_returns` with envpool's reset steps made harmless.

    Under NEXT_STEP autoreset the step after an episode end ignores its action and only resets the
    environment; its observation is the last one of the finished episode. Giving that step the reward
    max_q (the value of that last observation) and an episode end makes its return exactly max_q, so a
    time-out's lambda-return bootstraps from the final observation and never reads into the next episode,
    while a real termination still cuts the bootstrap itself. The reset steps are masked out of the loss.
    """
    rewards = torch.where(is_reset_step, max_q, rewards)
    next_dones = torch.where(is_reset_step, torch.ones_like(terminations), terminations)
    return rewards, next_dones


class EpisodeStats:
    """True game scores of vectorized envs: raw rewards summed over all lives, time-outs included."""

    def __init__(self, num_envs: int, window: int = 100):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.recent = deque(maxlen=window)

    def update(self, reward: np.ndarray, is_reset_step: np.ndarray, episode_over: np.ndarray) -> list[tuple[float, int]]:
        """Adds one vectorized step; returns (score, length) of every episode that ended with it."""
        self.returns += reward
        self.lengths += ~is_reset_step
        finished = [(float(self.returns[i]), int(self.lengths[i])) for i in np.flatnonzero(episode_over)]
        self.returns[episode_over] = 0.0
        self.lengths[episode_over] = 0
        self.recent.extend(score for score, _ in finished)
        return finished


def evaluate(
    model_path: str,
    env_id: str,
    eval_episodes: int,
    device: torch.device,
    epsilon: float = 0.05,
    capture_video: bool = False,
    run_name: str = "eval",
    seed: int = 1,
) -> list[float]:
    """Plays `eval_episodes` full games (all lives) with a saved model and returns their scores."""
    if capture_video:
        envs = gym.vector.SyncVectorEnv([lambda: make_video_env(env_id, run_name)])
        obs, _ = envs.reset(seed=seed)
    else:  # one environment per game, so that short games are not over-represented
        envs = make_env(env_id, eval_episodes, seed, episodic_life=False, reward_clip=False)
        obs, _ = envs.reset()
    num_envs, num_actions = envs.num_envs, envs.single_action_space.n
    quota = np.full(num_envs, eval_episodes // num_envs)
    model = QNetwork(num_actions).to(device)
    model.load_state_dict(torch.load(model_path, map_location=device, weights_only=True))
    model.eval()
    scores, game_returns = [], np.zeros(num_envs)
    while quota.sum() > 0:
        with torch.no_grad():
            greedy = model(torch.as_tensor(obs, device=device)).argmax(1).cpu().numpy()
        explore = np.random.rand(num_envs) < epsilon
        actions = np.where(explore, np.random.randint(num_actions, size=num_envs), greedy)
        obs, reward, terminated, truncated, _ = envs.step(actions)
        game_returns += reward  # unclipped: reward clipping is off here
        for i in np.flatnonzero(terminated | truncated):
            if quota[i] > 0:
                scores.append(float(game_returns[i]))
                quota[i] -= 1
            game_returns[i] = 0.0
    envs.close()
    return scores


CHECKPOINT_FORMAT = 1
CHECKPOINT_KEYS = (
    "format",
    "args",
    "run_name",
    "wandb_id",
    "global_step",
    "iteration",
    "network",
    "optimizer",
    "rng",
    "all_scores",
    "episode_returns",
    "episode_lengths",
    "recent_returns",
    "next_obs",
    "next_is_reset_step",
    "action_log",
)
# Flags a resumed run takes from the command line; every other flag comes from the checkpoint.
RESUME_FLAGS = ("resume", "checkpoint_every", "cuda", "track")


class StopRequest:
    """SIGINT/SIGTERM while training: the first asks the loop to stop (and checkpoint) after the current iteration,
    a second exits at once. `restore` puts the previous handlers back, since tests call `main` in-process."""

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


def rng_states() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(state: dict, path: str) -> None:
    """Writes to a temporary file first, so that a crash while writing leaves the previous checkpoint intact."""
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def load_checkpoint(path: str) -> dict:
    """The checkpoint at `path`, or one clear message if it is truncated, corrupted or of another format."""
    try:
        # Not weights_only: the checkpoint holds numpy RNG states and arrays.
        state = torch.load(path, map_location="cpu", weights_only=False)
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"expected a dict of format {CHECKPOINT_FORMAT}")
        missing = [key for key in CHECKPOINT_KEYS if key not in state]
        if missing:
            raise KeyError(f"missing {', '.join(missing)}")
    except Exception as error:
        raise SystemExit(f"error: --resume={path}: not a readable checkpoint ({type(error).__name__}: {error})")
    return state


def resumed_args(saved: dict, given: Args) -> Args:
    """The checkpoint's flags, except those in RESUME_FLAGS; says which other given flags are ignored."""
    args = Args(**saved)
    defaults = Args()
    for name, value in vars(given).items():
        if name in RESUME_FLAGS:
            setattr(args, name, value)
        elif value != saved.get(name) and value != getattr(defaults, name):
            print(f"--resume: ignoring --{name.replace('_', '-')}={value}; the checkpoint's value is {saved.get(name)}")
    return args


def replay_actions(envs, obs: np.ndarray, action_log: np.ndarray, expected_obs: np.ndarray, action_dtype: type) -> np.ndarray:
    """Brings freshly seeded envs, just reset to `obs`, back to the checkpoint's state: envpool cannot save its
    state, but it is deterministic given the seed and the actions. Returns the observation after the last step."""
    print(f"resume: replaying {len(action_log)} logged environment steps")
    for actions in action_log:
        obs = envs.step(actions.astype(action_dtype))[0]
    if not np.array_equal(obs, expected_obs):
        raise SystemExit("error: environment replay diverged from the checkpoint (different envpool version or env id?)")
    return obs


def main(args: Args) -> list[float]:
    validate_args(args)
    checkpoint = load_checkpoint(args.resume) if args.resume else None
    if checkpoint is not None:
        args = resumed_args(checkpoint["args"], args)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    run_name = checkpoint["run_name"] if checkpoint else f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    checkpoint_path = f"runs/{run_name}/checkpoint.pt"
    wandb_id = checkpoint["wandb_id"] if checkpoint else None
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
    # Every scalar of the iteration a checkpoint ends is logged at or before its step; later ones are dropped.
    writer = SummaryWriter(f"runs/{run_name}", purge_step=checkpoint["global_step"] + 1 if checkpoint else None)
    if checkpoint is None:
        writer.add_text(
            "hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
        )

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    def to_device(array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(array, device=device)

    envs = make_env(args.env_id, args.num_envs, args.seed)
    obs_shape, num_actions = envs.single_observation_space.shape, envs.single_action_space.n
    q_network = QNetwork(num_actions).to(device)
    optimizer = optim.RAdam(q_network.parameters(), lr=args.learning_rate, foreach=True)

    # Rollout storage lives in numpy (cheap per-step writes) and moves to the device once per rollout.
    obs = np.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=np.uint8)
    actions = np.zeros((args.num_steps, args.num_envs), dtype=np.int64)
    rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    terminations = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    is_reset_step = np.zeros((args.num_steps, args.num_envs), dtype=bool)
    max_q = torch.zeros((args.num_steps, args.num_envs), device=device)
    # Every action sent to the envs, so that a resumed run can rebuild them by replaying it.
    action_log = np.zeros((num_iterations * args.num_steps, args.num_envs), dtype=np.min_scalar_type(num_actions - 1))

    stats = EpisodeStats(args.num_envs)
    all_scores: list[float] = []
    global_step, start_iteration, last_checkpoint = 0, 0, None
    next_obs = envs.reset()[0]
    next_is_reset_step = np.zeros(args.num_envs, dtype=bool)
    if checkpoint is not None:
        global_step, start_iteration, last_checkpoint = checkpoint["global_step"], checkpoint["iteration"], args.resume
        q_network.load_state_dict(checkpoint["network"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        all_scores = list(checkpoint["all_scores"])
        stats.returns[:], stats.lengths[:] = checkpoint["episode_returns"], checkpoint["episode_lengths"]
        stats.recent.extend(checkpoint["recent_returns"])
        next_is_reset_step = checkpoint["next_is_reset_step"].copy()
        action_log[: len(checkpoint["action_log"])] = checkpoint["action_log"]
        next_obs = replay_actions(envs, next_obs, checkpoint["action_log"], checkpoint["next_obs"], actions.dtype)
        set_rng_states(checkpoint["rng"])  # last: building the network and envs above drew from the generators
    epsilon_duration = args.exploration_fraction * args.total_timesteps
    start_step, start_time, last_print = global_step, time.time(), time.time()

    def write_checkpoint(iterations_done: int) -> str:
        state = {
            "format": CHECKPOINT_FORMAT,
            "args": vars(args),
            "run_name": run_name,
            "wandb_id": wandb_id,
            "global_step": global_step,
            "iteration": iterations_done,
            "network": q_network.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": rng_states(),
            "all_scores": all_scores,
            "episode_returns": stats.returns,
            "episode_lengths": stats.lengths,
            "recent_returns": list(stats.recent),
            "next_obs": next_obs,
            "next_is_reset_step": next_is_reset_step,
            "action_log": action_log[: iterations_done * args.num_steps],
        }
        save_checkpoint(state, checkpoint_path)
        return checkpoint_path

    stop = StopRequest()
    for iteration in range(start_iteration, num_iterations):
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - iteration / num_iterations) * args.learning_rate
        # Exploration draws for the whole rollout at once: one epsilon per step, decayed by global step.
        step_epsilons = linear_schedule(
            args.start_e, args.end_e, epsilon_duration, global_step + args.num_envs * np.arange(1, args.num_steps + 1)
        )
        explore = np.random.rand(args.num_steps, args.num_envs) < step_epsilons[:, None]
        random_actions = np.random.randint(0, num_actions, (args.num_steps, args.num_envs))

        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            is_reset_step[step] = next_is_reset_step
            with torch.no_grad():
                step_max_q, greedy = q_network(torch.as_tensor(next_obs, device=device)).max(dim=1)
            max_q[step] = step_max_q
            actions[step] = np.where(explore[step], random_actions[step], greedy.cpu().numpy())
            action_log[iteration * args.num_steps + step] = actions[step]

            next_obs, reward, terminated, truncated, info = envs.step(actions[step])
            rewards[step] = reward  # clipped; `terminated` includes life losses
            terminations[step] = terminated
            game_over = info["terminated"].astype(bool) | truncated
            for score, length in stats.update(info["reward"], next_is_reset_step, game_over):
                all_scores.append(score)
                writer.add_scalar("charts/episodic_return", score, global_step)
                writer.add_scalar("charts/episodic_length", length, global_step)
            next_is_reset_step = terminated | truncated

        with torch.no_grad():
            last_max_q = q_network(to_device(next_obs)).max(dim=1).values
            next_max_q = torch.cat([max_q[1:], last_max_q[None]])
            fold_rewards, fold_dones = fold_reset_steps(
                to_device(rewards), to_device(terminations), max_q, to_device(is_reset_step)
            )
            returns = q_lambda_returns(fold_rewards, fold_dones, next_max_q, args.gamma, args.q_lambda)

        b_obs = to_device(obs).reshape((-1,) + obs_shape)
        b_actions = to_device(actions).reshape(-1)
        b_returns = returns.reshape(-1)
        b_valid = to_device(~is_reset_step).reshape(-1).float()
        try:
            for epoch in range(args.update_epochs):
                b_inds = torch.randperm(batch_size, device=device)
                for start in range(0, batch_size, minibatch_size):
                    mb = b_inds[start : start + minibatch_size]
                    q_taken = q_network(b_obs[mb]).gather(1, b_actions[mb, None]).squeeze(1)
                    # Mean squared TD error over real transitions only: reset steps carry no learning signal.
                    loss = ((q_taken - b_returns[mb]) ** 2 * b_valid[mb]).sum() / b_valid[mb].sum().clamp(min=1.0)
                    optimizer.zero_grad()
                    loss.backward()
                    # Raises before the step on a NaN/inf loss or Q-value: they all reach the gradient norm.
                    nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm, error_if_nonfinite=True, foreach=True)
                    optimizer.step()
        except RuntimeError as error:
            if "non-finite" not in str(error):
                raise
            stop.restore()
            raise SystemExit(
                f"error: non-finite loss or Q-values at step {global_step}; "
                f"last good checkpoint: {last_checkpoint or 'none written'}"
            ) from None

        if iteration % 10 == 0 or iteration == num_iterations - 1:
            sps = int((global_step - start_step) / (time.time() - start_time))
            writer.add_scalar("losses/td_loss", loss.item(), global_step)
            writer.add_scalar("losses/q_values", q_taken.mean().item(), global_step)
            writer.add_scalar("charts/epsilon", float(step_epsilons[-1]), global_step)
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            if time.time() - last_print > 10 or iteration == num_iterations - 1:
                last_print = time.time()
                recent = np.mean(stats.recent) if stats.recent else float("nan")
                eta = (args.total_timesteps - global_step) / max(sps, 1)
                print(
                    f"step {global_step:>9}/{args.total_timesteps} | SPS {sps:>6} | return(100) {recent:8.2f} "
                    f"| ETA {eta:5.0f}s"
                )

        # Checkpoints fall on iteration boundaries, where the rollout storage holds nothing that is still needed.
        every = args.checkpoint_every
        crossed = every > 0 and global_step // every > (global_step - batch_size) // every
        if crossed or stop.requested or (every > 0 and iteration == num_iterations - 1):
            last_checkpoint = write_checkpoint(iteration + 1)
        if stop.requested:
            script = f"cleanrl/{os.path.basename(__file__)}"
            print(f"checkpoint written to {last_checkpoint}; resume with: python {script} --resume {last_checkpoint}")
            break

    if args.save_model and not stop.requested:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        torch.save(q_network.state_dict(), model_path)
        print(f"model saved to {model_path}")
        scores = evaluate(
            model_path, args.env_id, args.eval_episodes, device, args.eval_epsilon, args.capture_video, run_name, args.seed
        )
        for idx, score in enumerate(scores):
            writer.add_scalar("eval/episodic_return", score, idx)

    envs.close()
    writer.close()
    if args.track:
        wandb.finish()
    stop.restore()
    return all_scores


if __name__ == "__main__":
    main(tyro.cli(Args))
