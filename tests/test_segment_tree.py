"""The segment tree of prioritized replay (cleanrl_q_utils/segment_tree.py): one class for every script that samples
by priority, against plain sums and minima, and no script with a tree of its own."""

import ast
import pathlib

import numpy as np
import pytest

from cleanrl_q_utils.segment_tree import SegmentTree

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "cleanrl"
PRIORITIZED = ["dqn_dueling_per", "r2d2", "r2d2_atari", "recurrent_iqn", "recurrent_iqn_atari"]


def test_every_prioritized_script_uses_the_one_segment_tree():
    for path in sorted(SCRIPTS.glob("*.py")):
        source = path.read_text()
        own = [n.name for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name.endswith("Tree")]
        assert not own, f"{path.name} defines a tree of its own ({own}): use cleanrl_q_utils.segment_tree"
        uses = "from cleanrl_q_utils.segment_tree import SegmentTree" in source
        assert uses == (path.stem in PRIORITIZED), path.name


def test_segment_tree_matches_plain_sum_and_min_with_duplicate_indices():
    rng = np.random.default_rng(0)
    capacity = 37  # not a power of two: padded leaves must stay neutral
    sums, mins = SegmentTree(capacity, np.add, 0.0), SegmentTree(capacity, np.minimum, np.inf)
    plain = np.zeros(capacity)
    written = np.zeros(capacity, dtype=bool)
    for _ in range(200):
        idx = rng.integers(0, capacity, size=rng.integers(1, 20))  # repeats are frequent
        val = rng.random(len(idx))
        sums.update(idx, val)
        mins.update(idx, val)
        for i, v in zip(idx, val):  # sequential writes: the last one wins
            plain[i] = v
            written[i] = True
        assert sums.root == pytest.approx(plain.sum(), rel=1e-12)
        assert mins.root == plain[written].min()
    np.testing.assert_array_equal(sums.leaves(np.arange(capacity)), plain)


def test_update_with_one_value_for_all_and_with_no_index():
    tree = SegmentTree(6)
    tree.update(np.array([0, 2, 5]), 2.5)
    tree.update(np.array([], dtype=np.int64), np.zeros(0))
    np.testing.assert_array_equal(tree.leaves(np.arange(6)), [2.5, 0, 2.5, 0, 0, 2.5])
    assert tree.root == 7.5


def test_find_prefix_sum_against_cumulative_search():
    rng = np.random.default_rng(1)
    values = rng.random(100)
    values[[0, 17, 18, 99]] = 0.0  # zero leaves, including the first and the last
    tree = SegmentTree(100)
    tree.update(np.arange(100), values)
    mass = rng.random(5000) * values.sum()
    expected = np.searchsorted(np.cumsum(values), mass, side="right")
    np.testing.assert_array_equal(tree.find_prefix_sum(mass), expected)


def test_find_prefix_sum_never_returns_a_zero_leaf_at_the_edges():
    tree = SegmentTree(8)
    tree.update(np.arange(5), [0.0, 0.3, 0.0, 0.7, 0.0])  # leaves 5..7 empty
    got = tree.find_prefix_sum(np.array([0.0, tree.root, tree.root * (1 + 1e-12), 0.3]))
    np.testing.assert_array_equal(got, [1, 3, 3, 3])
    tree = SegmentTree(4)
    tree.update(np.arange(4), [0.1, 0.0, 0.2, 0.0])  # 0.1 + 0.2 rounds up: a draw of 0.3 overshoots leaf 2
    assert tree.find_prefix_sum(np.array([0.3])).tolist() == [2]
