#!/usr/bin/env bash
# Reproduces the tables of docs/rl-algorithms/pqn.md. WORKERS=2 TRACK=0 bash benchmark/pqn.sh runs without W&B.
# Then: python benchmark/report.py --runs-dir runs --exp-names pqn --env-ids CartPole-v1 Acrobot-v1 MountainCar-v0
set -euo pipefail
WORKERS=${WORKERS:-2}
if [ "${TRACK:-1}" = 1 ]; then TRACK_FLAG="--track --wandb-project-name cleanrl-q"; else TRACK_FLAG="--no-track"; fi
# LAUNCHER_ARGS go to every launch.py call, e.g. LAUNCHER_ARGS="--backend ray --ray-address auto", ATARI_LAUNCHER_ARGS
# only to the Atari ones, e.g. ATARI_LAUNCHER_ARGS="--gpus-per-run 1 --cpus-per-run 8 --mem-gb 12" (docs/cluster.md);
# with --track the runs form the W&B group pqn.
LAUNCH="python benchmark/launch.py --wandb-group pqn ${LAUNCHER_ARGS:-}"

# Classic control, default steps (500k): CartPole-v1 over 10 seeds, the other tasks over 3.
$LAUNCH --env-ids CartPole-v1 --seeds 1 2 3 4 5 6 7 8 9 10 --workers "$WORKERS" -- \
    python cleanrl/pqn.py $TRACK_FLAG
$LAUNCH --env-ids Acrobot-v1 MountainCar-v0 --seeds 1 2 3 --workers "$WORKERS" -- \
    python cleanrl/pqn.py $TRACK_FLAG

# Atari, default steps (10M), 3 seeds; set ATARI=0 to skip.
if [ "${ATARI:-1}" = 1 ]; then
    ATARI_IDS="Breakout-v5 SpaceInvaders-v5 BeamRider-v5 Pong-v5 MsPacman-v5"
    $LAUNCH ${ATARI_LAUNCHER_ARGS:-} --env-ids $ATARI_IDS --seeds 1 2 3 --workers "$WORKERS" -- \
        python cleanrl/pqn_atari_envpool.py $TRACK_FLAG
    $LAUNCH ${ATARI_LAUNCHER_ARGS:-} --env-ids $ATARI_IDS --seeds 1 2 3 --workers "$WORKERS" -- \
        python cleanrl/pqn_atari_envpool_lstm.py $TRACK_FLAG
fi
