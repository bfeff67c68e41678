#!/usr/bin/env bash
# Reproduces the "Side by side with Stable-Baselines3" tables of docs/rl-algorithms/dqn_dueling_per.md and iqn.md:
# our dqn_dueling_per.py and iqn.py with their defaults, and SB3's DQN and sb3-contrib's QR-DQN with RL Zoo's
# hyperparameters (benchmark/sb3_baselines.py, needs the sb3 extra), on the same envs and seeds. The switches
# (WORKERS, TRACK, SEEDS, LAUNCHER_ARGS, DRY_RUN, ...) are described in benchmark/sweep.bash; it has no Atari sweep.
#     WORKERS=2 SEEDS="1 2 3" bash benchmark/sb3.sh
set -euo pipefail
source "$(dirname "$0")/sweep.bash"
ENVS="CartPole-v1 Acrobot-v1"

# --save-model only adds the greedy evaluation after training (10 episodes), as sb3_baselines.py does. Minutes a run:
# the mean over the two envs of the tables' wall times.
classic 1.2 "$ENVS" "1 2 3" python cleanrl/dqn_dueling_per.py --save-model
classic 4.6 "$ENVS" "1 2 3" python cleanrl/iqn.py --save-model
classic 2.8 "$ENVS" "1 2 3" python benchmark/sb3_baselines.py --algo dqn
classic 4.0 "$ENVS" "1 2 3" python benchmark/sb3_baselines.py --algo qrdqn

# The tables read the runs under runs/.
EXP_NAMES="dqn_dueling_per sb3_dqn iqn sb3_qrdqn"
after python benchmark/report.py --runs-dir runs --env-ids $ENVS --exp-names $EXP_NAMES --seeds ${SEEDS:-1 2 3} \
    --name sb3_side_by_side
after python benchmark/threshold_table.py --runs-dir runs --env-ids $ENVS --thresholds 475 -100 \
    --exp-names $EXP_NAMES --seeds ${SEEDS:-1 2 3}

run_sweeps
