#!/usr/bin/env bash
# Steady-state speed of the five vector scripts on a MinAtar game, on the CPU with one PyTorch thread each (the scripts
# set it): each runs ENV_ID with its MinAtar configuration for SECONDS_PER_RUN seconds, one at a time, console output
# kept in LOG_DIR; benchmark/steady_sps.py then reads the speed between the last two progress lines of each log (after
# the replay scripts' 5,000 acting-only steps). Needs the minatar extra:
#     SECONDS_PER_RUN=120 LOG_DIR=speed-logs bash benchmark/minatar_speed.sh && python benchmark/steady_sps.py speed-logs/*.log
# DRY_RUN=1 prints the commands and starts nothing, as in the other benchmark scripts (benchmark/sweep.bash).
set -uo pipefail
SECONDS_PER_RUN=${SECONDS_PER_RUN:-120}
LOG_DIR=${LOG_DIR:-speed-logs}
ENV_ID=${ENV_ID:-MinAtar/Breakout-v0}
DRY_RUN=${DRY_RUN:-0}
if ! [[ "$SECONDS_PER_RUN" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: SECONDS_PER_RUN=$SECONDS_PER_RUN: must be a whole number of seconds, at least 1" >&2
    exit 2
fi
RUNS=5
echo "minatar_speed.sh: $RUNS runs on $ENV_ID, one at a time, $SECONDS_PER_RUN s each: about" \
    "$(((RUNS * SECONDS_PER_RUN + 59) / 60)) min in all (a time limit, not an estimate); logs in $LOG_DIR/"
run() {  # name, command...
    local name=$1; shift
    echo "== $name: $* --env-id $ENV_ID --no-track"
    if [ "$DRY_RUN" = 1 ]; then return; fi
    PYTHONUNBUFFERED=1 timeout "$SECONDS_PER_RUN" "$@" --env-id "$ENV_ID" --no-track > "$LOG_DIR/$name.log" 2>&1
    tail -n 2 "$LOG_DIR/$name.log"
}
if [ "$DRY_RUN" != 1 ]; then mkdir -p "$LOG_DIR"; fi
run pqn python cleanrl/pqn.py
run dqn_dueling_per python cleanrl/dqn_dueling_per.py
run iqn python cleanrl/iqn.py
run r2d2 python cleanrl/r2d2.py
run recurrent_iqn python cleanrl/recurrent_iqn.py
exit 0
