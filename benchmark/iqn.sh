#!/usr/bin/env bash
# Reproduces the tables of docs/rl-algorithms/iqn.md. WORKERS=2 TRACK=0 bash benchmark/iqn.sh runs without W&B.
set -euo pipefail
WORKERS=${WORKERS:-2}
if [ "${TRACK:-1}" = 1 ]; then TRACK_FLAG="--track --wandb-project-name cleanrl-q"; else TRACK_FLAG="--no-track"; fi
# LAUNCHER_ARGS go to every launch.py call, e.g. LAUNCHER_ARGS="--backend ray --ray-address auto", ATARI_LAUNCHER_ARGS
# only to the Atari ones, e.g. ATARI_LAUNCHER_ARGS="--gpus-per-run 1 --cpus-per-run 8 --mem-gb 12" (docs/cluster.md);
# with --track the runs form the W&B group iqn.
LAUNCH="python benchmark/launch.py --wandb-group iqn ${LAUNCHER_ARGS:-}"

# Classic control, default hyperparameters: CartPole-v1 over 10 seeds, Acrobot-v1 over 3.
$LAUNCH --env-ids CartPole-v1 --seeds 1 2 3 4 5 6 7 8 9 10 --workers "$WORKERS" -- python cleanrl/iqn.py $TRACK_FLAG
$LAUNCH --env-ids Acrobot-v1 --seeds 1 2 3 --workers "$WORKERS" -- python cleanrl/iqn.py $TRACK_FLAG

# Atari with the paper's hyperparameters (needs a GPU; 50M agent steps = 200M frames per run).
if [ "${ATARI:-0}" = 1 ]; then
    $LAUNCH ${ATARI_LAUNCHER_ARGS:-} --env-ids Breakout-v5 Pong-v5 BeamRider-v5 SpaceInvaders-v5 MsPacman-v5 --seeds 1 2 3 \
        --workers 1 -- python cleanrl/iqn_atari.py $TRACK_FLAG --total-timesteps "${ATARI_STEPS:-10000000}"
fi
