#!/usr/bin/env bash
# Reproduces the tables of docs/rl-algorithms/dqn_dueling_per.md. WORKERS=2 TRACK=0 bash benchmark/dqn_dueling_per.sh runs without W&B.
set -euo pipefail
WORKERS=${WORKERS:-2}
if [ "${TRACK:-1}" = 1 ]; then TRACK_FLAG="--track --wandb-project-name cleanrl-q"; else TRACK_FLAG="--no-track"; fi
# LAUNCHER_ARGS go to every launch.py call, e.g. LAUNCHER_ARGS="--backend ray --ray-address auto" (docs/cluster.md);
# with --track the runs form the W&B group dqn_dueling_per.
LAUNCH="python benchmark/launch.py --wandb-group dqn_dueling_per ${LAUNCHER_ARGS:-}"
# CartPole-v1 (10 seeds) and Acrobot-v1 (3 seeds) with the defaults.
$LAUNCH --env-ids CartPole-v1 --seeds 1 2 3 4 5 6 7 8 9 10 --workers "$WORKERS" -- python cleanrl/dqn_dueling_per.py $TRACK_FLAG
$LAUNCH --env-ids Acrobot-v1 --seeds 1 2 3 --workers "$WORKERS" -- python cleanrl/dqn_dueling_per.py $TRACK_FLAG
# LunarLander-v3: episodes of up to 1000 steps need a longer run. Its table was measured with the previous
# default batch of 128.
$LAUNCH --env-ids LunarLander-v3 --seeds 1 2 3 --workers "$WORKERS" -- python cleanrl/dqn_dueling_per.py $TRACK_FLAG --total-timesteps 250000 --batch-size 128
# Speed of the prioritized sampler on a full buffer of 1M transitions (batch 512).
OMP_NUM_THREADS=1 python benchmark/per_sampling_speed.py --capacity 1000000 --batch-size 512
