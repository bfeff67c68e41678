# The switches and the plan shared by every benchmark/<algo>.sh (sourced, not run). Each script lists its sweeps with
# `classic`, `minatar` and `atari`, then calls `run_sweeps`, which prints what will run (runs and an estimated time)
# and runs it.
#
# Switches (environment variables), the same in every script:
#   WORKERS=2            local backend: runs at a time (the Atari sweeps use ATARI_WORKERS, default 1: one GPU)
#   TRACK=0              1: also log to W&B (project cleanrl-q, group: the script's name); 0: TensorBoard logs only
#   ATARI=0              1: also run the Atari sweeps (a GPU and several GB of RAM per run)
#   SEEDS="1 2 3"        seeds of every classic-control and MinAtar sweep (default: the seeds of the docs' tables)
#   ATARI_SEEDS="1 2 3"  seeds of every Atari sweep (default: the script's)
#   ATARI_STEPS=N        agent steps of every Atari run (default: the script's)
#   LAUNCHER_ARGS        added to every launch.py call, e.g. "--backend ray --ray-address auto" (docs/cluster.md)
#   ATARI_LAUNCHER_ARGS  added to the Atari launches only, e.g. "--gpus-per-run 1 --cpus-per-run 8 --mem-gb 12"
#   DRY_RUN=1            print the plan and every run's command, start nothing (launch.py --dry-run)
#
# The estimated times are estimates: minutes per run measured on a 2-core CPU for the classic-control runs, and the
# documented steady agent steps per second on one GPU for the Atari ones (the docs pages give both); a busy machine,
# or WORKERS runs sharing few cores, takes longer.

WORKERS=${WORKERS:-2}
ATARI_WORKERS=${ATARI_WORKERS:-1}
TRACK=${TRACK:-0}
ATARI=${ATARI:-0}
DRY_RUN=${DRY_RUN:-0}
for switch in TRACK ATARI DRY_RUN; do
    if [ "${!switch}" != 0 ] && [ "${!switch}" != 1 ]; then
        echo "error: $switch=${!switch}: must be 0 or 1" >&2
        exit 2
    fi
done
for count in WORKERS ATARI_WORKERS; do
    if ! [[ "${!count}" =~ ^[1-9][0-9]*$ ]]; then
        echo "error: $count=${!count}: must be a whole number of at least 1" >&2
        exit 2
    fi
