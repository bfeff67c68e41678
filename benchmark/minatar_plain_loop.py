"""The speed floor of a MinAtar agent on this machine: bare training loops with Young & Tian's network (one 3x3
convolution of 16 filters, 128 units) and nothing else (no logging, checkpoints, prioritized replay, n-step returns or
episode statistics), on one PyTorch thread, for comparison with the scripts' steady speed (benchmark/minatar_speed.sh).

    python benchmark/minatar_plain_loop.py --loop pqn --seconds 60   # 128 envs x 32 steps, 4 epochs of 32 minibatches
    python benchmark/minatar_plain_loop.py --loop dqn --seconds 60   # 1 env, one update of a batch of 32 per step

Prints the agent steps per second after the first 5,000 steps (the DQN loop learns from there on, as Young & Tian).
"""

import argparse
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn

from cleanrl_q_utils import minatar


def network(channels: int, num_actions: int, layer_norm: bool) -> nn.Module:
    norm = (lambda *shape: nn.LayerNorm(list(shape))) if layer_norm else (lambda *shape: nn.Identity())
    return nn.Sequential(
        nn.Conv2d(channels, 16, 3), norm(16, 8, 8), nn.ReLU(), nn.Flatten(), nn.Linear(1024, 128), norm(128), nn.ReLU(),
        nn.Linear(128, num_actions),
    )  # fmt: skip


def planes(obs: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(obs).permute(0, 3, 1, 2).float()


def pqn_loop(env_id: str, seconds: float) -> float:
    envs = minatar.make_envs(env_id, 128, seed=1)
    obs, _ = envs.reset()
    q = network(obs.shape[-1], 6, layer_norm=True)
    optimizer = torch.optim.RAdam(q.parameters(), lr=5e-4)
    steps, start = 0, None
    while start is None or time.time() - start < seconds:
        rollout_obs, rollout_actions, rollout_rewards, rollout_dones, rollout_max_q = [], [], [], [], []
        for _ in range(32):
            with torch.no_grad():
                values = q(planes(obs))
            actions = np.where(np.random.rand(128) < 0.05, np.random.randint(6, size=128), values.argmax(1).numpy())
            rollout_obs.append(obs)
            rollout_actions.append(actions)
            rollout_max_q.append(values.max(1).values)
            obs, rewards, terminated, truncated, _ = envs.step(actions)
            rollout_rewards.append(rewards)
            rollout_dones.append(terminated | truncated)
        with torch.no_grad():
            next_max_q = torch.stack([*rollout_max_q[1:], q(planes(obs)).max(1).values])
            rewards, dones = torch.as_tensor(np.array(rollout_rewards)), torch.as_tensor(np.array(rollout_dones)).float()
            returns = torch.zeros_like(rewards)
            returns[-1] = rewards[-1] + 0.99 * (1 - dones[-1]) * next_max_q[-1]
            for t in range(30, -1, -1):
                returns[t] = rewards[t] + 0.99 * (1 - dones[t]) * (0.65 * returns[t + 1] + 0.35 * next_max_q[t])
        batch_obs = planes(np.concatenate(rollout_obs))
        batch_actions, batch_returns = torch.as_tensor(np.concatenate(rollout_actions)), returns.flatten()
        for _ in range(4):
            for minibatch in torch.randperm(4096).split(128):
                taken = q(batch_obs[minibatch]).gather(1, batch_actions[minibatch, None]).squeeze(1)
                loss = ((taken - batch_returns[minibatch]) ** 2).mean()
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(q.parameters(), 10.0)
                optimizer.step()
        steps += 4096
        if start is None and steps >= 5000:
            start, steps = time.time(), 0
    return steps / (time.time() - start)


def dqn_loop(env_id: str, seconds: float) -> float:
    env = gym.make(env_id, disable_env_checker=True)
    obs, _ = env.reset(seed=1)
    q, target = network(obs.shape[-1], 6, layer_norm=False), network(obs.shape[-1], 6, layer_norm=False)
    target.load_state_dict(q.state_dict())
    optimizer = torch.optim.RMSprop(q.parameters(), lr=2.5e-4, alpha=0.95, centered=True, eps=0.01)
    capacity = 100_000
    stored_obs, stored_next = np.zeros((capacity, *obs.shape), bool), np.zeros((capacity, *obs.shape), bool)
    stored_actions, stored_rewards, stored_dones = np.zeros(capacity, np.int64), np.zeros(capacity), np.zeros(capacity)
    steps, start = 0, None
    while start is None or time.time() - start < seconds:
        with torch.no_grad():
            greedy = int(q(planes(obs[None])).argmax())
        action = np.random.randint(6) if np.random.rand() < 0.1 else greedy
        next_obs, reward, terminated, truncated, _ = env.step(action)
        i = steps % capacity if start is None else (5000 + steps) % capacity
        stored_obs[i], stored_next[i], stored_actions[i], stored_rewards[i], stored_dones[i] = (
            obs,
            next_obs,
            action,
            reward,
            terminated,
        )
        obs = env.reset()[0] if terminated or truncated else next_obs
        steps += 1
        if start is None:
            if steps >= 5000:
                start, steps = time.time(), 0
            continue
        index = np.random.randint(min(5000 + steps, capacity), size=32)
        with torch.no_grad():
            bootstrap = target(planes(stored_next[index])).max(1).values
        targets = (
            torch.as_tensor(stored_rewards[index]).float()
            + 0.99 * (1 - torch.as_tensor(stored_dones[index]).float()) * bootstrap
        )
        taken = q(planes(stored_obs[index])).gather(1, torch.as_tensor(stored_actions[index])[:, None]).squeeze(1)
        loss = nn.functional.smooth_l1_loss(taken, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if steps % 1000 == 0:
            target.load_state_dict(q.state_dict())
    return steps / (time.time() - start)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loop", choices=["pqn", "dqn"], required=True)
    parser.add_argument("--env-id", default="MinAtar/Breakout-v0")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the timed part runs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    minatar.register(args.env_id)
    sps = (pqn_loop if args.loop == "pqn" else dqn_loop)(args.env_id, args.seconds)
    print(f"{args.loop} plain loop on {args.env_id}: {sps:,.0f} agent steps/s")
