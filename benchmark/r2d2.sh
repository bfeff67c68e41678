#!/usr/bin/env bash
# Reproduces the tables of docs/rl-algorithms/r2d2.md. WORKERS=2 TRACK=0 bash benchmark/r2d2.sh runs without W&B.
# ATARI=1 also runs Atari (not in the docs yet; needs a GPU and about 8 GB of memory per run for the replay).
set -euo pipefail
WORKERS=${WORKERS:-2}
if [ "${TRACK:-1}" = 1 ]; then TRACK_FLAG="--track --wandb-project-name cleanrl-q"; else TRACK_FLAG="--no-track"; fi
# LAUNCHER_ARGS go to every launch.py call, e.g. LAUNCHER_ARGS="--backend ray --ray-address auto", ATARI_LAUNCHER_ARGS
# only to the Atari ones, e.g. ATARI_LAUNCHER_ARGS="--gpus-per-run 1 --cpus-per-run 8 --mem-gb 12" (docs/cluster.md);
# with --track the runs form the W&B group r2d2.
LAUNCH="python benchmark/launch.py --wandb-group r2d2 ${LAUNCHER_ARGS:-}"
$LAUNCH --env-ids CartPole-v1 --seeds 1 2 3 --workers "$WORKERS" -- \
    python cleanrl/r2d2.py --total-timesteps 100000 --replay-ratio 8 --buffer-size 100000 $TRACK_FLAG
$LAUNCH --env-ids CartPole-v1 --seeds 1 2 3 4 5 --workers "$WORKERS" -- \
    python cleanrl/r2d2.py --mask-velocity --exp-name r2d2_mask_velocity $TRACK_FLAG
if [ "${ATARI:-0}" = 1 ]; then
    $LAUNCH ${ATARI_LAUNCHER_ARGS:-} --env-ids Breakout-v5 Pong-v5 --seeds 1 2 3 --workers 1 -- \
        python cleanrl/r2d2_atari.py $TRACK_FLAG
fi
