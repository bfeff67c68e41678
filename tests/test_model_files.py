"""cleanrl_q_utils.model_files: a model file holds the weights of its script's network, and is not taken for a
checkpoint (nor a checkpoint for a model file)."""

import pytest
import torch
import torch.nn as nn
from toy_run import FORMAT, SCRIPT, Args, start

from cleanrl_q_utils.checkpoint_files import read_checkpoint
from cleanrl_q_utils.command_line import resume


@pytest.fixture(autouse=True)
def in_tmp(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)


def test_weights_of_another_network_are_refused_in_one_line(tmp_path):
    from cleanrl_q_utils.model_files import put_weights, read_model_file

    path = str(tmp_path / "other.cleanrl_model")
    torch.save(nn.Linear(3, 2).state_dict(), path)  # bare weights, as an older or another script wrote them
    with pytest.raises(SystemExit, match=r"^error: --model-path=.*other.cleanrl_model: its weights do not fit this script"):
        put_weights(nn.Sequential(nn.Linear(4, 2)), read_model_file(path)["model"], path)


def test_a_model_file_and_a_checkpoint_are_not_taken_for_each_other(tmp_path):
    from cleanrl_q_utils.checkpoint_files import content_digest, to_safe
    from cleanrl_q_utils.model_files import read_model_file, save_weights

    model = str(tmp_path / "toy.cleanrl_model")
    save_weights(model, SCRIPT, Args(), nn.Linear(2, 2).state_dict())
    with pytest.raises(SystemExit, match=r"^error: --resume=.*toy.cleanrl_model: a model file \(--save-model\), not a"):
        resume(Args(resume=model), SCRIPT, FORMAT)
    with start(Args(checkpoint_every=1)) as run:
        path = run.save(3, {"x": 1}, learned=())
    with pytest.raises(SystemExit, match=r"^error: --model-path=.*checkpoint.pt: a checkpoint, not a model file"):
        read_model_file(path)
    # A file crafted with a valid checksum but a flag of the wrong type is refused before anything uses the flag.
    crafted = read_checkpoint(path)
    crafted["args"]["learning_rate"] = "0.1; rm -rf /"
    crafted["digest"] = content_digest({key: value for key, value in crafted.items() if key != "digest"})
    torch.save(to_safe(crafted), path)
    with pytest.raises(
        SystemExit, match=r"^error: --resume=.*: not a readable checkpoint \(ValueError: its flag learning_rate"
    ):
        resume(Args(resume=path), SCRIPT, FORMAT)
