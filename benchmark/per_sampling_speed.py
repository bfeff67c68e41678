"""Times prioritized sampling from a full replay buffer: the sum tree of cleanrl/dqn_dueling_per.py
against numpy's `np.random.choice(p=...)` on the same priorities.

    OMP_NUM_THREADS=1 python benchmark/per_sampling_speed.py --capacity 1000000 --batch-size 512
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from cleanrl.dqn_dueling_per import PrioritizedReplayBuffer, importance_weights  # noqa: E402


def best_ms(fn, repeats: int) -> tuple[float, float]:
    """Median and minimum of `repeats` timed calls, in milliseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times)), 1e3 * float(np.min(times))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--prioritized-replay-alpha", type=float, default=0.6)
    parser.add_argument("--prioritized-replay-beta", type=float, default=0.4)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    alpha, beta = args.prioritized_replay_alpha, args.prioritized_replay_beta

    rng = np.random.default_rng(0)
    n, b = args.capacity, args.batch_size
    # CartPole-sized transitions (4 floats); the data gather is part of what sample() does.
    rb = PrioritizedReplayBuffer(n, (4,), np.float32, alpha, seed=0)
    for start in range(0, n, 100_000):
        k = min(100_000, n - start)
        rb.add(rng.random((k, 4)), rng.integers(0, 2, k), rng.random(k), np.ones(k), rng.random((k, 4)))
    priorities = rng.exponential(size=n) + 1e-6
    rb.update_priorities(np.arange(n), priorities)

    tree_ms = best_ms(lambda: rb.sample(b, beta), args.repeats)
    update_ms = best_ms(lambda: rb.update_priorities(rng.integers(0, n, b), rng.random(b) + 1e-6), args.repeats)

    scaled = priorities**alpha
    probs = scaled / scaled.sum()

    def choice_only():
        np.random.choice(n, size=b, p=probs)

    def choice_full():
        # What an O(n) sampler pays each call: normalise the priorities, draw, weight.
        p = scaled / scaled.sum()
        idx = np.random.choice(n, size=b, p=p)
        weights = (n * p[idx]) ** -beta
        return idx, weights / ((n * p.min()) ** -beta)

    choice_repeats = max(5, args.repeats // 10)
    only_ms = best_ms(choice_only, choice_repeats)
    full_ms = best_ms(choice_full, choice_repeats)
    # Both samplers must agree on the weights of the same items.
    idx = rb.sample(b, beta)[1]
    np.testing.assert_allclose(
        importance_weights(scaled[idx], scaled.min(), beta),
        (n * probs[idx]) ** -beta / (n * probs.min()) ** -beta,
        rtol=1e-4,
    )

    print(f"buffer {n:,} transitions, batch {b}, alpha {alpha}, beta {beta}")
    print("sampler                                        median ms   min ms")
    print(f"sum tree: sample (indices, IS weights, batch)  {tree_ms[0]:9.3f} {tree_ms[1]:8.3f}")
    print(f"sum tree: update_priorities of {b} items       {update_ms[0]:9.3f} {update_ms[1]:8.3f}")
    print(f"np.random.choice(p=...), p precomputed        {only_ms[0]:9.3f} {only_ms[1]:8.3f}")
    print(f"np.random.choice(p=...) + normalise + weights {full_ms[0]:9.3f} {full_ms[1]:8.3f}")
