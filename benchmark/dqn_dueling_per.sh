#!/usr/bin/env bash
# Reproduces the tables of docs/rl-algorithms/dqn_dueling_per.md; the switches (WORKERS, TRACK, ATARI, SEEDS,
# ATARI_SEEDS, ATARI_STEPS, LAUNCHER_ARGS, ATARI_LAUNCHER_ARGS, DRY_RUN) are described in benchmark/sweep.bash.
# It has no Atari sweep yet:  WORKERS=2 bash benchmark/dqn_dueling_per.sh
set -euo pipefail
source "$(dirname "$0")/sweep.bash"

# CartPole-v1 (10 seeds) and Acrobot-v1 (3 seeds) with the defaults, about 1.2 min a run (dqn_dueling_per.md).
classic 1.2 "CartPole-v1" "1 2 3 4 5 6 7 8 9 10" python cleanrl/dqn_dueling_per.py
classic 1.2 "Acrobot-v1" "1 2 3" python cleanrl/dqn_dueling_per.py
# LunarLander-v3: episodes of up to 1000 steps need a longer run (223-235 s a run). Its table was measured with the
# previous default batch of 128.
classic 3.9 "LunarLander-v3" "1 2 3" python cleanrl/dqn_dueling_per.py --total-timesteps 250000 --batch-size 128
# Speed of the prioritized sampler on a full buffer of 1M transitions (batch 512).
after env OMP_NUM_THREADS=1 python benchmark/per_sampling_speed.py --capacity 1000000 --batch-size 512

run_sweeps
