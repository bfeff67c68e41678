#!/usr/bin/env bash
# Reproduces the tables of docs/rl-algorithms/iqn.md. WORKERS=2 TRACK=0 bash benchmark/iqn.sh runs without W&B.
set -euo pipefail
WORKERS=${WORKERS:-2}
if [ "${TRACK:-1}" = 1 ]; then TRACK_FLAG="--track --wandb-project-name cleanrl-q"; else TRACK_FLAG="--no-track"; fi

# Classic control, default hyperparameters: CartPole-v1 over 10 seeds, Acrobot-v1 over 3.
python benchmark/launch.py --env-ids CartPole-v1 --seeds 1 2 3 4 5 6 7 8 9 10 --workers "$WORKERS" -- python cleanrl/iqn.py $TRACK_FLAG
python benchmark/launch.py --env-ids Acrobot-v1 --seeds 1 2 3 --workers "$WORKERS" -- python cleanrl/iqn.py $TRACK_FLAG

# Atari with the paper's hyperparameters (needs a GPU; 50M agent steps = 200M frames per run).
if [ "${ATARI:-0}" = 1 ]; then
    python benchmark/launch.py --env-ids Breakout-v5 Pong-v5 BeamRider-v5 SpaceInvaders-v5 MsPacman-v5 --seeds 1 2 3 \
        --workers 1 -- python cleanrl/iqn_atari.py $TRACK_FLAG --total-timesteps "${ATARI_STEPS:-10000000}"
fi
