"""cleanrl_q_utils.checkpoint_files: a checkpoint is read without running code, and one whose contents changed is
refused by its checksum."""

import numpy as np
import pytest
import torch
from toy_run import FORMAT, SCRIPT, Args, start

from cleanrl_q_utils.checkpoint_files import read_checkpoint
from cleanrl_q_utils.command_line import resume


@pytest.fixture(autouse=True)
def in_tmp(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)


class RunsCode:
    """Unpickling this object creates the file `marker`: what a crafted checkpoint could do with any code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("where", ["top", "state", "model", "bare pickle"])
def test_a_file_whose_unpickling_would_run_code_is_refused_without_running_it(tmp_path, where):
    import pickle
    import warnings

    from cleanrl_q_utils.model_files import read_model_file

    marker, path = tmp_path / "ran", str(tmp_path / "evil.pt")
    with start(Args(checkpoint_every=1)) as run:
        good = read_checkpoint(run.save(1, {"x": 1}, learned=()))
    content = {"top": RunsCode(str(marker)), "state": dict(good, state={"x": RunsCode(str(marker))})}.get(where)
    if where == "bare pickle":  # not torch's zip format, and a pickle protocol torch warns about
        with open(path, "wb") as file:
            pickle.dump(RunsCode(str(marker)), file, protocol=4)
    else:
        torch.save(content if where != "model" else {"kind": "cleanrl-q model", "model": RunsCode(str(marker))}, path)
    with (
        warnings.catch_warnings(record=True) as warned,
        pytest.raises(
            SystemExit,
            # a bare pickle is not even read: it is not the zip archive torch.save writes
            match=r"^error: --(resume|model-path)=.*evil.pt: not a readable (checkpoint|model file) "
            r"\((it holds Python |not a zip archive as torch.save writes it)",
        ),
    ):
        warnings.simplefilter("always")
        if where == "model":
            read_model_file(path)
        else:
            resume(Args(resume=path), SCRIPT, FORMAT)
    assert not marker.exists() and [str(warning.message) for warning in warned] == []  # the one line only
    with open(path, "rb") as file:  # the file is not harmless: read unsafely, it runs code
        pickle.load(file) if where == "bare pickle" else torch.load(file, weights_only=False)
    assert marker.exists()


def test_a_checkpoint_with_bytes_flipped_inside_a_tensor_is_refused():
    with start() as run:
        path = run.save(5, {"w": torch.full((64,), 1234.5)}, learned=())
    data = bytearray(open(path, "rb").read())
    at = data.index(np.float32(1234.5).tobytes() * 4)  # inside the tensor's stored values
    data[at + 1] ^= 0xFF
    data[at + 6] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(SystemExit, match="checksum"):
        resume(Args(resume=path), SCRIPT, FORMAT)
