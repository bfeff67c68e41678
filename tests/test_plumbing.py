"""The shared run plumbing (cleanrl_q_utils/plumbing.py): signals, atomic checkpoints, resume flags, the NaN stop,
the TensorBoard purge step, and in-place restore of a script's checkpoint state."""

import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest
import torch
import torch.nn as nn

from cleanrl_q_utils.plumbing import EpisodeStats, Run, check_flags, fast_forward, resume

FORMAT = 7


@dataclass
class Args:
    exp_name: str = "toy"
    seed: int = 1
    cuda: bool = False
    track: bool = False
    wandb_project_name: str = "cleanrl-q"
    wandb_entity: Optional[str] = None
    env_id: str = "Toy-v0"
    learning_rate: float = 1e-3
    checkpoint_every: int = 0
    resume: Optional[str] = None


SCRIPT = "/somewhere/cleanrl/toy.py"


def start(args=None, checkpoint=None):
    return Run(args or Args(), checkpoint, SCRIPT, FORMAT)


@pytest.fixture(autouse=True)
def in_tmp(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)


def test_first_signal_asks_for_a_checkpointed_stop_and_handlers_are_restored_on_every_exit():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with start() as run:
        assert signal.getsignal(signal.SIGINT) != before[0]
        assert not run.checkpoint_or_stop(10, 10, False, lambda: {"x": 1})
        assert not os.path.exists(run.checkpoint_path)  # --checkpoint-every 0: none without a signal
        signal.raise_signal(signal.SIGTERM)
        assert run.checkpoint_or_stop(20, 10, False, lambda: {"x": 2}) and run.stopped
        assert torch.load(run.checkpoint_path, weights_only=False)["global_step"] == 20
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before

    with pytest.raises(KeyboardInterrupt):  # a second signal exits at once
        with start():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before

    with pytest.raises(SystemExit):  # an error leaving the block restores them too
        with start():
            raise SystemExit("error")
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_signal_arriving_while_a_checkpoint_is_written_is_answered_by_the_next_checkpoint():
    """The stop flag is read once: a signal between the checkpoint test and the stop test must not end the run
    with an older checkpoint than its last step."""

    def state_with_signal():
        signal.raise_signal(signal.SIGINT)
        return {"x": 1}

    with start(Args(checkpoint_every=10)) as run:
        assert not run.checkpoint_or_stop(10, 10, False, state_with_signal)  # due, and the signal comes meanwhile
        assert run.checkpoint_or_stop(15, 5, False, lambda: {"x": 2})
        assert torch.load(run.checkpoint_path, weights_only=False)["global_step"] == 15


@pytest.mark.parametrize(
    "every, steps, expected",
    [(100, [50, 100, 150, 250, 260], [100, 250, 260]), (0, [50, 100], []), (1000, [400, 800], [800])],
)
def test_checkpoints_fall_where_global_step_crosses_a_multiple_of_checkpoint_every_and_at_the_end(every, steps, expected):
    written = []
    with start(Args(checkpoint_every=every)) as run:
        run.save = lambda global_step, state: written.append(global_step)
        for previous, step in zip([0] + steps, steps):
            run.checkpoint_or_stop(step, step - previous, step == steps[-1], dict)
    assert written == expected


def test_a_killed_save_leaves_the_previous_checkpoint_whole(tmp_path):
    """A child process keeps rewriting a large checkpoint and is killed with SIGKILL mid-write: the file left behind
    always loads, whole, as one of the states written."""
    child = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {os.getcwd()!r})
        from cleanrl_q_utils.plumbing import Run
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_plumbing import Args, SCRIPT
        run = Run(Args(), None, SCRIPT, 7)
        big = torch.zeros(20_000_000)
        for i in range(1000):
            big.fill_(i)
            run.save(i, {{"big": big}})
            print(i, flush=True)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, cwd=tmp_path, text=True)
    for _ in range(3):  # killed after a few whole saves, in the middle of a later one
        process.stdout.readline()
    process.kill()
    process.wait()
    (run_dir,) = (tmp_path / "runs").iterdir()
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    big = saved["state"]["big"]
    assert big.numel() == 20_000_000 and bool((big == saved["global_step"]).all())


def test_resume_takes_the_checkpoints_flags_but_the_operational_ones_from_the_command_line(capsys):
    with start(Args(seed=3, learning_rate=0.5)) as run:
        path = run.save(40, {"x": 1})
    given = Args(seed=9, learning_rate=1e-3, checkpoint_every=50, resume=path)  # lr at its default: not reported
    args, checkpoint = resume(given, SCRIPT, FORMAT)
    assert (args.seed, args.learning_rate, args.checkpoint_every, args.resume) == (3, 0.5, 50, path)
    assert checkpoint["global_step"] == 40
    out = capsys.readouterr().out
    assert "--seed=9" in out and "learning-rate" not in out
    assert resume(Args(), SCRIPT, FORMAT) == (Args(), None)


@pytest.mark.parametrize(
    "script, fmt, content, message",
    [
        ("/x/cleanrl/other.py", FORMAT, None, "written by toy.py, not other.py"),
        (SCRIPT, FORMAT + 1, None, "format 7, expected 8"),
        (SCRIPT, FORMAT, b"not a checkpoint", "not a readable checkpoint"),
    ],
)
def test_resume_stops_with_one_clear_line_on_a_foreign_or_broken_checkpoint(script, fmt, content, message):
    with start() as run:
        path = run.save(40, {"x": 1})
    if content is not None:
        with open(path, "wb") as file:
            file.write(content)
    with pytest.raises(SystemExit, match=message):
        resume(Args(resume=path), script, fmt)
    with pytest.raises(SystemExit, match="--resume=nowhere.pt: no such file"):
        resume(Args(resume="nowhere.pt"), SCRIPT, FORMAT)


