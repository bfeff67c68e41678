#!/usr/bin/env bash
# Steady-state speed of every Atari script on one machine: each runs Breakout-v5 for SECONDS seconds with
# learning from step 20k (so most of the window is spent learning), console output kept in LOG_DIR.
# benchmark/steady_sps.py then reads the SPS between the last two progress lines of each log, which leaves
# out start-up and the acting-only warm-up. Needs a GPU for meaningful numbers:
#     SECONDS_PER_RUN=90 LOG_DIR=speed-logs bash benchmark/atari_speed.sh && python benchmark/steady_sps.py speed-logs/*.log
set -uo pipefail
SECONDS_PER_RUN=${SECONDS_PER_RUN:-90}
LOG_DIR=${LOG_DIR:-speed-logs}
ENV_ID=${ENV_ID:-Breakout-v5}
mkdir -p "$LOG_DIR"
run() {  # name, command...
    local name=$1; shift
    echo "== $name: $*"
    PYTHONUNBUFFERED=1 timeout "$SECONDS_PER_RUN" "$@" --env-id "$ENV_ID" --no-track > "$LOG_DIR/$name.log" 2>&1
    tail -n 2 "$LOG_DIR/$name.log"
}
run recurrent_iqn_atari python cleanrl/recurrent_iqn_atari.py --learning-starts 20000
run r2d2_atari python cleanrl/r2d2_atari.py --learning-starts 20000
run iqn_atari python cleanrl/iqn_atari.py --learning-starts 20000
run dqn_dueling_per_atari python cleanrl/dqn_dueling_per.py --learning-starts 20000 --total-timesteps 10000000
run pqn_atari_envpool python cleanrl/pqn_atari_envpool.py
run pqn_atari_envpool_lstm python cleanrl/pqn_atari_envpool_lstm.py
exit 0
