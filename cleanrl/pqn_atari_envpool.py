"""Parallel Q-Network (PQN) for Atari games through envpool, with a 4-frame stack.

PQN is Q-learning without a replay buffer and without a target network: many vectorized environments
collect a short rollout with an epsilon-greedy policy, Q(lambda) targets are computed once from the
Q-values stored while acting, and a LayerNorm network trains on the rollout for a few epochs of minibatches.
Training uses life-loss episode ends and clipped rewards; the logged scores are the true game scores.

Paper: Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning" (arXiv:2407.04811).
Docs: docs/rl-algorithms/pqn.md
"""

import cleanrl_q_utils.quiet_start  # noqa: F401  (first: a signal while torch loads exits quietly)

import functools
import os
from dataclasses import dataclass, replace
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

from cleanrl_q_utils import (
    classic_control,
    command_line,
    environments,
    episode_scores,
    flag_checks,
    flag_errors,
    model_files,
    training_run,
)

envpool = classic_control.import_envpool()  # None off Linux (Linux wheels only), where validate_args stops in one line

# The layout of checkpoint.pt, which a resume checks; 2: the state `main` lists in `checkpoint_state`
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

    env_id: str = "Breakout-v5"
    """the id of the environment"""
    total_timesteps: int = 9_999_360
    """the total number of agent steps of the experiment, summed over all environments"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
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
    """the discount factor gamma"""
    q_lambda: float = 0.65
    """the lambda of the Q(lambda) targets"""
    start_e: float = 1.0
    """the starting epsilon of the epsilon-greedy exploration"""
    end_e: float = 0.01
    """the final epsilon of the epsilon-greedy exploration"""
    exploration_fraction: float = 0.1
    """the fraction of `total_timesteps` over which the epsilon schedule goes linearly from `start_e` to `end_e` (0: `end_e`
    from the first step)"""
    max_grad_norm: float = 10.0
    """the global norm the gradients are clipped to"""
    td_loss_coef: float = 1.0
    """the factor of the mean squared TD error in the optimized loss (purejaxql: 0.5; `losses/td_loss` logs the error)"""
    conv_layer_norm: str = "feature_map"
    """what a LayerNorm after a convolution normalizes: 'feature_map' (CleanRL: all of C x H x W at once) or 'channels'
    (purejaxql: the C channels at each pixel)"""
    config: str = "cleanrl"
    """a set of defaults: 'cleanrl' (the flags' own) or 'purejaxql' (the authors' Atari settings, PURE_JAXQL_ATARI);
    flags given on the command line override it"""
    eval_epsilon: float = 0.0  # greedy, as purejaxql's test environments
    """the epsilon of the evaluation episodes"""
    checkpoint_every: int = 0
    """write a resumable checkpoint every this many agent steps and at the end (0: only when a signal stops the run)"""
    resume: Optional[str] = None
    """continue the run saved in this checkpoint, in the same run directory (and W&B run)"""
    resume_fresh_envs: bool = False
    """with --resume: start new games instead of replaying every logged action (cost independent of the run's length;
    the games in progress are dropped, so the run is not bit-identical)"""


# The authors' Atari configuration (purejaxql, config/alg/pqn_atari.yaml; docs/rl-algorithms/pqn.md, "Deviations"):
# 5e7 agent steps rounded down to whole rollouts as purejaxql does, 128 envs x 32 steps, 2 epochs of 32 minibatches
# (of 128 transitions), a constant learning rate, epsilon 1 -> 0.001 over the first 10%, the 0.5 in its loss and its
# LayerNorm over the channels at each pixel. Every value is listed, those equal to a default too, so the set is whole.
PURE_JAXQL_ATARI = dict(
    total_timesteps=49_999_872,
    num_envs=128,
    num_steps=32,
    update_epochs=2,
    num_minibatches=32,
    learning_rate=2.5e-4,
    anneal_lr=False,
    gamma=0.99,
    q_lambda=0.65,
    start_e=1.0,
    end_e=0.001,
    exploration_fraction=0.1,
    max_grad_norm=10.0,
    td_loss_coef=0.5,
    conv_layer_norm="channels",
    eval_epsilon=0.0,
)
CONFIGS = {"cleanrl": {}, "purejaxql": PURE_JAXQL_ATARI}


def apply_config(args: Args) -> Args:
    """`args` with the values of its `--config` in every flag that the command line did not give: given flags
    override the set. (For `main` called from Python, a flag counts as given where its value differs from the default.)"""
    if args.config not in CONFIGS:
        flag_errors.flag_error("config", args.config, f"one of {', '.join(CONFIGS)}")
    given = command_line.flags_given(args)
    return replace(args, **{name: value for name, value in CONFIGS[args.config].items() if name not in given})


def config_line(args: Args) -> Optional[str]:
    """The start-up block's line on `--config`: the values its set gave, and the flags given instead (None for the
    flags' own defaults)."""
    if not CONFIGS.get(args.config):
        return None
    values = [
        f"{name} {getattr(args, name)}" + ("" if getattr(args, name) == value else f" (given; the config's is {value})")
        for name, value in CONFIGS[args.config].items()
    ]
    return f"  config {args.config}: " + ", ".join(values)