def test_check_flags_names_the_first_bad_flag():
    with pytest.raises(SystemExit, match=r"^error: --num-envs=0: at least 1$"):
        check_flags([("seed", 1, True, "any"), ("num_envs", 0, False, "at least 1"), ("gamma", 2, False, "in [0, 1]")])


def test_nan_stop_names_the_last_good_checkpoint_and_leaves_the_weights_untouched():
    layer = nn.Linear(3, 2)
    with start() as run:
        (layer(torch.ones(1, 3)).sum() * 2).backward()
        norm = run.clip_grad_norm(layer.parameters(), 1.0, global_step=5)
        assert norm > 1.0 and abs(float(torch.cat([p.grad.flatten() for p in layer.parameters()]).norm()) - 1.0) < 1e-5
        path = run.save(5, {"layer": layer})
        layer.zero_grad()
        (layer(torch.full((1, 3), float("nan"))).sum()).backward()
        with pytest.raises(SystemExit, match=f"non-finite loss or Q-values at step 9; last good checkpoint: {path}"):
            run.clip_grad_norm(layer.parameters(), float("inf"), global_step=9)


def scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir))
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars("x")]


def test_a_resumed_run_keeps_the_checkpoints_step_and_drops_what_the_killed_run_logged_after_it():
    with start() as run:
        for step in range(1, 11):
            run.writer.add_scalar("x", step, step)
            if step == 5:
                path = run.save(step, {})
    args, checkpoint = resume(Args(resume=path), SCRIPT, FORMAT)
    with Run(args, checkpoint, SCRIPT, FORMAT) as run:
        for step in range(6, 9):
            run.writer.add_scalar("x", 100 + step, step)
    assert scalars(run.dir) == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 106), (7, 107), (8, 108)]


def test_restore_loads_every_kind_of_state_in_place_and_the_random_generators_last():
    def make():
        torch.manual_seed(0)
        network = nn.Linear(4, 2)
        stats = EpisodeStats(2)
        state = {
            "network": network,
            "optimizer": torch.optim.Adam(network.parameters()),
            "rng": np.random.default_rng(0),
            "action_log": np.zeros((10, 2), dtype=np.uint8),
            "hidden": torch.zeros(3),
            "losses": [],
            "stats": stats,
            "updates": 0,
        }
        return state

    state = make()
    state["network"](torch.ones(1, 4)).sum().backward()
    state["optimizer"].step()
    state["rng"].random(5)
    state["action_log"][:4] = 3
    state["hidden"] += 2
    state["losses"].append(0.5)
    state["stats"].update(np.array([1.0, 2.0]), np.array([False, False]), np.array([True, False]))
    with start() as run:
        saved_state = dict(state, action_log=state["action_log"][:4], updates=17)
        run.save(4, saved_state)
        expected_random = torch.rand(3)
    args, checkpoint = resume(Args(resume=run.checkpoint_path), SCRIPT, FORMAT)
    fresh = make()
    torch.rand(10)  # the generators move on before the restore
    with Run(args, checkpoint, SCRIPT, FORMAT) as resumed:
        saved = resumed.restore(fresh)
    assert saved["updates"] == 17
    for key in ("network",):
        for a, b in zip(fresh[key].parameters(), state[key].parameters()):
            assert torch.equal(a, b)
    assert fresh["optimizer"].state_dict()["state"][0]["step"] == 1
    assert fresh["rng"].random() == state["rng"].random()
    assert (fresh["action_log"][:4] == 3).all() and (fresh["action_log"][4:] == 0).all()
    assert torch.equal(fresh["hidden"], torch.full((3,), 2.0)) and fresh["losses"] == [0.5]
    assert fresh["stats"].scores == [1.0] and list(fresh["stats"].returns) == [0.0, 2.0]
    assert torch.equal(torch.rand(3), expected_random)  # the global generators continue where the checkpoint was


def test_restore_stops_when_the_checkpoint_holds_other_entries():
    with start() as run:
        path = run.save(4, {"a": 1})
    args, checkpoint = resume(Args(resume=path), SCRIPT, FORMAT)
    with Run(args, checkpoint, SCRIPT, FORMAT) as resumed, pytest.raises(SystemExit, match="holds"):
        resumed.restore({"b": 1})


class CountingEnvs:
    def __init__(self):
        self.position = np.zeros(2, dtype=np.int64)

    def step(self, actions):
        self.position += actions
        return (self.position.copy(),)


def test_fast_forward_replays_the_logged_actions_and_detects_divergence():
    log = np.array([[1, 2], [3, 4]], dtype=np.uint8)
    assert list(fast_forward(CountingEnvs(), log, np.array([4, 6]))) == [4, 6]
    with pytest.raises(SystemExit, match="diverged"):
        fast_forward(CountingEnvs(), log, np.array([4, 7]))


def test_episode_stats_counts_whole_episodes_without_the_reset_step():
    stats = EpisodeStats(2)
    steps = [  # reward, is_reset_step, episode_over
        ([1.0, 1.0], [False, False], [False, False]),
        ([2.0, 1.0], [False, False], [True, False]),
        ([0.0, 5.0], [True, False], [False, True]),
        ([1.0, 0.0], [False, True], [False, False]),
    ]
    finished = [stats.update(np.array(r), np.array(reset), np.array(over)) for r, reset, over in steps]
    assert finished == [[], [(3.0, 2)], [(7.0, 3)], []]
    assert stats.scores == [3.0, 7.0] and list(stats.returns) == [1.0, 0.0] and list(stats.lengths) == [1, 0]
