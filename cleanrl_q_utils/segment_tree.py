"""The segment tree behind prioritized replay: one class for every script that samples by priority
(dqn_dueling_per, r2d2, r2d2_atari, recurrent_iqn, recurrent_iqn_atari). It is an index over an array of
priorities, shared as CleanRL shares its buffers; what a buffer stores, how it turns random numbers into draws and
how it sets priorities stay in each script.

Layer 2 (parts): imports no module of this package."""

import numpy as np


class SegmentTree:
    """A complete binary tree in one flat array (root at 1, leaf i at `num_leaves + i`, children of k at 2k and 2k+1)
    whose inner nodes hold `combine` of their children: np.add makes a sum tree for proportional sampling, np.minimum
    a min tree. A batch walks up or down the tree together, one level per numpy operation: O(B log n) work, O(log n)
    Python steps."""

    def __init__(self, capacity: int, combine=np.add, neutral: float = 0.0):
        self.depth = max(1, (capacity - 1).bit_length())
        self.num_leaves = 1 << self.depth
        self.combine = combine
        self.nodes = np.full(2 * self.num_leaves, neutral, dtype=np.float64)

    @property
    def root(self) -> float:
        return self.nodes[1]

    def leaves(self, indices: np.ndarray) -> np.ndarray:
        return self.nodes[indices + self.num_leaves]

    def update(self, indices: np.ndarray, values) -> None:
        """Sets leaves `indices` to `values` (one per index, or one for all); of repeated indices the last value wins."""
        indices = np.asarray(indices, dtype=np.int64)
        values = np.broadcast_to(np.asarray(values, dtype=np.float64), indices.shape)
        # Reversed np.unique keeps the last occurrence: fancy assignment alone leaves duplicates undefined.
        unique, last = np.unique(indices[::-1], return_index=True)
        nodes = unique + self.num_leaves
        self.nodes[nodes] = values[::-1][last]
        for _ in range(self.depth):
            nodes >>= 1
            # Parents are recomputed from their children rather than shifted by deltas: a parent shared by several
            # leaves gets the same value from each write, and the sums carry no drift however many updates are made.
            self.nodes[nodes] = self.combine(self.nodes[2 * nodes], self.nodes[2 * nodes + 1])

    def find_prefix_sum(self, mass: np.ndarray) -> np.ndarray:
        """Sum tree only. For each mass in [0, root], the leaf i with sum(leaves < i) <= mass < sum(leaves <= i).
        Never returns a zero leaf: at mass == root, or when rounding pushes the mass past a subtree, the descent
        stays in the last subtree with positive sum."""
        mass = np.array(mass, dtype=np.float64)
        nodes = np.ones(mass.shape, dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * nodes
            left_sum = self.nodes[left]
            go_right = (mass >= left_sum) & (self.nodes[left + 1] > 0)
            mass = np.where(go_right, mass - left_sum, mass)
            nodes = left + go_right
        return nodes - self.num_leaves
