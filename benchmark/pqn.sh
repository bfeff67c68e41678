#!/usr/bin/env bash
# Reproduces the tables of docs/rl-algorithms/pqn.md; the switches (WORKERS, TRACK, ATARI, SEEDS, ATARI_SEEDS,
# ATARI_STEPS, LAUNCHER_ARGS, ATARI_LAUNCHER_ARGS, DRY_RUN) are described in benchmark/sweep.bash. Classic control
# only unless ATARI=1:  WORKERS=2 bash benchmark/pqn.sh
# Then: python benchmark/report.py --runs-dir runs --exp-names pqn --env-ids CartPole-v1 Acrobot-v1 MountainCar-v0
set -euo pipefail
source "$(dirname "$0")/sweep.bash"

# Classic control, default steps (500k): CartPole-v1 over 10 seeds, the other tasks over 3. A CartPole run took 20 s
# on an idle 2-core CPU (pqn.md); Acrobot's and MountainCar's episodes cost more per step.
classic 0.4 "CartPole-v1" "1 2 3 4 5 6 7 8 9 10" python cleanrl/pqn.py
classic 0.6 "Acrobot-v1 MountainCar-v0" "1 2 3" python cleanrl/pqn.py

# Atari, default steps (9,999,360: 10M rounded to whole batches), 3 seeds; steady agent steps per second on one GPU from pqn.md.
# These are CleanRL's settings; the authors' (purejaxql: 128 envs x 32 steps, 50M steps) are `--config purejaxql` of
# either script (pqn.md, "The authors' Atari configuration"), e.g. ATARI_STEPS=49999872 with that flag added below.
ATARI_IDS="Breakout-v5 SpaceInvaders-v5 BeamRider-v5 Pong-v5 MsPacman-v5"
atari 1943 9999360 "$ATARI_IDS" "1 2 3" python cleanrl/pqn_atari_envpool.py
atari 420 9999360 "$ATARI_IDS" "1 2 3" python cleanrl/pqn_atari_envpool_lstm.py

run_sweeps
