#!/usr/bin/env bash
# Steady-state speed of every Atari script on one machine: each runs Breakout-v5 for SECONDS_PER_RUN seconds with
# learning from step 20k (so most of the window is spent learning), console output kept in LOG_DIR.
# benchmark/steady_sps.py then reads the SPS between the last two progress lines of each log, which leaves
# out start-up and the acting-only warm-up. Atari only, by its purpose; needs a GPU for meaningful numbers:
#     SECONDS_PER_RUN=90 LOG_DIR=speed-logs bash benchmark/atari_speed.sh && python benchmark/steady_sps.py speed-logs/*.log
# DRY_RUN=1 prints the commands and starts nothing, as in the other benchmark scripts (benchmark/sweep.bash).
set -uo pipefail
SECONDS_PER_RUN=${SECONDS_PER_RUN:-90}
LOG_DIR=${LOG_DIR:-speed-logs}
ENV_ID=${ENV_ID:-Breakout-v5}
DRY_RUN=${DRY_RUN:-0}
if ! [[ "$SECONDS_PER_RUN" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: SECONDS_PER_RUN=$SECONDS_PER_RUN: must be a whole number of seconds, at least 1" >&2
    exit 2
fi
RUNS=6
echo "atari_speed.sh: $RUNS runs on $ENV_ID, one at a time, $SECONDS_PER_RUN s each: about" \
    "$(((RUNS * SECONDS_PER_RUN + 59) / 60)) min in all (a time limit, not an estimate); logs in $LOG_DIR/"
run() {  # name, command...
    local name=$1; shift
    echo "== $name: $* --env-id $ENV_ID --no-track"
    if [ "$DRY_RUN" = 1 ]; then return; fi
    PYTHONUNBUFFERED=1 timeout "$SECONDS_PER_RUN" "$@" --env-id "$ENV_ID" --no-track > "$LOG_DIR/$name.log" 2>&1
    tail -n 2 "$LOG_DIR/$name.log"
}
if [ "$DRY_RUN" != 1 ]; then mkdir -p "$LOG_DIR"; fi
run recurrent_iqn_atari python cleanrl/recurrent_iqn_atari.py --learning-starts 20000
run r2d2_atari python cleanrl/r2d2_atari.py --learning-starts 20000
run iqn_atari python cleanrl/iqn_atari.py --learning-starts 20000
run dqn_dueling_per_atari python cleanrl/dqn_dueling_per.py --learning-starts 20000 --total-timesteps 10000000
run pqn_atari_envpool python cleanrl/pqn_atari_envpool.py
run pqn_atari_envpool_lstm python cleanrl/pqn_atari_envpool_lstm.py
exit 0
