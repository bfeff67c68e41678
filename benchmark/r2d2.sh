#!/usr/bin/env bash
# Reproduces the tables of docs/rl-algorithms/r2d2.md; the switches (WORKERS, TRACK, ATARI, SEEDS, ATARI_SEEDS,
# ATARI_STEPS, LAUNCHER_ARGS, ATARI_LAUNCHER_ARGS, DRY_RUN) are described in benchmark/sweep.bash. Classic control
# only unless ATARI=1:  WORKERS=2 bash benchmark/r2d2.sh
set -euo pipefail
source "$(dirname "$0")/sweep.bash"

# CartPole-v1 with full observations (100k steps, 1.4-1.6 min a run) and with the velocities hidden (300k steps,
# about 8 min a run alone; r2d2.md).
classic 1.5 "CartPole-v1" "1 2 3" \
    python cleanrl/r2d2.py --total-timesteps 100000 --replay-ratio 8 --buffer-size 100000
classic 8 "CartPole-v1" "1 2 3 4 5" python cleanrl/r2d2.py --mask-velocity --exp-name r2d2_mask_velocity

# MinAtar (the minatar extra): the summed loss and new sequences' own priorities against the kept r2d2 runs, which
# averaged the loss and gave new sequences the largest priority, at 300k and 1M agent steps (r2d2.md, MinAtar; the
# records are in benchmark/episodes/minatar_r2d2_sum_loss), with the 32 sequences a batch the configuration had then.
minatar 5 "MinAtar/Breakout-v0 MinAtar/Seaquest-v0" "1 2 3" python cleanrl/r2d2.py --total-timesteps 300000 \
    --batch-size 32 --target-update-period 100 --exp-name r2d2_sum_loss
minatar 10 "MinAtar/Breakout-v0 MinAtar/Seaquest-v0" "1 2 3" python cleanrl/r2d2.py --total-timesteps 1000000 \
    --batch-size 32 --target-update-period 100 --exp-name r2d2_sum_loss_1m
# Eight sequences a batch (the configuration now) against 32 on Asterix, Seaquest and Breakout at 1M agent steps, and
# on Asterix the target's cadence alone (r2d2.md and minatar.md, MinAtar; the records are in
# benchmark/episodes/minatar_recurrent_probes; Seaquest's and Breakout's runs with 32 are the r2d2_sum_loss_1m above).
minatar 12 "MinAtar/Asterix-v0 MinAtar/Seaquest-v0 MinAtar/Breakout-v0" "1 2 3" python cleanrl/r2d2.py \
    --total-timesteps 1000000 --batch-size 8 --target-update-period 400 --exp-name r2d2_b8_t400
minatar 9 "MinAtar/Asterix-v0" "1 2 3" python cleanrl/r2d2.py --total-timesteps 1000000 --batch-size 32 \
    --target-update-period 100 --exp-name r2d2_batch32
minatar 9 "MinAtar/Asterix-v0" "1 2" python cleanrl/r2d2.py --total-timesteps 1000000 --batch-size 32 \
    --target-update-period 25 --exp-name r2d2_t25
minatar 12 "MinAtar/Asterix-v0" "1" python cleanrl/r2d2.py --total-timesteps 1000000 --batch-size 8 \
    --target-update-period 100 --exp-name r2d2_b8

# Atari (not in the docs' tables yet; about 8 GB of RAM per run for the replay), default 10M agent steps; 1,875 agent
# steps/s on one GPU, measured with the earlier sequence layout (r2d2.md).
atari 1875 10000000 "Breakout-v5 Pong-v5" "1 2 3" python cleanrl/r2d2_atari.py

run_sweeps
