"""Learning checks that hold on any machine, not only on the one they were measured on.

A seed's trajectory is reproducible on one machine, but another CPU (another vector instruction set, another
thread count, another PyTorch build) rounds some sums differently in the last bits, and training amplifies that
into a different run. So a learning check cannot rest on one seed and a threshold read off that seed's run.
Each check here was measured over ten seeds on one machine (the table sits next to the test); its threshold is
one that at least nine of those ten clear, far above what a broken variant of the algorithm reaches (also
measured, also next to the test). The check passes as soon as one of two seeds clears it: a correct agent fails
only when both land in the bottom tenth, about one time in a hundred, while a broken one fails every time.
"""

from typing import Callable, Sequence

import numpy as np
import pytest


def last_mean(scores: Sequence[float], episodes: int = 100) -> float:
    """The mean score of the last `episodes` episodes of a run."""
    return float(np.mean(scores[-episodes:]))


def passes_with_one_of(seeds: Sequence[int], run: Callable[[int], float], threshold: float) -> None:
    """Runs `run(seed)` for each seed in turn until one scores at least `threshold`; fails if none does."""
    scores = {}
    for seed in seeds:
        scores[seed] = run(seed)
        if scores[seed] >= threshold:
            return
    pytest.fail(f"no seed reached {threshold}: " + ", ".join(f"seed {s}: {v:.1f}" for s, v in scores.items()))
