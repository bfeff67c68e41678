#!/usr/bin/env bash
# Reproduces the tables of docs/rl-algorithms/r2d2.md. WORKERS=2 TRACK=0 bash benchmark/r2d2.sh runs without W&B.
# ATARI=1 also runs Atari (not in the docs yet; needs a GPU and about 8 GB of memory per run for the replay).
set -euo pipefail
WORKERS=${WORKERS:-2}
if [ "${TRACK:-1}" = 1 ]; then TRACK_FLAG="--track --wandb-project-name cleanrl-q"; else TRACK_FLAG="--no-track"; fi
python benchmark/launch.py --env-ids CartPole-v1 --seeds 1 2 3 --workers "$WORKERS" -- \
    python cleanrl/r2d2.py --total-timesteps 100000 --replay-ratio 8 --buffer-size 100000 $TRACK_FLAG
python benchmark/launch.py --env-ids CartPole-v1 --seeds 1 2 3 4 5 --workers "$WORKERS" -- \
    python cleanrl/r2d2.py --mask-velocity --exp-name r2d2_mask_velocity $TRACK_FLAG
if [ "${ATARI:-0}" = 1 ]; then
    python benchmark/launch.py --env-ids Breakout-v5 Pong-v5 --seeds 1 2 3 --workers 1 -- \
        python cleanrl/r2d2_atari.py $TRACK_FLAG
fi