def rollout_memory_bytes(args: Args, obs_shape: tuple, obs_dtype: np.dtype) -> int:
    """Bytes of the rollout storage `main` allocates: (num_steps, num_envs) observations, then per step an int64
    action, float32 reward, termination and max-Q, and a bool reset flag."""
    per_step = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize + 8 + 4 + 4 + 4 + 1
    return args.num_steps * args.num_envs * per_step


def network_sizes(num_actions: int) -> tuple[int, int]:
    """(parameters, floats of every layer output for one observation) of QNetwork, counted from its layers."""
    channels = 4
    convs = [(channels, 32, 8, 20), (32, 64, 4, 9), (64, 64, 3, 7)]  # (in, out, kernel, output side)
    parameters = sum(flag_checks.conv_parameters(i, o, k) + 2 * o * side * side for i, o, k, side in convs)
    parameters += flag_checks.linear_parameters(3136, 512) + 2 * 512
    floats = 2 * channels * 84 * 84 + sum(3 * o * side * side for _, o, _, side in convs) + 3 * 512
    return parameters + flag_checks.linear_parameters(512, num_actions), floats + num_actions


def memory_needs(args: Args, obs_shape: tuple, obs_dtype, num_actions: int) -> list:
    """What a run allocates in proportion to its flags, for `flag_checks.check_run_memory`: the rollout, the network
    with its gradients and two RAdam moments (no target network), a minibatch's activations, the environments."""
    parameters, floats = network_sizes(num_actions)
    needs = flag_checks.common_needs(args, parameters, 4, ("env_id",), args.eval_episodes, floats)
    if args.eval_only:
        return needs
    rollout = ("the rollout storage", rollout_memory_bytes(args, obs_shape, obs_dtype), ("num_envs", "num_steps"))
    update = flag_checks.activation_memory_bytes(args.num_envs * args.num_steps // args.num_minibatches, floats)
    return needs + [rollout, ("an update's activations", update, ("num_envs", "num_steps", "num_minibatches"))]


def validate_args(args: Args) -> list:
    """Stops with one clear message on flags that cannot work, before anything is built."""
    flag_checks.check_common_flags(args)
    spec = flag_checks.check_env_id(args.env_id, atari=True)
    needs = memory_needs(args, spec.observation_space.shape, spec.observation_space.dtype, spec.action_space.n)
    memory = flag_checks.check_run_memory(args, needs)
    batch_size = args.num_envs * args.num_steps
    batch = f"num_envs * num_steps = {batch_size}"
    flag_errors.check_flags(
        [
            ("num_minibatches", args.num_minibatches, batch_size % args.num_minibatches == 0, f"must divide {batch}"),
            ("total_timesteps", args.total_timesteps, args.total_timesteps >= batch_size, f"must be at least {batch}"),
            ("td_loss_coef", args.td_loss_coef, 0 < args.td_loss_coef < float("inf"), "must be a number > 0"),
            ("conv_layer_norm", args.conv_layer_norm, args.conv_layer_norm in LAYER_NORMS, "feature_map or channels"),
        ]
    )
    return memory


def make_env(env_id: str, num_envs: int, seed: int):
    """envpool Atari: 84x84 gray, 4 stacked frames, frame skip 4, 1-30 no-ops, no sticky actions, 108k-frame cap; a lost
    life ends an episode (envpool then plays no-ops and FIRE) and rewards are clipped, in training and evaluation."""
    protocol = dict(stack_num=4, max_episode_steps=27_000, noop_max=30, repeat_action_probability=0.0)
    return envpool.make(
        env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, episodic_life=True, reward_clip=True, **protocol
    )


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm of (B, C, H, W) maps over the C channels at each pixel, with C affine parameters: what flax's
    LayerNorm does on purejaxql's channels-last maps."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


# --conv-layer-norm: the LayerNorm after a convolution with C output maps of H x H pixels
LAYER_NORMS = {
    "feature_map": lambda channels, size: nn.LayerNorm([channels, size, size]),
    "channels": lambda channels, size: ChannelLayerNorm(channels),
}


class QNetwork(nn.Module):
    """Nature CNN with LayerNorm before every hidden ReLU: it is what keeps TD learning stable without a target network."""

    def __init__(self, num_actions: int, conv_layer_norm: str = "feature_map"):
        super().__init__()
        norm = LAYER_NORMS[conv_layer_norm]
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            norm(32, 20),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            norm(64, 9),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            norm(64, 7),
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


def linear_schedule(start: float, end: float, duration: float, t):
    """Linear from `start` at agent step 0 to `end` at step `duration`, then `end`; a `duration` of 0 is `end` from the
    first step. `t` is a step or an array of steps; the result (float64) has its shape."""
    t = np.asarray(t, dtype=np.float64)
    value = start + (end - start) * t / duration if duration > 0 else np.full_like(t, end)
    return np.clip(value, min(start, end), max(start, end))


def q_lambda_returns(
    rewards: torch.Tensor, next_dones: torch.Tensor, next_max_q: torch.Tensor, gamma: float, q_lambda: float
) -> torch.Tensor:
    """Peng's Q(lambda) targets of one rollout, all tensors of shape (num_steps, num_envs): `next_dones[t]` is 1 where
    the episode ended after step t (no bootstrap), `next_max_q[t] = max_a Q(s_{t+1}, a)`; backwards from
    G_{T-1} = r_{T-1} + gamma (1 - d_{T-1}) next_max_q[T-1],
    G_t = r_t + gamma (1 - d_t) (lambda G_{t+1} + (1 - lambda) next_max_q[t])."""
    returns = torch.empty_like(rewards)
    returns[-1] = rewards[-1] + gamma * (1.0 - next_dones[-1]) * next_max_q[-1]
    for t in range(rewards.shape[0] - 2, -1, -1):
        bootstrap = q_lambda * returns[t + 1] + (1.0 - q_lambda) * next_max_q[t]
        returns[t] = rewards[t] + gamma * (1.0 - next_dones[t]) * bootstrap
    return returns


def fold_reset_steps(
    rewards: torch.Tensor, terminations: torch.Tensor, max_q: torch.Tensor, is_reset_step: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards and episode ends for `q_lambda_returns` with envpool's reset steps made harmless, all (num_steps, num_envs).
    Under NEXT_STEP autoreset the step after an episode end only resets; its observation is the finished episode's last.
    Given the reward max_q (that observation's value) and an episode end, its return is exactly max_q: a time-out's
    lambda-return bootstraps from the final observation, never from the next episode; a termination still cuts it."""
    rewards = torch.where(is_reset_step, max_q, rewards)
    next_dones = torch.where(is_reset_step, torch.ones_like(terminations), terminations)
    return rewards, next_dones


def train_on_rollout(
    q_network: QNetwork,
    optimizer: optim.Optimizer,
    batch: tuple,
    update_epochs: int,
    num_minibatches: int,
    max_grad_norm: float,
    td_loss_coef: float,
) -> tuple:
    """`update_epochs` passes of `num_minibatches` minibatches over the flattened rollout `batch` = (obs, actions,
    returns, valid), each of length num_envs * num_steps. Returns the loss and Q(s, a) of the last minibatch, and
    whether every gradient norm was finite (a tensor on the device: reading it would wait for the updates)."""
    b_obs, b_actions, b_returns, b_valid = batch
    minibatch_size = len(b_actions) // num_minibatches
    grads_finite = torch.ones((), dtype=torch.bool, device=b_actions.device)
    for epoch in range(update_epochs):
        for mb in torch.randperm(len(b_actions), device=b_actions.device).split(minibatch_size):
            q_taken = q_network(b_obs[mb]).gather(1, b_actions[mb, None]).squeeze(1)
            # Mean squared TD error over real transitions only: reset steps carry no learning signal.
            loss = ((q_taken - b_returns[mb]) ** 2 * b_valid[mb]).sum() / b_valid[mb].sum().clamp(min=1.0)
            optimizer.zero_grad()
            (td_loss_coef * loss).backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(q_network.parameters(), max_grad_norm, foreach=True)
            grads_finite &= torch.isfinite(grad_norm)
            optimizer.step()
    return loss, q_taken, grads_finite


def evaluate(weights: dict, args: Args, device: torch.device, video_folder: str) -> list[float]:
    """Plays `args.eval_episodes` whole games with a saved model on the training environment (seeded with
    `args.seed + EVAL_SEED_OFFSET`), as purejaxql's test environments: a lost life ends an episode and envpool serves
    the next with FIRE. Returns the true scores (raw rewards over all lives). --capture-video plays them on ale-py,
    which also presses FIRE after a life."""
    if args.eval_episodes == 0:  # none to play (and envpool builds no zero envs)
        return []
    if args.capture_video:
        envs = gym.vector.SyncVectorEnv(
            [lambda: environments.make_video_env(args.env_id, video_folder, max_episode_steps=27_000)]
        )
        obs, _ = envs.reset(seed=args.seed + EVAL_SEED_OFFSET)
    else:  # one environment per game, so that short games are not over-represented
        envs = make_env(args.env_id, args.eval_episodes, args.seed + EVAL_SEED_OFFSET)
        obs, _ = envs.reset()
    num_envs, num_actions = envs.num_envs, envs.single_action_space.n
    quota = np.full(num_envs, args.eval_episodes // num_envs)
    model = QNetwork(num_actions, args.conv_layer_norm).to(device)
    model_files.put_weights(model, weights, args.model_path)
    model.eval()
    stats, is_reset_step = episode_scores.EpisodeStats(num_envs), np.zeros(num_envs, dtype=bool)
    while quota.sum() > 0:
        with torch.no_grad():
            greedy = model(torch.as_tensor(obs, device=device)).argmax(1).cpu().numpy()
        explore = np.random.rand(num_envs) < args.eval_epsilon
        actions = np.where(explore, np.random.randint(num_actions, size=num_envs), greedy)
        obs, reward, terminated, truncated, info = envs.step(actions)
        game_over = terminated | truncated  # ale-py: a lost life ends no episode
        if not args.capture_video:  # envpool: the game's end and the raw rewards are in info
            reward, game_over = info["reward"], info["terminated"].astype(bool) | truncated
        counted = game_over & (quota > 0)  # each env counts its first `quota` games
        stats.update(reward, is_reset_step, counted)
        quota -= counted
        is_reset_step = terminated | truncated  # the next step only resets (NEXT_STEP autoreset)
    envs.close()
    return stats.scores


def main(args: Args) -> list[float]:
    if args.resume is None:  # a resumed run takes every flag from its checkpoint, where the config's values are
        args = apply_config(args)
    if args.eval_only:  # rebuild a saved agent from its model file and evaluate it, no training
        args, weights = model_files.read_for_evaluation(args, __file__)
        validate_args(args)
        device, video_folder = model_files.start_evaluation(args, __file__)
        return model_files.report_evaluation(args, evaluate(weights, args, device, video_folder), video_folder)
    args, checkpoint = command_line.resume(args, __file__, CHECKPOINT_FORMAT)
    memory = validate_args(args)  # the memory the run will take, said in the start-up block
    args = flag_checks.whole_iterations(args)
    batch_size = args.num_envs * args.num_steps
    num_iterations = args.total_timesteps // batch_size
    epsilon_duration = args.exploration_fraction * args.total_timesteps
    rollout_steps = args.num_envs * np.arange(1, args.num_steps + 1)  # agent steps into a rollout after each of its steps
    with training_run.Run(args, checkpoint, __file__, CHECKPOINT_FORMAT, memory=memory) as run:
        if config_line(args):  # the last line of the start-up block
            print(config_line(args))
        device = run.device
        to_device = functools.partial(torch.as_tensor, device=device)  # numpy arrays to the run's device
        envs = make_env(args.env_id, args.num_envs, run.env_seed)
        obs_shape, num_actions = envs.single_observation_space.shape, envs.single_action_space.n
        q_network = QNetwork(num_actions, args.conv_layer_norm).to(device)
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
        stats = episode_scores.EpisodeStats(args.num_envs)
        next_obs = envs.reset()[0]
        next_is_reset_step = np.zeros(args.num_envs, dtype=bool)

        def checkpoint_state(iterations_done: int) -> dict:
            """All a resume needs, as plain values. Taken between iterations, when the rollout storage is spent: no
            replay, no target network."""
            learner = dict(q_network=q_network.state_dict(), optimizer=optimizer.state_dict())
            actors = dict(next_obs=next_obs.copy(), next_is_reset_step=next_is_reset_step.copy())
            log = action_log[: iterations_done * args.num_steps].copy()
            return learner | actors | dict(iteration=iterations_done, stats=stats.state_dict(), action_log=log)

        start_iteration = 0
        if checkpoint is not None:
            with run.restoring() as saved:
                q_network.load_state_dict(saved["q_network"])
                optimizer.load_state_dict(saved["optimizer"])
                next_obs, next_is_reset_step = saved["next_obs"], saved["next_is_reset_step"]
                stats.load_state_dict(saved["stats"])
                start_iteration = saved["iteration"]
                action_log[: len(saved["action_log"])] = saved["action_log"]
            envs, next_obs = run.fast_forward(envs, action_log[: start_iteration * args.num_steps], next_obs, stats)
            if args.resume_fresh_envs:  # new games: every env's next step is a reset step; partial scores dropped
                next_is_reset_step[:] = True
                stats.drop_games_in_progress()
        global_step = start_iteration * batch_size
        progress = run.progress(global_step)
        # The NaN stop, kept on the device and read at logging intervals: no wait for the device at every update.
        updates_finite = torch.ones((), dtype=torch.bool, device=device)
        for iteration in range(start_iteration, num_iterations):
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - global_step / args.total_timesteps)
            # Exploration draws for the whole rollout at once: one epsilon per step, decayed by global step.
            step_epsilons = linear_schedule(args.start_e, args.end_e, epsilon_duration, global_step + rollout_steps)
            explore = np.random.rand(args.num_steps, args.num_envs) < step_epsilons[:, None]
            random_actions = np.random.randint(0, num_actions, (args.num_steps, args.num_envs))

            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                is_reset_step[step] = next_is_reset_step
                with torch.no_grad():
                    max_q[step], greedy = q_network(to_device(next_obs)).max(dim=1)
                actions[step] = np.where(explore[step], random_actions[step], greedy.cpu().numpy())
                action_log[iteration * args.num_steps + step] = actions[step]

                next_obs, reward, terminated, truncated, info = envs.step(actions[step])
                rewards[step] = reward  # clipped; `terminated` includes life losses
                terminations[step] = environments.terminated_at_step_cap(terminated, truncated, info)
                game_over = info["terminated"].astype(bool) | truncated
                stats.update(info["reward"], next_is_reset_step, game_over, run.writer, global_step)
                next_is_reset_step = terminated | truncated

            b_rewards, b_terminations, b_is_reset_step = to_device(rewards), to_device(terminations), to_device(is_reset_step)
            with torch.no_grad():
                last_max_q = q_network(to_device(next_obs)).max(dim=1).values
                next_max_q = torch.cat([max_q[1:], last_max_q[None]])
                fold_rewards, fold_dones = fold_reset_steps(b_rewards, b_terminations, max_q, b_is_reset_step)
                returns = q_lambda_returns(fold_rewards, fold_dones, next_max_q, args.gamma, args.q_lambda)
            batch = tuple(x.flatten(0, 1) for x in (to_device(obs), to_device(actions), returns, (~b_is_reset_step).float()))
            loss, q_taken, grads_finite = train_on_rollout(
                q_network, optimizer, batch, args.update_epochs, args.num_minibatches, args.max_grad_norm, args.td_loss_coef
            )
            updates_finite &= grads_finite

            is_last = iteration == num_iterations - 1
            if iteration % 10 == 0 or is_last:
                run.check_finite(updates_finite, global_step)
                run.writer.add_scalar("losses/td_loss", loss.item(), global_step)
                run.writer.add_scalar("losses/q_values", q_taken.mean().item(), global_step)
                run.writer.add_scalar("charts/epsilon", float(step_epsilons[-1]), global_step)
                run.writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                run.writer.add_scalar("charts/SPS", progress.sps(global_step), global_step)
            progress.print(global_step, stats.recent, force=is_last)  # every 10 s: an iteration can take 30 s on a CPU
            if run.checkpoint_due(global_step, batch_size, is_last):
                run.save(global_step, checkpoint_state(iteration + 1), learned=("q_network", "optimizer"))
            if run.stopped:  # a signal asked to stop: the checkpoint says how to continue
                break

        if args.save_model and not run.stopped and (model_path := run.save_model(q_network.state_dict())):
            run.log_evaluation(model_path, evaluate(q_network.state_dict(), args, device, run.video_folder))
        run.finish(stats.scores)
        envs.close()
    return stats.scores


if __name__ == "__main__":
    main(command_line.parse(Args))
