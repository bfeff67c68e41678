"""A deterministic Ctrl-C for the checkpoint tests: the k-th envs.step call raises SIGINT in this process."""

import signal

import pytest


def interrupt_at_step(monkeypatch, module, k):
    """Wraps the env pools `module.make_env` builds so that the k-th step() call, counted over every pool built
    from now on, raises SIGINT once. Later pools (a resumed run's, which first replays the logged actions)
    count on past k and are never interrupted."""
    make_env, calls = module.make_env, [0]

    class Interrupting:
        def __init__(self, envs):
            self.envs = envs

        def __getattr__(self, name):
            return getattr(self.envs, name)

        def step(self, actions):
            calls[0] += 1
            if calls[0] == k:
                signal.raise_signal(signal.SIGINT)
            return self.envs.step(actions)

    monkeypatch.setattr(module, "make_env", lambda *args, **kwargs: Interrupting(make_env(*args, **kwargs)))


def run_until_stopped(main, args):
    """Runs `main(args)` that a SIGINT stops: the run writes its checkpoint, then ends with SystemExit(128 + SIGINT),
    as on the command line."""
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 128 + signal.SIGINT, stop.value.code
