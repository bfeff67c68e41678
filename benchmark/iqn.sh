#!/usr/bin/env bash
# Reproduces the tables of docs/rl-algorithms/iqn.md; the switches (WORKERS, TRACK, ATARI, SEEDS, ATARI_SEEDS,
# ATARI_STEPS, LAUNCHER_ARGS, ATARI_LAUNCHER_ARGS, DRY_RUN) are described in benchmark/sweep.bash. Classic control
# only unless ATARI=1:  WORKERS=2 bash benchmark/iqn.sh
set -euo pipefail
source "$(dirname "$0")/sweep.bash"

# Classic control, default hyperparameters: CartPole-v1 over 10 seeds, Acrobot-v1 over 3 (about 4 min a run, iqn.md).
classic 4.2 "CartPole-v1" "1 2 3 4 5 6 7 8 9 10" python cleanrl/iqn.py
classic 4.1 "Acrobot-v1" "1 2 3" python cleanrl/iqn.py

# Atari with the paper's hyperparameters, 10M agent steps (the paper's 50M: ATARI_STEPS=50000000); 304 agent steps/s
# on one GPU (iqn.md). Epsilon decays over the paper's (and Dopamine's) 1M agent steps after the warm-up, whatever the
# run's length: --exploration-fraction is a fraction of --total-timesteps (the script's 0.02 is 1M of 50M), so it is
# 1M / steps here (all of a run shorter than 1M).
ATARI_IQN_STEPS=${ATARI_STEPS:-10000000}
EPSILON_FRACTION=$(awk -v steps="$ATARI_IQN_STEPS" 'BEGIN { f = 1000000 / steps; printf "%.12g", (f < 1 ? f : 1) }')
atari 304 "$ATARI_IQN_STEPS" "Breakout-v5 Pong-v5 BeamRider-v5 SpaceInvaders-v5 MsPacman-v5" "1 2 3" \
    python cleanrl/iqn_atari.py --exploration-fraction "$EPSILON_FRACTION"

run_sweeps
