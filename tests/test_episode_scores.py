"""cleanrl_q_utils.episode_scores: whole episodes' scores, the reset step left out."""

import numpy as np

from cleanrl_q_utils.episode_scores import EpisodeStats


def test_episode_stats_counts_whole_episodes_without_the_reset_step():
    stats = EpisodeStats(2)
    steps = [  # reward, is_reset_step, episode_over
        ([1.0, 1.0], [False, False], [False, False]),
        ([2.0, 1.0], [False, False], [True, False]),
        ([0.0, 5.0], [True, False], [False, True]),
        ([1.0, 0.0], [False, True], [False, False]),
    ]
    finished = [stats.update(np.array(r), np.array(reset), np.array(over)) for r, reset, over in steps]
    assert finished == [[], [(3.0, 2)], [(7.0, 3)], []]
    assert stats.scores == [3.0, 7.0] and list(stats.returns) == [1.0, 0.0] and list(stats.lengths) == [1, 0]
