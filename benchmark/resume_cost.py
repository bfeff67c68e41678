"""What a resume costs in environment work, both ways, for an Atari script.

envpool cannot save its emulators, so `--resume` rebuilds the envs and steps every logged action again (exact), while
`--resume-fresh-envs` starts new games. Loading the checkpoint costs the same either way and is not timed here. This
builds the envs with the script's own `make_env`, steps random logged actions for a few run lengths, and times a fresh
start; the replay's cost is linear in the run's length, so the rate gives the cost at any step:

    python benchmark/resume_cost.py --script recurrent_iqn_atari --agent-steps 32000 64000 128000
"""

import argparse
import importlib
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cleanrl_q_utils import environments  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", default="recurrent_iqn_atari", help="an Atari script in cleanrl/")
    parser.add_argument("--env-id", default="Breakout-v5")
    parser.add_argument("--agent-steps", type=int, nargs="+", default=[32_000, 64_000, 128_000], help="run lengths")
    parser.add_argument("--at", type=float, default=40e6, help="the step to state the cost at")
    args = parser.parse_args()
    script = importlib.import_module(f"cleanrl.{args.script}")
    defaults = script.Args()
    num_envs = defaults.num_envs
    extra = (defaults.max_episode_steps, not defaults.value_rescaling) if args.script == "recurrent_iqn_atari" else ()

    def make_env():
        return script.make_env(args.env_id, num_envs, 1, *extra)

    rng = np.random.default_rng(0)
    rates = []
    for steps in args.agent_steps:
        envs = make_env()
        envs.reset()
        log = rng.integers(envs.single_action_space.n, size=(steps // num_envs, num_envs))
        start = time.perf_counter()
        for actions in log:
            envs.step(actions)
        seconds = time.perf_counter() - start
        rates.append(log.size / seconds)
        print(f"replay of {log.size} logged agent steps ({num_envs} envs): {seconds:.1f} s, {rates[-1]:,.0f} agent steps/s")
        envs.close()
    start = time.perf_counter()
    envs = environments.FirstStepIsReset(make_env())
    envs.step(np.zeros(num_envs, dtype=np.int64))
    fresh = time.perf_counter() - start
    rate = float(np.median(rates))
    print(f"fresh envs (build, reset, the reset step): {fresh:.2f} s at any step")
    print(f"at step {args.at:,.0f}: replay {args.at / rate / 3600:.1f} h at {rate:,.0f} agent steps/s; fresh {fresh:.2f} s")


if __name__ == "__main__":
    main()
