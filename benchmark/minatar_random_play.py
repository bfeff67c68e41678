"""The score of uniform-random play on MinAtar games, the floor the docs' tables are read against.

    python benchmark/minatar_random_play.py --env-ids MinAtar/Freeway-v0 MinAtar/Seaquest-v0 --episodes 100 1000

Each game is played with the scripts' environment (all six actions, sticky actions 0.1, difficulty ramping, no step
cap) and one uniformly random action per step; prints the mean score over the episodes with its standard error.
"""

import argparse

import numpy as np

from cleanrl_q_utils import episode_scores, minatar


def random_play_scores(env_id: str, episodes: int, seed: int) -> np.ndarray:
    """Scores of `episodes` whole games, counted as the scripts count them (`EpisodeStats`)."""
    envs = minatar.make_envs(env_id, 1, seed)
    rng = np.random.default_rng(seed)
    num_actions = envs.single_action_space.n
    stats, is_reset_step = episode_scores.EpisodeStats(1), np.zeros(1, dtype=bool)
    envs.reset()
    while len(stats.scores) < episodes:
        _, rewards, terminated, truncated, _ = envs.step(rng.integers(num_actions, size=1))
        stats.update(rewards, is_reset_step, terminated | truncated)
        is_reset_step = terminated | truncated  # the next step only resets the game (NEXT_STEP autoreset)
    envs.close()
    return np.array(stats.scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-ids", nargs="+", required=True, help="MinAtar/<Game>-v0 or -v1 ids")
    parser.add_argument("--episodes", nargs="+", type=int, default=[1000], help="episodes per game (one, or one per id)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the games and the random actions")
    args = parser.parse_args()
    if len(args.episodes) not in (1, len(args.env_ids)) or min(args.episodes) < 1:
        parser.error("--episodes takes one positive count, or one per --env-ids entry")
    for env_id in args.env_ids:  # every id is checked before any game is played
        if not minatar.is_minatar(env_id):
            parser.error(f"{env_id} is not a MinAtar env id (MinAtar/<Game>-v0 or -v1)")
        minatar.spec(env_id)  # an unknown game: one line naming the games there are
    episodes = args.episodes * len(args.env_ids) if len(args.episodes) == 1 else args.episodes
    for env_id, count in zip(args.env_ids, episodes):
        scores = random_play_scores(env_id, count, args.seed)
        standard_error = scores.std() / np.sqrt(len(scores))
        print(f"{env_id}: {scores.mean():.2f} ± {standard_error:.2f} (standard error) over {len(scores)} episodes")


if __name__ == "__main__":
    main()
