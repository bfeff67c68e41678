#!/usr/bin/env bash
# Reproduces the MinAtar tables of docs/minatar.md and the algorithm pages: the five vector scripts on MinAtar's games
# with their MinAtar configurations (each script's MINATAR_DEFAULTS), and SB3's DQN and sb3-contrib's QR-DQN with
# Young & Tian's DQN settings and the same torso (benchmark/sb3_baselines.py). Needs the minatar extra (and sb3 for
# the baselines). The switches (WORKERS, TRACK, SEEDS, LAUNCHER_ARGS, DRY_RUN, ...) are described in
# benchmark/sweep.bash; it has no Atari sweep. SEEDS replaces every sweep's seeds.
#     WORKERS=2 bash benchmark/minatar.sh
set -euo pipefail
source "$(dirname "$0")/sweep.bash"
GAMES="MinAtar/Asterix-v0 MinAtar/Breakout-v0 MinAtar/Freeway-v0 MinAtar/Seaquest-v0 MinAtar/SpaceInvaders-v0"

# Minutes a run, on a 2-core CPU with two runs side by side (docs/minatar.md, Speed): the wall time of the scripts'
# whole MinAtar runs where they have been made (PQN's mean over the games, the dueling DQN's twelve runs on five games
# on an Intel Xeon, 65 to 91 minutes, mean 79, R2D2's 5M-step runs, recurrent IQN's, and SB3's DQN's 302
# minutes on Breakout);
# IQN's from its steady speed on Breakout (279 agent steps/s; its 5M-step Breakout run took 294 minutes), sb3-contrib's
# QR-DQN's (32 quantiles) from its 5M-step Breakout run (471 minutes, 134-226 agent steps/s beside another run).
# --save-model adds the greedy evaluation after training. The dueling DQN's and recurrent IQN's runs take the names the
# kept records (benchmark/episodes/minatar) and the docs' tables carry, dqn_replay_ratio8 and riqn_lr_1e-3 (their
# configurations' replay ratio and learning rate, named before they were the configurations'), so that a new run lands
# in the same report column as the run it reproduces; in the sweeps' records (benchmark/episodes/minatar_sweeps) the
# scripts' own names, dqn_dueling_per and recurrent_iqn, are the earlier configurations.
minatar 40 "$GAMES" "1 2 3" python cleanrl/pqn.py --save-model
minatar 79 "$GAMES" "1 2 3" python cleanrl/dqn_dueling_per.py --save-model --exp-name dqn_replay_ratio8
minatar 300 "$GAMES" "1" python cleanrl/iqn.py --save-model
# R2D2's configuration at its whole budget (5M steps: MINATAR_DEFAULTS), the tables' "the configuration now" rows.
# Nothing in it is scheduled over the budget, so their 2M-step readings come from these runs too. The kept
# "earliest configuration" runs (r2d2, r2d2_5m) were made before its loss summed over the trained steps, with Adam
# epsilon 1e-5, new sequences at the largest priority and 32 sequences a batch: the script no longer runs them. Its
# comparisons with them at 300k and 1M steps (r2d2.md, MinAtar) are in benchmark/r2d2.sh.
minatar 48 "$GAMES" "1 2 3" python cleanrl/r2d2.py --save-model --exp-name r2d2_b8_5m
# Recurrent IQN's configuration at its whole budget (5M steps: MINATAR_DEFAULTS), the tables' "5M" rows.
minatar 103 "$GAMES" "1 2 3" python cleanrl/recurrent_iqn.py --save-model --exp-name riqn_5m
# Its kept 2M-step runs, seeds 1-3 (its page, MinAtar): the same configuration, with its epsilon decaying over the
# first third of the 2M steps (667k, as over the 5M-step configuration's first 2/15) and its learning rate to zero.
minatar 45 "$GAMES" "1 2 3" python cleanrl/recurrent_iqn.py --save-model --total-timesteps 2000000 \
    --exploration-fraction 0.3333 --exp-name riqn_lr_1e-3
minatar 305 "MinAtar/Breakout-v0" "1" python benchmark/sb3_baselines.py --algo dqn
minatar 475 "MinAtar/Breakout-v0" "1" python benchmark/sb3_baselines.py --algo qrdqn

# The kept episode records (benchmark/episodes/minatar) are reported beside the new runs, under the same names, and the
# new runs' records join them.
after python benchmark/report.py --runs-dir runs benchmark/episodes/minatar --env-ids $GAMES --name minatar \
    --exp-names pqn dqn_replay_ratio8 iqn r2d2_b8_5m riqn_5m riqn_lr_1e-3 sb3_dqn sb3_qrdqn \
    --export-episodes benchmark/episodes/minatar

run_sweeps
