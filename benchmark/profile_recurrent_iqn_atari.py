"""Where the time of recurrent_iqn_atari.py goes: wraps the environment step, acting, replay writes and
samples, and the learner update with wall-clock timers, runs a short training, and prints the breakdown.

    python benchmark/profile_recurrent_iqn_atari.py --total-timesteps 100000 --learning-starts 20000

The learner update is timed with a CUDA synchronization before and after it, so on a GPU its row is the
update's real cost, and the other rows do not absorb it. Any flag of the script can be given.
"""

import collections
import sys
import time
from pathlib import Path

import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cleanrl.recurrent_iqn_atari as riqn  # noqa: E402

seconds, calls = collections.defaultdict(float), collections.Counter()


def timed(name, fn, synchronize=False):
    def wrapper(*args, **kwargs):
        if synchronize and torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        if synchronize and torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds[name] += time.perf_counter() - start
        calls[name] += 1
        return result

    return wrapper


class TimedPool:
    def __init__(self, envs):
        self.envs = envs
        self.step = timed("env.step", envs.step)

    def __getattr__(self, name):
        return getattr(self.envs, name)


if __name__ == "__main__":
    args = tyro.cli(riqn.Args)
    make_env = riqn.make_env
    riqn.make_env = lambda *a, **k: TimedPool(make_env(*a, **k))
    riqn.Agent.act = timed("agent.act", riqn.Agent.act)
    riqn.SequenceReplay.add = timed("replay.add", riqn.SequenceReplay.add)
    riqn.SequenceReplay.sample = timed("replay.sample", riqn.SequenceReplay.sample)
    riqn.train_step = timed("train_step (synchronized)", riqn.train_step, synchronize=True)
    start = time.time()
    riqn.main(args)
    print(f"wall {time.time() - start:.1f} s")
    for name, total in sorted(seconds.items(), key=lambda item: -item[1]):
        print(f"{name:28s} {total:8.2f} s {calls[name]:8d} calls {1000 * total / calls[name]:9.3f} ms/call")
