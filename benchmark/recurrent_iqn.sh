#!/usr/bin/env bash
# Reproduces the tables of docs/rl-algorithms/recurrent_iqn.md; the switches (WORKERS, TRACK, ATARI, SEEDS,
# ATARI_SEEDS, ATARI_STEPS, LAUNCHER_ARGS, ATARI_LAUNCHER_ARGS, DRY_RUN) are described in benchmark/sweep.bash.
# Classic control only unless ATARI=1:  WORKERS=2 bash benchmark/recurrent_iqn.sh
# ATARI=1 adds Atari-57 with the article's protocol: 50M agent steps (200M frames) per game, then the final policy is
# evaluated on 100 full games at epsilon 0.001 (--save-model). One Atari run needs a GPU, about 14 GB of RAM for the
# replay and several CPU cores for the 32 environments: set ATARI_WORKERS to the number of runs the machine holds.
set -euo pipefail
source "$(dirname "$0")/sweep.bash"

# CartPole with the velocities hidden (the default) and with full observations, 5 seeds (7.1-7.4 min a run,
# recurrent_iqn.md).
classic 7.3 "CartPole-v1" "1 2 3 4 5" python cleanrl/recurrent_iqn.py
classic 7.3 "CartPole-v1" "1 2 3 4 5" python cleanrl/recurrent_iqn.py --no-mask-velocity --exp-name recurrent_iqn_full_obs

# Atari-57; the article ran 55 of them (no Defender, no Surround), envpool provides all 57. One seed per game, as the
# article; about 2,000 agent steps/s on one H100 (recurrent_iqn.md).
GAMES="Alien-v5 Amidar-v5 Assault-v5 Asterix-v5 Asteroids-v5 Atlantis-v5 BankHeist-v5 BattleZone-v5
    BeamRider-v5 Berzerk-v5 Bowling-v5 Boxing-v5 Breakout-v5 Centipede-v5 ChopperCommand-v5 CrazyClimber-v5
    Defender-v5 DemonAttack-v5 DoubleDunk-v5 Enduro-v5 FishingDerby-v5 Freeway-v5 Frostbite-v5 Gopher-v5
    Gravitar-v5 Hero-v5 IceHockey-v5 Jamesbond-v5 Kangaroo-v5 Krull-v5 KungFuMaster-v5 MontezumaRevenge-v5
    MsPacman-v5 NameThisGame-v5 Phoenix-v5 Pitfall-v5 Pong-v5 PrivateEye-v5 Qbert-v5 Riverraid-v5
    RoadRunner-v5 Robotank-v5 Seaquest-v5 Skiing-v5 Solaris-v5 SpaceInvaders-v5 StarGunner-v5 Surround-v5
    Tennis-v5 TimePilot-v5 Tutankham-v5 UpNDown-v5 Venture-v5 VideoPinball-v5 WizardOfWor-v5
    YarsRevenge-v5 Zaxxon-v5"
atari 1991 50000000 "$(echo $GAMES)" "1" python cleanrl/recurrent_iqn_atari.py --save-model --eval-episodes 100

run_sweeps
