"""Parallel Q-Network (PQN) for classic-control tasks and MinAtar games with discrete actions.

PQN is Q-learning without a replay buffer and without a target network: many vectorized environments
collect a short rollout with an epsilon-greedy policy, Q(lambda) targets are computed once from the
Q-values stored while acting, and a LayerNorm network trains on the rollout for a few epochs of minibatches.

Paper: Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning" (arXiv:2407.04811).
Docs: docs/rl-algorithms/pqn.md
"""

import cleanrl_q_utils.quiet_start  # noqa: F401  (first: a signal while torch loads exits quietly)

import functools
import os
from dataclasses import dataclass
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn

from cleanrl_q_utils import (
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
from cleanrl_q_utils.flat_radam import RAdam, flatten_parameters

envpool = classic_control.import_envpool()  # None off Linux (it has Linux wheels only): classic control is gymnasium's

# The layout of checkpoint.pt, which a resume checks; 3: the state `main` lists in `checkpoint_state`
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
    total_timesteps: int = 499_712
    """the total number of agent steps of the experiment, summed over all environments"""
    learning_rate: float = 5e-4  # RAdam; CleanRL: 2.5e-4 with 4 envs; larger batches take a larger step
    """the learning rate of the optimizer"""
    anneal_lr: bool = True
    """if toggled, anneal the learning rate linearly to zero over training"""
    num_envs: int = 128  # CleanRL: 4; more envs mean fewer Python calls per env step
    """the number of parallel environments"""
    num_steps: int = 8  # CleanRL: 128
    """the number of steps each environment takes per rollout"""
    num_minibatches: int = 4
    """the number of minibatches each rollout is split into"""
    update_epochs: int = 8  # CleanRL: 4; with 4, 2 of 10 CartPole seeds never learned
    """the number of passes over each rollout"""
    gamma: float = 0.99
    """the discount factor gamma"""
    q_lambda: float = 0.65
    """the lambda of the Q(lambda) targets"""
    start_e: float = 1.0
    """the starting epsilon of the epsilon-greedy exploration"""
    end_e: float = 0.02  # CleanRL: 0.05
    """the final epsilon of the epsilon-greedy exploration"""
    exploration_fraction: float = 0.4  # CleanRL: 0.5
    """the fraction of `total_timesteps` over which the epsilon schedule goes linearly from `start_e` to `end_e` (0: `end_e`
    from the first step)"""
    max_grad_norm: float = 10.0
    """the global norm the gradients are clipped to"""
    eval_epsilon: float = 0.0  # greedy, as purejaxql's CartPole test environments
    """the epsilon of the evaluation episodes"""
    checkpoint_every: int = 0
    """write a resumable checkpoint every this many agent steps and at the end (0: only when a signal stops the run)"""
    resume: Optional[str] = None
    """continue the run saved in this checkpoint, in the same run directory (and W&B run)"""
    resume_fresh_envs: bool = False
    """with --resume: start new games instead of replaying every logged action (cost independent of the run's length;
    the games in progress are dropped, so the run is not bit-identical)"""


# The configuration a MinAtar id runs with (flags given on the command line win): purejaxql's MinAtar rollouts of 128
# envs x 32 steps in minibatches of 128, 4 epochs, final epsilon 0.01; a sweep chose it (docs/rl-algorithms/pqn.md).
MINATAR_DEFAULTS = dict(
    total_timesteps=10_000_000, num_steps=32, num_minibatches=32, update_epochs=4, exploration_fraction=0.1, end_e=0.01
)


def rollout_memory_bytes(args: Args, obs_shape: tuple, obs_dtype: np.dtype) -> int:
    """Bytes of the rollout storage `main` allocates: (num_steps, num_envs) observations, then per step an int64
    action, float32 reward, termination and max-Q, and a bool reset flag."""
    per_step = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize + 8 + 4 + 4 + 4 + 1
    return args.num_steps * args.num_envs * per_step


def network_sizes(obs_shape: tuple, num_actions: int) -> tuple[int, int]:
    """(parameters, floats of every layer output for one observation) of QNetwork, counted from its layers."""
    linear, inputs = flag_checks.linear_parameters, int(np.prod(obs_shape))
    if len(obs_shape) == 3:  # MinAtar grid: convolution, LayerNorm, ReLU, then 128 units
        grid = 16 * (obs_shape[0] - 2) * (obs_shape[1] - 2)
        parameters = flag_checks.conv_parameters(obs_shape[2], 16, 3) + 2 * grid + linear(grid, 128) + 2 * 128
        return parameters + linear(128, num_actions), 2 * inputs + 3 * grid + 3 * 128 + num_actions
    parameters = linear(inputs, 120) + 2 * 120 + linear(120, 84) + 2 * 84  # each layer with its LayerNorm
    return parameters + linear(84, num_actions), inputs + 3 * 120 + 3 * 84 + num_actions


def memory_needs(args: Args, obs_shape: tuple, num_actions: int) -> list:
    """What a run allocates in proportion to its flags, for `flag_checks.check_run_memory`: the rollout (float32
    observations whatever the env's dtype), the network with its gradients and two RAdam moments (no target network),
    a minibatch's activations, the environments."""
    parameters, floats = network_sizes(obs_shape, num_actions)
    needs = flag_checks.common_needs(args, parameters, 4, ("env_id",), args.eval_episodes, floats)
    if args.eval_only:
        return needs
    rollout = ("the rollout storage", rollout_memory_bytes(args, obs_shape, np.float32), ("num_envs", "num_steps"))
    minibatch = args.num_envs * args.num_steps // args.num_minibatches
    update = flag_checks.activation_memory_bytes(minibatch, floats)
    return needs + [rollout, ("an update's activations", update, ("num_envs", "num_steps", "num_minibatches"))]


def validate_args(args: Args) -> list:
    """Stops with one clear message on flags that cannot work, before anything is built."""
    flag_checks.check_common_flags(args)
    spec = flag_checks.check_env_id(args.env_id, atari=False)
    memory = flag_checks.check_run_memory(args, memory_needs(args, spec.observation_space.shape, spec.action_space.n))
    batch_size = args.num_envs * args.num_steps
    batch = f"num_envs * num_steps = {batch_size}"
    flag_errors.check_flags(
        [
            ("num_minibatches", args.num_minibatches, batch_size % args.num_minibatches == 0, f"must divide {batch}"),
            ("total_timesteps", args.total_timesteps, args.total_timesteps >= batch_size, f"must be at least {batch}"),
        ]
    )
    return memory


def make_env(env_id: str, num_envs: int, seed: int):
    if minatar.is_minatar(env_id):
        return minatar.make_envs(env_id, num_envs, seed)
    if envpool is None:  # stepped as envpool steps, NEXT_STEP autoreset included
        return classic_control.make_envs(env_id, num_envs, seed)
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed)


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class QNetwork(nn.Module):
    """LayerNorm before every hidden ReLU: it is what keeps TD learning stable without a target network. Vectors go through
    an MLP 120-84; MinAtar's (10, 10, C) images through Young & Tian's torso, a 3x3 convolution of 16 filters, 128 units."""

    def __init__(self, obs_shape: tuple, num_actions: int):
        super().__init__()
        self.is_image = len(obs_shape) == 3
        if self.is_image:
            height, width, channels = obs_shape
            torso = [layer_init(nn.Conv2d(channels, 16, 3)), nn.LayerNorm([16, height - 2, width - 2]), nn.ReLU()]
            torso += [nn.Flatten(), layer_init(nn.Linear(16 * (height - 2) * (width - 2), 128)), nn.LayerNorm(128)]
            self.torso_name = f"convolutional (16 filters 3x3, 128 units) for {height}x{width}x{channels} grids"
            hidden = 128
        else:
            torso = [layer_init(nn.Linear(int(np.prod(obs_shape)), 120)), nn.LayerNorm(120), nn.ReLU()]
            torso += [layer_init(nn.Linear(120, 84)), nn.LayerNorm(84)]
            self.torso_name = f"MLP 120-84 for vectors of {int(np.prod(obs_shape))}"
            hidden = 84
        self.network = nn.Sequential(*torso, nn.ReLU(), layer_init(nn.Linear(hidden, num_actions)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_image:  # bool planes, channels last, as the games give them
            x = x.permute(0, 3, 1, 2).float()
        return self.network(x)


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
    q_network: QNetwork, optimizer: RAdam, batch: tuple, update_epochs: int, num_minibatches: int, max_grad_norm: float
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
            optimizer.param.grad.zero_()  # the layers' gradients are views of it
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(optimizer.param, max_grad_norm)
            grads_finite &= torch.isfinite(grad_norm)
            optimizer.step()
    return loss, q_taken, grads_finite


def evaluate(weights: dict, args: Args, device: torch.device, video_folder: str) -> list[float]:
    """Scores of `args.eval_episodes` episodes of the network with `weights` (a model file's), epsilon-greedy with
    `args.eval_epsilon`; videos of them in `video_folder` with --capture-video."""
    if args.eval_episodes == 0:  # none to play (and envpool builds no zero envs)
        return []
    if args.capture_video:  # envpool does not render; a gymnasium env with the same dynamics records the video
        envs = gym.vector.SyncVectorEnv([lambda: environments.make_video_env(args.env_id, video_folder)])
    else:  # one environment per episode, so that short episodes are not over-represented
        envs = make_env(args.env_id, args.eval_episodes, args.seed + EVAL_SEED_OFFSET)
    obs, _ = envs.reset(seed=args.seed + EVAL_SEED_OFFSET) if args.capture_video else envs.reset()
    num_envs, num_actions = envs.num_envs, envs.single_action_space.n
    quota = np.full(num_envs, args.eval_episodes // num_envs)
    model = QNetwork(envs.single_observation_space.shape, num_actions).to(device)
    model_files.put_weights(model, weights, args.model_path)
    model.eval()
    stats, is_reset_step = episode_scores.EpisodeStats(num_envs), np.zeros(num_envs, dtype=bool)
    while quota.sum() > 0:
        with torch.no_grad():
            greedy = model(torch.as_tensor(obs, dtype=torch.float32, device=device)).argmax(1).cpu().numpy()
        explore = np.random.rand(num_envs) < args.eval_epsilon
        actions = np.where(explore, np.random.randint(num_actions, size=num_envs), greedy)
        obs, reward, terminated, truncated, _ = envs.step(actions)
        counted = (terminated | truncated) & (quota > 0)  # each env counts its first `quota` episodes
        stats.update(reward, is_reset_step, counted)
        quota -= counted
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
    batch_size = args.num_envs * args.num_steps
    num_iterations = args.total_timesteps // batch_size
    epsilon_duration = args.exploration_fraction * args.total_timesteps
    rollout_steps = args.num_envs * np.arange(1, args.num_steps + 1)  # agent steps into a rollout after each of its steps
    # cpu_threads=1: a network this small gains nothing from intra-op threads; they only add synchronization per call.
    with training_run.Run(args, checkpoint, __file__, CHECKPOINT_FORMAT, cpu_threads=1, memory=memory) as run:
        device = run.device
        to_device = functools.partial(torch.as_tensor, device=device)  # numpy arrays to the run's device
        envs = make_env(args.env_id, args.num_envs, run.env_seed)
        obs_shape, num_actions = envs.single_observation_space.shape, envs.single_action_space.n
        q_network = QNetwork(obs_shape, num_actions).to(device)
        print(f"  torso: {q_network.torso_name}")
        optimizer = RAdam(flatten_parameters(q_network), lr=args.learning_rate)

        # Rollout storage lives in numpy (cheap per-step writes) and moves to the device once per rollout.
        obs = np.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=np.float32)
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
                optimizer.lr = args.learning_rate * (1.0 - global_step / args.total_timesteps)
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

                next_obs, reward, terminated, truncated, _ = envs.step(actions[step])
                rewards[step] = reward
                terminations[step] = terminated
                stats.update(reward, next_is_reset_step, terminated | truncated, run.writer, global_step)
                next_is_reset_step = terminated | truncated

            b_rewards, b_terminations, b_is_reset_step = to_device(rewards), to_device(terminations), to_device(is_reset_step)
            with torch.no_grad():
                last_max_q = q_network(to_device(next_obs)).max(dim=1).values
                next_max_q = torch.cat([max_q[1:], last_max_q[None]])
                fold_rewards, fold_dones = fold_reset_steps(b_rewards, b_terminations, max_q, b_is_reset_step)
                returns = q_lambda_returns(fold_rewards, fold_dones, next_max_q, args.gamma, args.q_lambda)
            batch = tuple(x.flatten(0, 1) for x in (to_device(obs), to_device(actions), returns, (~b_is_reset_step).float()))
            loss, q_taken, grads_finite = train_on_rollout(
                q_network, optimizer, batch, args.update_epochs, args.num_minibatches, args.max_grad_norm
            )
            updates_finite &= grads_finite

            is_last = iteration == num_iterations - 1
            if iteration % 10 == 0 or is_last:
                run.check_finite(updates_finite, global_step)
                run.writer.add_scalar("losses/td_loss", loss.item(), global_step)
                run.writer.add_scalar("losses/q_values", q_taken.mean().item(), global_step)
                run.writer.add_scalar("charts/epsilon", float(step_epsilons[-1]), global_step)
                run.writer.add_scalar("charts/learning_rate", optimizer.lr, global_step)
                run.writer.add_scalar("charts/SPS", progress.sps(global_step), global_step)
                progress.print(global_step, stats.recent, force=is_last)
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
    main(command_line.parse(Args, minatar=MINATAR_DEFAULTS))
