#!/usr/bin/env bash
# Reproduces the tables of docs/rl-algorithms/recurrent_iqn.md. WORKERS=2 TRACK=0 bash benchmark/recurrent_iqn.sh runs without W&B.
# ATARI=0 runs only the classic control table (CPU, minutes); ATARI=1 (default) also runs Atari-57 with the
# article's protocol: 50M agent steps (200M frames) per game, then the final policy is evaluated on 100 full
# games at epsilon 0.001 (--save-model). One Atari run needs a GPU, about 14 GB of RAM for the replay and
# several CPU cores for the 32 environments: set WORKERS to the number of runs the machine holds at once.
set -euo pipefail
WORKERS=${WORKERS:-2}
SEEDS=${SEEDS:-"1 2 3 4 5"}
ATARI_SEEDS=${ATARI_SEEDS:-"1"}  # the article reports one run per game
if [ "${TRACK:-1}" = 1 ]; then TRACK_FLAG="--track --wandb-project-name cleanrl-q"; else TRACK_FLAG="--no-track"; fi
# LAUNCHER_ARGS go to every launch.py call, e.g. LAUNCHER_ARGS="--backend ray --ray-address auto", ATARI_LAUNCHER_ARGS
# only to the Atari ones, e.g. ATARI_LAUNCHER_ARGS="--gpus-per-run 1 --cpus-per-run 8 --mem-gb 12" (docs/cluster.md);
# with --track the runs form the W&B group recurrent_iqn.
LAUNCH="python benchmark/launch.py --wandb-group recurrent_iqn ${LAUNCHER_ARGS:-}"

# recurrent_iqn.py: CartPole with the velocities hidden (the default) and with full observations.
$LAUNCH --env-ids CartPole-v1 --seeds $SEEDS --workers "$WORKERS" -- \
    python cleanrl/recurrent_iqn.py $TRACK_FLAG
$LAUNCH --env-ids CartPole-v1 --seeds $SEEDS --workers "$WORKERS" -- \
    python cleanrl/recurrent_iqn.py $TRACK_FLAG --no-mask-velocity --exp-name recurrent_iqn_full_obs

if [ "${ATARI:-1}" = 1 ]; then
    # Atari-57; the article ran 55 of them (no Defender, no Surround), envpool provides all 57.
    GAMES="Alien-v5 Amidar-v5 Assault-v5 Asterix-v5 Asteroids-v5 Atlantis-v5 BankHeist-v5 BattleZone-v5
        BeamRider-v5 Berzerk-v5 Bowling-v5 Boxing-v5 Breakout-v5 Centipede-v5 ChopperCommand-v5 CrazyClimber-v5
        Defender-v5 DemonAttack-v5 DoubleDunk-v5 Enduro-v5 FishingDerby-v5 Freeway-v5 Frostbite-v5 Gopher-v5
        Gravitar-v5 Hero-v5 IceHockey-v5 Jamesbond-v5 Kangaroo-v5 Krull-v5 KungFuMaster-v5 MontezumaRevenge-v5
        MsPacman-v5 NameThisGame-v5 Phoenix-v5 Pitfall-v5 Pong-v5 PrivateEye-v5 Qbert-v5 Riverraid-v5
        RoadRunner-v5 Robotank-v5 Seaquest-v5 Skiing-v5 Solaris-v5 SpaceInvaders-v5 StarGunner-v5 Surround-v5
        Tennis-v5 TimePilot-v5 Tutankham-v5 UpNDown-v5 Venture-v5 VideoPinball-v5 WizardOfWor-v5
        YarsRevenge-v5 Zaxxon-v5"
    $LAUNCH ${ATARI_LAUNCHER_ARGS:-} --env-ids $GAMES --seeds $ATARI_SEEDS --workers "$WORKERS" -- \
        python cleanrl/recurrent_iqn_atari.py $TRACK_FLAG --save-model --eval-episodes 100
fi
