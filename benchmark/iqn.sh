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
# on one GPU (iqn.md).
atari 304 10000000 "Breakout-v5 Pong-v5 BeamRider-v5 SpaceInvaders-v5 MsPacman-v5" "1 2 3" python cleanrl/iqn_atari.py

run_sweeps
