#!/usr/bin/env bash
# Reproduces the "Side by side with Stable-Baselines3" tables of docs/rl-algorithms/dqn_dueling_per.md and iqn.md:
# our dqn_dueling_per.py and iqn.py with their defaults, and SB3's DQN and sb3-contrib's QR-DQN with RL Zoo's
# hyperparameters (benchmark/sb3_baselines.py, needs the sb3 extra), on the same envs and seeds.
# WORKERS=2 TRACK=0 SEEDS="1 2 3" bash benchmark/sb3.sh runs without W&B.
set -euo pipefail
WORKERS=${WORKERS:-2}
SEEDS=${SEEDS:-1 2 3}
if [ "${TRACK:-1}" = 1 ]; then TRACK_FLAG="--track --wandb-project-name cleanrl-q"; else TRACK_FLAG="--no-track"; fi
ENVS="CartPole-v1 Acrobot-v1"
# LAUNCHER_ARGS go to every launch.py call (docs/cluster.md); the tables at the end read the runs under runs/.
LAUNCH="python benchmark/launch.py ${LAUNCHER_ARGS:-}"

# --save-model only adds the greedy evaluation after training (10 episodes), as sb3_baselines.py does.
$LAUNCH --env-ids $ENVS --seeds $SEEDS --workers "$WORKERS" -- python cleanrl/dqn_dueling_per.py $TRACK_FLAG --save-model
$LAUNCH --env-ids $ENVS --seeds $SEEDS --workers "$WORKERS" -- python cleanrl/iqn.py $TRACK_FLAG --save-model
$LAUNCH --env-ids $ENVS --seeds $SEEDS --workers "$WORKERS" -- python benchmark/sb3_baselines.py --algo dqn $TRACK_FLAG
$LAUNCH --env-ids $ENVS --seeds $SEEDS --workers "$WORKERS" -- python benchmark/sb3_baselines.py --algo qrdqn $TRACK_FLAG

EXP_NAMES="dqn_dueling_per sb3_dqn iqn sb3_qrdqn"
python benchmark/report.py --runs-dir runs --env-ids $ENVS --exp-names $EXP_NAMES --name sb3_side_by_side
python benchmark/threshold_table.py --runs-dir runs --env-ids $ENVS --thresholds 475 -100 --exp-names $EXP_NAMES
