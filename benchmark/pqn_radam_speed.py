"""Time of one update of pqn.py's 120-84 network with the script's flat-parameter RAdam, against torch.optim.RAdam on
the plain module (its default for-loop over the ten parameter tensors, and foreach=True), and against
torch.optim.RAdam on the flat parameter (which separates the gain of flattening from that of the written-out step).

    python benchmark/pqn_radam_speed.py                    # CartPole sizes: minibatch 256, one CPU thread

An update is what `train_on_rollout` does per minibatch: forward, squared TD loss (without the reset-step mask),
backward, clip with the non-finite check, optimizer step. The variants take turns, round after round, so that a
machine that is busy for a while slows all of them alike; the table gives the median and the best round of each.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cleanrl.pqn import QNetwork  # noqa: E402
from cleanrl_q_utils.flat_radam import RAdam, flatten_parameters  # noqa: E402


def variant(kind: str, obs_dim: int = 4, num_actions: int = 2):
    """(network, parameters to clip, zero_grad, optimizer) with the same initial weights for every kind."""
    torch.manual_seed(0)
    network = QNetwork((obs_dim,), num_actions)
    if kind == "flat RAdam (pqn.py)":
        flat = flatten_parameters(network)
        return network, [flat], flat.grad.zero_, RAdam(flat, lr=5e-4)
    if kind == "torch.optim.RAdam, flat parameter":
        flat = flatten_parameters(network)
        return network, [flat], flat.grad.zero_, torch.optim.RAdam([flat], lr=5e-4)
    optimizer = torch.optim.RAdam(network.parameters(), lr=5e-4, foreach=kind.endswith("foreach"))
    return network, list(network.parameters()), optimizer.zero_grad, optimizer


def time_updates(setup, batch, updates: int) -> float:
    network, params, zero_grad, optimizer = setup
    obs, actions, returns = batch
    start = time.perf_counter()
    for _ in range(updates):
        q_taken = network(obs).gather(1, actions[:, None]).squeeze(1)
        loss = ((q_taken - returns) ** 2).mean()
        zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 10.0, error_if_nonfinite=True)
        optimizer.step()
    return (time.perf_counter() - start) / updates


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minibatch", type=int, default=256)
    parser.add_argument("--updates", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    cli = parser.parse_args()
    torch.set_num_threads(cli.threads)
    generator = torch.Generator().manual_seed(0)
    batch = (
        torch.randn(cli.minibatch, 4, generator=generator),
        torch.randint(0, 2, (cli.minibatch,), generator=generator),
        torch.randn(cli.minibatch, generator=generator),
    )
    kinds = ["flat RAdam (pqn.py)", "torch.optim.RAdam", "torch.optim.RAdam foreach", "torch.optim.RAdam, flat parameter"]
    setups = {kind: variant(kind) for kind in kinds}
    for setup in setups.values():  # warm-up: first calls allocate and, for torch.optim, import torch._dynamo
        time_updates(setup, batch, 50)
    times = {kind: [] for kind in kinds}
    for _ in range(cli.rounds):
        for kind in kinds:
            times[kind].append(time_updates(setups[kind], batch, cli.updates))
    print(f"ms per update, {cli.rounds} rounds x {cli.updates} updates, minibatch {cli.minibatch}, {cli.threads} thread(s)")
    print("| optimizer | median | best |\n|---|---|---|")
    for kind in kinds:
        print(f"| {kind} | {1e3 * statistics.median(times[kind]):.3f} | {1e3 * min(times[kind]):.3f} |")


if __name__ == "__main__":
    main()