done
if [ -n "${ATARI_STEPS:-}" ] && ! [[ "$ATARI_STEPS" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: ATARI_STEPS=$ATARI_STEPS: must be a whole number of at least 1" >&2
    exit 2
fi
if [ "$TRACK" = 1 ]; then TRACK_FLAG="--track --wandb-project-name cleanrl-q"; else TRACK_FLAG="--no-track"; fi
SCRIPT_NAME=$(basename "$0" .sh)

PLAN_LINES=()     # what run_sweeps prints
LAUNCHES=()       # one launch.py command line each
SKIPPED_LINES=()  # the Atari sweeps that ATARI=1 would add
AFTER=()          # commands run once every launch is done (speed checks, tables)
TOTAL_RUNS=0
TOTAL_MINUTES=0

words() { echo $#; }

# minutes of a run at SPS agent steps per second
minutes_at() { awk -v steps="$1" -v sps="$2" 'BEGIN { printf "%.1f", steps / sps / 60 }'; }

# "12 min", "3.5 h" or "2.1 days"
duration() {
    awk -v m="$1" 'BEGIN { if (m < 10) printf "%.1f min", m; else if (m < 90) printf "%.0f min", m; else if (m < 2880) printf "%.1f h", m / 60;
                           else printf "%.1f days", m / 1440 }'
}

add_sweep() {  # kind, minutes per run, workers, env ids, seeds, launcher options, command...
    local kind=$1 minutes=$2 workers=$3 env_ids=$4 seeds=$5 options=$6
    shift 6
    local runs=$(($(words $env_ids) * $(words $seeds)))
    local rounds=$(((runs + workers - 1) / workers))
    local wall
    wall=$(awk -v r="$rounds" -v m="$minutes" 'BEGIN { print r * m }')
    local shown=$env_ids
    if [ "$(words $env_ids)" -gt 6 ]; then shown="$(words $env_ids) env ids: $(echo $env_ids | cut -d' ' -f1-3) ..."; fi
    local line
    local noun=runs
    if [ "$runs" = 1 ]; then noun="run "; fi
    line="$(printf '  %-7s %3d %s (%s x seeds %s), about %s each, %s at a time: about %s in all\n            %s' "$kind" \
        "$runs" "$noun" "$shown" "$seeds" "$(duration "$minutes")" "$workers" "$(duration "$wall")" "$*")"
    if [ "$kind" = atari ] && [ "$ATARI" != 1 ]; then
        SKIPPED_LINES+=("$line")
        return
    fi
    PLAN_LINES+=("$line")
    TOTAL_RUNS=$((TOTAL_RUNS + runs))
    TOTAL_MINUTES=$(awk -v t="$TOTAL_MINUTES" -v w="$wall" 'BEGIN { print t + w }')
    local dry=""
    if [ "$DRY_RUN" = 1 ]; then dry="--dry-run"; fi
    LAUNCHES+=("python benchmark/launch.py --wandb-group $SCRIPT_NAME ${LAUNCHER_ARGS:-} $options $dry --env-ids $env_ids --seeds $seeds --workers $workers -- $* $TRACK_FLAG")
}

# classic MINUTES_PER_RUN "ENV_IDS" "DEFAULT_SEEDS" command...: a classic-control sweep (SEEDS replaces the seeds)
classic() {
    local minutes=$1 env_ids=$2 seeds=${SEEDS:-$3}
    shift 3
    add_sweep classic "$minutes" "$WORKERS" "$env_ids" "$seeds" "" "$@"
}

# minatar MINUTES_PER_RUN "ENV_IDS" "DEFAULT_SEEDS" command...: a MinAtar sweep, on the CPU like classic control (SEEDS
# replaces the seeds; the minatar extra)
minatar() {
    local minutes=$1 env_ids=$2 seeds=${SEEDS:-$3}
    shift 3
    add_sweep minatar "$minutes" "$WORKERS" "$env_ids" "$seeds" "" "$@"
}

# atari SPS DEFAULT_STEPS "ENV_IDS" "DEFAULT_SEEDS" command...: an Atari sweep, only with ATARI=1; SPS (agent steps per
# second on one GPU, from the docs) gives the estimate; ATARI_STEPS and ATARI_SEEDS replace the steps and seeds
atari() {
    local sps=$1 steps=${ATARI_STEPS:-$2} env_ids=$3 seeds=${ATARI_SEEDS:-$4}
    shift 4
    local minutes
    minutes=$(minutes_at "$steps" "$sps")
    add_sweep atari "$minutes" "$ATARI_WORKERS" "$env_ids" "$seeds" "${ATARI_LAUNCHER_ARGS:-}" "$@" --total-timesteps "$steps"
}

# after command...: run once every launch is done (not with DRY_RUN=1)
after() {
    AFTER+=("$*")
}

run_sweeps() {
    local backend="local backend, WORKERS=$WORKERS"
    if [[ " ${LAUNCHER_ARGS:-} " == *" --backend "* ]] && [[ " ${LAUNCHER_ARGS:-} " != *" --backend local "* ]]; then
        backend="a cluster runs them as its resources allow; the time below assumes the local backend"
    fi
    echo "$SCRIPT_NAME.sh: $TOTAL_RUNS runs in ${#LAUNCHES[@]} launches, estimated time about $(duration "$TOTAL_MINUTES") ($backend;" \
        "TRACK=$TRACK, ATARI=$ATARI)"
    printf '%s\n' "${PLAN_LINES[@]}"
    for line in "${AFTER[@]}"; do echo "  then: $line"; done
    if [ ${#SKIPPED_LINES[@]} -gt 0 ]; then
        echo "Atari sweeps left out (ATARI=1 adds them; the time is on one GPU):"
        printf '%s\n' "${SKIPPED_LINES[@]}"
    fi
    echo "(estimates from the timings in the docs pages; a busy machine takes longer)"
    local status=0 launched
    for launch in "${LAUNCHES[@]}"; do
        launched=0
        $launch || launched=$?
        if [ "$launched" = 2 ]; then exit 2; fi  # could not start: a bad flag, nothing else would start either
        if [ "$launched" != 0 ]; then status=1; fi
    done
    if [ "$DRY_RUN" = 1 ]; then return 0; fi
    for command in "${AFTER[@]}"; do
        $command || status=1
    done
    if [ "$status" != 0 ]; then echo "$SCRIPT_NAME.sh: some runs failed (see each launch's summary above)"; fi
    return "$status"
}
