"""cleanrl_q_utils.command_line: --resume reads a checkpoint's flags, lets a given changeable flag win and refuses a
change of another, and stops in one line on a checkpoint of another script or format, or on a path that is no file."""

import os
import sys

import pytest
from toy_run import FORMAT, SCRIPT, Args, start

from cleanrl_q_utils.command_line import resume
from cleanrl_q_utils.training_run import Run


@pytest.fixture(autouse=True)
def in_tmp(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)


def test_resume_keeps_the_checkpoints_flags_unless_given_and_a_given_flag_wins_whatever_its_value(capsys, monkeypatch):
    with start(Args(seed=3, learning_rate=0.5, checkpoint_every=1000, cuda=True)) as run:
        path = run.save(40, {"x": 1}, learned=())
    args, checkpoint = resume(Args(resume=path), SCRIPT, FORMAT)  # as the printed hint runs it
    assert (args.seed, args.learning_rate, args.checkpoint_every, args.resume) == (3, 0.5, 1000, path)
    assert checkpoint["global_step"] == 40 and checkpoint["changed"] == []
    # Given on the command line with the default's value: still given, so it wins over the checkpoint's.
    monkeypatch.setattr(
        sys, "argv", ["toy.py", "--resume", path, "--learning-rate=0.001", "--checkpoint_every", "0", "--no-cuda"]
    )
    args, checkpoint = resume(Args(resume=path), SCRIPT, FORMAT)
    assert (args.learning_rate, args.checkpoint_every, args.cuda) == (1e-3, 0, False)
    assert checkpoint["changed"] == ["--checkpoint-every 1000 -> 0", "--cuda True -> False", "--learning-rate 0.5 -> 0.001"]
    with Run(args, checkpoint, SCRIPT, FORMAT):
        pass
    assert "flags changed on resume: --checkpoint-every 1000 -> 0, --cuda True -> False" in capsys.readouterr().out
    # A flag that cannot change is refused by name, unless given with the checkpoint's own value (as a launcher does).
    monkeypatch.setattr(sys, "argv", ["toy.py", "--resume", path, "--seed", "9"])
    with pytest.raises(SystemExit, match=r"^error: --seed=9: cannot change on resume \(the checkpoint has 3\)"):
        resume(Args(resume=path, seed=9), SCRIPT, FORMAT)
    monkeypatch.setattr(sys, "argv", ["toy.py", "--resume", path, "--seed", "3", "--total-timesteps", "100"])
    assert resume(Args(resume=path, seed=3), SCRIPT, FORMAT)[0].seed == 3
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
        path = run.save(40, {"x": 1}, learned=())
    if content is not None:
        with open(path, "wb") as file:
            file.write(content)
    with pytest.raises(SystemExit, match=message):
        resume(Args(resume=path), script, fmt)
    with pytest.raises(SystemExit, match="--resume=nowhere.pt: no such file"):
        resume(Args(resume="nowhere.pt"), SCRIPT, FORMAT)
    os.makedirs("a_folder")
    with pytest.raises(SystemExit, match="--resume=a_folder: not a file"):
        resume(Args(resume="a_folder"), SCRIPT, FORMAT)
