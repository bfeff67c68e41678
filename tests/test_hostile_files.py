"""Files a run loads (checkpoints for --resume, model files for --eval-only, the checkpoint already in a run folder)
that were damaged or crafted: a decompression bomb, a pickle that would allocate or run code, NaN weights under a
valid checksum, a header of the wrong shape. Each is refused in one line, with a non-zero exit, before anything is
built, within small memory; and a learning rate changed on resume stays with the run."""

import os
import pickle
import re
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import pytest
import torch

from cleanrl import dqn_dueling_per, pqn
from cleanrl_q_utils import checkpoint_files
from cleanrl_q_utils.checkpoint_files import content_digest, read_checkpoint, to_safe
from cleanrl_q_utils.model_files import read_model_file

from helpers import REPO, run_dir_of
from interrupts import interrupt_at_step, run_until_stopped
from tiny import tiny

ONE_LINE = r"^error: --(resume|model-path)=[^\n]*$"


def zip_bytes(records: list[tuple[str, int, bytes, int]]) -> bytes:
    """A zip archive of `records` (name, method, payload as stored, size it declares uncompressed), written by hand so
    that a record may declare any size (a stored record declares it stored too). CRCs are left 0: a reader that checks
    them has already read the record."""
    body, directory = bytearray(), bytearray()
    for name, method, payload, size in records:
        offset, encoded, stored = len(body), name.encode(), size if method == 0 else len(payload)
        body += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, method, 0, 33, 0, stored, size, len(encoded), 0)
        body += encoded + payload
        version_time_crc = (20, 20, 0, method, 0, 33, 0)  # made by, needed, flags, method, time, date, CRC
        lengths_and_offset = (stored, size, len(encoded), 0, 0, 0, 0, 0, offset)
        directory += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", *version_time_crc, *lengths_and_offset)
        directory += encoded
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(records), len(records), len(directory), len(body), 0)
    return bytes(body + directory + end)


def zeros_deflated(chunks: int) -> bytes:
    """A raw deflate stream of `chunks` x 64 MiB of zeros, about 64 KB each: one chunk compressed with a full flush
    (which resets the compressor's history) repeated, then the final block; built in a fraction of a second."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = compressor.compress(bytes(64 << 20)) + compressor.flush(zlib.Z_FULL_FLUSH)
    return chunk * chunks + compressor.flush()


def records_of(path) -> list[tuple[str, int, bytes, int]]:
    with zipfile.ZipFile(path) as archive:
        return [(info.filename, 0, archive.read(info), info.file_size) for info in archive.infolist()]


def bomb(valid, out, chunks: int, record: str = "/data/0") -> Path:
    """`valid` (a file torch.save wrote) rewritten with its record ending in `record` deflated, declaring `chunks` x
    64 MiB: what torch's reader would inflate in full before noticing that the size is not the tensor's."""
    records = [
        (name, 8, zeros_deflated(chunks), chunks << 26) if name.endswith(record) else (name, method, payload, size)
        for name, method, payload, size in records_of(valid)
    ]
    Path(out).write_bytes(zip_bytes(records))
    return Path(out)


def rewritten(path, change) -> None:
    """Rewrites the checkpoint at `path` with `change(checkpoint)` applied and its checksum made valid again."""
    checkpoint = read_checkpoint(str(path))
    change(checkpoint)
    checkpoint["digest"] = content_digest({key: value for key, value in checkpoint.items() if key != "digest"})
    torch.save(to_safe(checkpoint), path)


@pytest.fixture(scope="module")
def pqn_files(tmp_path_factory):
    """(checkpoint, model file) of a short finished pqn run, which the tests copy and spoil."""
    folder = tmp_path_factory.mktemp("pqn")
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        pqn.main(pqn.Args(**tiny("pqn", total_timesteps=256, checkpoint_every=128, save_model=True, eval_episodes=1)))
    finally:
        os.chdir(cwd)
    run = run_dir_of(folder)
    return run / "checkpoint.pt", run / "pqn.cleanrl_model"


@pytest.fixture
def copies(pqn_files, tmp_path, monkeypatch):
    """Copies of the pqn files in an empty working directory, where a run that went ahead would make runs/."""
    monkeypatch.chdir(tmp_path)
    checkpoint, model = tmp_path / "checkpoint.pt", tmp_path / "pqn.cleanrl_model"
    checkpoint.write_bytes(pqn_files[0].read_bytes())
    model.write_bytes(pqn_files[1].read_bytes())
    return checkpoint, model


def refused(main, args) -> str:
    """The one line with which `main(args)` stops; fails unless it is one `error: --flag=...` line and nothing was
    made in the working directory."""
    with pytest.raises(SystemExit) as stop:
        main(args)
    message = str(stop.value.code)
    assert re.match(ONE_LINE, message), message
    assert not Path("runs").exists() and not Path("videos").exists()
    return message


# -- decompression bombs and other zip archives that torch.save does not write --------------------------------------


@pytest.mark.parametrize("path", ["resume", "eval-only"])
def test_a_decompression_bomb_is_refused_in_one_line_within_small_memory(path, pqn_files, tmp_path):
    valid = pqn_files[0] if path == "resume" else pqn_files[1]
    file = bomb(valid, tmp_path / "bomb.pt", chunks=32)  # 2 MB declaring 2.1 GB of zeros
    assert file.stat().st_size < 3 << 20
    flags = ["--resume", str(file)] if path == "resume" else ["--eval-only", "--model-path", str(file)]
    status, stderr, peak = measured_run("pqn.py", *flags, cwd=tmp_path)
    assert status != 0
    assert re.match(ONE_LINE, stderr.strip()), stderr
    assert re.search(
        rf"is compressed \({file.stat().st_size // 10**6},\d{{3}},\d{{3}} bytes declaring {32 << 26:,} bytes\)", stderr
    )
    assert peak < 1 << 30, f"peak memory {peak / 2**30:.2f} GiB: the record was inflated"
    assert not (tmp_path / "runs").exists()


def measured_run(script: str, *flags: str, cwd: Path) -> tuple[int, str, int]:
    """(exit status, stderr, peak resident memory in bytes) of `python cleanrl/<script> FLAGS` in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    command = [sys.executable, "-c", PEAK_OF_CHILD, sys.executable, str(REPO / "cleanrl" / script), *flags]
    done = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    status, peak = done.stdout.decode().split()
    return int(status), done.stderr.decode(), int(peak)


# Linux carries a process's peak memory across fork and exec, so a script started by pytest itself would report at
# least pytest's own peak (over 1 GiB late in the whole suite). A small Python process starts it instead and prints
# its exit status and its own peak (wait4: that child's, not the maximum over all children).
PEAK_OF_CHILD = """
import os, subprocess, sys
process = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(process.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024)
"""


@pytest.mark.parametrize("record", ["/data/0", "/data.pkl"])
def test_compressed_records_are_refused_by_every_load_before_inflating(record, copies, tmp_path):
    checkpoint, model = copies
    small = 4  # 256 MiB declared: enough to be seen if it were inflated, harmless if it were
    bomb(checkpoint, checkpoint, small, record)
    bomb(model, model, small, record)
    assert "compressed" in refused(pqn.main, pqn.Args(resume=str(checkpoint)))
    assert "compressed" in refused(pqn.main, pqn.Args(eval_only=True, model_path=str(model)))


def test_a_replay_script_refuses_a_bomb_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    valid = tmp_path / "valid.pt"
    torch.save({"format": 2, "state": {"x": torch.zeros(4)}}, valid)
    file = bomb(valid, tmp_path / "bomb.pt", chunks=4)
    assert "compressed" in refused(dqn_dueling_per.main, dqn_dueling_per.Args(resume=str(file)))


def crafted_zip(kind: str, valid: Path) -> bytes:
    """A zip archive of the records of `valid` that torch's reader would accept and that torch.save never writes."""
    records = records_of(valid)
    if kind == "a size beyond the file":
        return zip_bytes([(n, m, p, (1 << 31) if n.endswith("/data/0") else s) for n, m, p, s in records])
    data = zip_bytes(records)
    if kind == "data before the archive":
        return b"\0" * 64 + data
    # Two directory entries that name the same stored bytes: read twice, a record could be read many times over.
    directory_start = struct.unpack("<I", data[-6:-2])[0]
    first_entry_end = directory_start + 46 + struct.unpack("<H", data[directory_start + 28 : directory_start + 30])[0]
    entry = bytearray(data[directory_start:first_entry_end])
    entry[46:] = b"x/other"
    entry[28:30] = struct.pack("<H", len(b"x/other"))
    directory = data[directory_start:-22] + bytes(entry)
    count = len(records) + 1
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count, len(directory), directory_start, 0)
    return data[:directory_start] + directory + end


EXPECTED = {
    "a size beyond the file": "declares more bytes than the file holds",
    "data before the archive": "data before its first record",
    "two entries for one record": "overlaps another record",
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_zip_archives_torch_save_does_not_write_are_refused(kind, copies):
    checkpoint, model = copies
    checkpoint.write_bytes(crafted_zip(kind, checkpoint))
    model.write_bytes(crafted_zip(kind, model))
    for message in (
        refused(pqn.main, pqn.Args(resume=str(checkpoint))),
        refused(pqn.main, pqn.Args(eval_only=True, model_path=str(model))),
    ):
        assert "not a readable" in message and EXPECTED[kind] in message


def test_a_file_larger_than_the_memory_available_is_refused(copies, monkeypatch):
    checkpoint, model = copies
    monkeypatch.setattr(checkpoint_files, "available_memory_bytes", lambda: 1000)
    assert "more than the 0.0 GB of memory available" in refused(pqn.main, pqn.Args(resume=str(checkpoint)))
    message = refused(pqn.main, pqn.Args(eval_only=True, model_path=str(model)))
    assert "of memory available" in message


class Amplifies:
    """Pickles as a call torch's weights-only unpickler allows and that copies a tensor into a new dtype: referenced
    many times in one file, a few bytes each, it would allocate a copy at each reference."""

    def __reduce__(self):
        return torch._utils._rebuild_device_tensor_from_cpu_tensor, (
            torch.zeros(1000, dtype=torch.uint8),
            torch.float64,
            "cpu",
            False,
        )


def test_a_pickle_naming_a_copying_rebuild_is_refused_before_loading(copies):
    checkpoint, model = copies
    torch.save({"kind": "cleanrl-q model", "model": {"w": Amplifies()}}, model)
    message = refused(pqn.main, pqn.Args(eval_only=True, model_path=str(model)))
    assert "_rebuild_device_tensor_from_cpu_tensor" in message
    torch.save([Amplifies()] * 3, checkpoint)
    assert "_rebuild_device_tensor_from_cpu_tensor" in refused(pqn.main, pqn.Args(resume=str(checkpoint)))


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("where", ["resume", "eval-only", "the run folder's checkpoint"])
def test_a_planted_pickle_is_refused_by_every_load_without_running(where, copies, tmp_path):
    checkpoint, model = copies
    marker = tmp_path / "ran"
    planted = {"global_step": 10**9, "run_name": "x", "payload": RunsCode(str(marker))}
    if where == "resume":
        torch.save(planted, checkpoint)
        assert "Python objects" in refused(pqn.main, pqn.Args(resume=str(checkpoint)))
    elif where == "eval-only":
        torch.save({"kind": "cleanrl-q model", "model": RunsCode(str(marker))}, model)
        assert "Python objects" in refused(pqn.main, pqn.Args(eval_only=True, model_path=str(model)))
    else:  # a resume that would write over the checkpoint in its run's folder reads that file first
        run_name = read_checkpoint(str(checkpoint))["run_name"]
        (tmp_path / "runs" / run_name).mkdir(parents=True)
        torch.save(planted, tmp_path / "runs" / run_name / "checkpoint.pt")
        with pytest.raises(SystemExit, match="is not a checkpoint of this run"):
            pqn.main(pqn.Args(resume=str(checkpoint)))
    assert not marker.exists()
    planted_path = dict(resume=checkpoint, eval_only=model).get(where.replace("-", "_"))
    with open(planted_path or tmp_path / "runs" / run_name / "checkpoint.pt", "rb") as file:
        torch.load(file, weights_only=False)  # the file is not harmless: read unsafely, it runs code
    assert marker.exists()


# -- NaN or inf in the learned state -----------------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["q_network", "optimizer"])
def test_a_checkpoint_with_nan_weights_or_moments_is_refused_before_anything_is_built(entry, copies, monkeypatch):
    checkpoint, _ = copies
    monkeypatch.setattr(pqn, "make_env", lambda *a, **k: pytest.fail("an env was built"))

    def spoil(saved):
        state = saved["state"][entry]
        name = next(name for name, value in state.items() if isinstance(value, torch.Tensor) and value.is_floating_point())
        state[name] = state[name].clone().fill_(float("nan") if entry == "q_network" else float("inf"))

    rewritten(checkpoint, spoil)
    message = refused(pqn.main, pqn.Args(resume=str(checkpoint)))
    assert message.endswith("its networks or optimizers hold NaN or inf; resume from an earlier checkpoint")


def test_a_checkpoint_without_the_learned_list_is_checked_against_the_live_networks(copies):
    checkpoint, _ = copies

    def spoil(saved):
        del saved["learned"]  # as written before checkpoints named their learned entries
        weights = saved["state"]["q_network"]
        name = next(iter(weights))
        weights[name] = weights[name].clone().fill_(float("nan"))

    rewritten(checkpoint, spoil)
    with pytest.raises(SystemExit, match="its networks or optimizers hold NaN or inf"):
        pqn.main(pqn.Args(resume=str(checkpoint)))


def test_a_replay_checkpoint_with_nan_weights_is_refused_and_its_inf_priorities_are_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    flags = tiny("dqn_dueling_per", total_timesteps=400, learning_starts=200, checkpoint_every=200, checkpoint_replay=True)
    dqn_dueling_per.main(dqn_dueling_per.Args(**flags))
    path = run_dir_of() / "checkpoint.pt"
    saved = read_checkpoint(str(path))
    assert torch.isinf(torch.as_tensor(saved["state"]["rb"]["min_tree"])).any()  # by design: empty slots
    resumed = dqn_dueling_per.main(dqn_dueling_per.Args(resume=str(path)))  # a finished run resumes, and ends
    assert isinstance(resumed, list)
    files = sorted(p.name for p in run_dir_of().iterdir())

    def spoil(checkpoint):
        weights = checkpoint["state"]["target_network"]
        weights[next(iter(weights))] = weights[next(iter(weights))].clone().fill_(float("nan"))

    rewritten(path, spoil)
    with pytest.raises(SystemExit) as stop:
        dqn_dueling_per.main(dqn_dueling_per.Args(resume=str(path)))
    assert re.match(ONE_LINE, str(stop.value.code)) and "NaN or inf" in str(stop.value.code)
    assert sorted(p.name for p in run_dir_of().iterdir()) == files  # no new log in the run's folder


# -- malformed headers and model files ---------------------------------------------------------------------------


def test_a_checkpoint_that_holds_a_list_is_refused_in_one_line(copies):
    checkpoint, _ = copies
    torch.save([1, 2, 3], checkpoint)
    assert "its top level is a list, not a dict" in refused(pqn.main, pqn.Args(resume=str(checkpoint)))


WRONG_HEADERS = dict(
    format="3",
    script=["pqn.py"],
    args=[1],
    run_name=7,
    global_step=-64,
    rng=[0],
    state=[1],
    wandb_id=3,
    envs_start=1.5,
    digest=None,
    learned="q_network",
)


@pytest.mark.parametrize("field", sorted(WRONG_HEADERS))
def test_every_header_field_of_the_wrong_type_is_refused_in_one_line(field, copies):
    checkpoint, _ = copies
    if field == "digest":
        saved = read_checkpoint(str(checkpoint))
        torch.save(to_safe(dict(saved, digest=None)), checkpoint)
    else:
        rewritten(checkpoint, lambda saved: saved.update({field: WRONG_HEADERS[field]}))
    message = refused(pqn.main, pqn.Args(resume=str(checkpoint)))
    assert f"its field {field} holds" in message, message


@pytest.mark.parametrize("field", ["args", "rng", "state"])
def test_header_fields_with_malformed_insides_are_refused_in_one_line(field, copies):
    checkpoint, _ = copies
    inside = dict(args={"seed": [1]}, rng={"python": 1}, state={1: 2})[field]
    rewritten(checkpoint, lambda saved: saved.update({field: inside}))
    assert "not a readable checkpoint (ValueError: its " in refused(pqn.main, pqn.Args(resume=str(checkpoint)))


MALFORMED_MODELS = {
    "a list": [torch.zeros(2)],
    "weights of lists": {"kind": "cleanrl-q model", "script": "pqn.py", "args": {}, "model": {"w": [1.0, 2.0]}},
    "a model that is a list": {"kind": "cleanrl-q model", "script": "pqn.py", "args": {}, "model": [torch.zeros(2)]},
    "no script": {"kind": "cleanrl-q model", "args": {}, "model": {"w": torch.zeros(2)}},
    "args of a list": {"kind": "cleanrl-q model", "script": "pqn.py", "args": [1], "model": {"w": torch.zeros(2)}},
    "a flag of a dict": {"kind": "cleanrl-q model", "script": "pqn.py", "args": {"seed": {}}, "model": {"w": torch.zeros(2)}},
    "a kind of a number": {"kind": 1, "script": "pqn.py", "args": {}, "model": {"w": torch.zeros(2)}},
    "nan weights": {"kind": "cleanrl-q model", "script": "pqn.py", "args": {}, "model": {"w": torch.full((2,), float("nan"))}},
}


@pytest.mark.parametrize("kind", sorted(MALFORMED_MODELS))
def test_a_malformed_model_file_is_refused_in_one_line(kind, copies):
    _, model = copies
    torch.save(MALFORMED_MODELS[kind], model)
    assert "not a readable model file" in refused(pqn.main, pqn.Args(eval_only=True, model_path=str(model)))


def test_a_model_flag_of_the_wrong_type_is_refused_before_it_is_used(copies):
    _, model = copies
    saved = read_model_file(str(model))
    torch.save(dict(saved, args=dict(saved["args"], learning_rate="fast")), model)
    message = refused(pqn.main, pqn.Args(eval_only=True, model_path=str(model)))
    assert "its flag learning_rate holds 'fast'" in message


def test_an_evaluation_reads_its_model_file_once(copies, monkeypatch):
    _, model = copies
    reads = []
    load = checkpoint_files.load_safely

    def counted(path):
        reads.append(path)
        return load(path)

    monkeypatch.setattr("cleanrl_q_utils.model_files.load_safely", counted)
    scores = pqn.main(pqn.Args(eval_only=True, model_path=str(model), eval_episodes=1))
    assert len(scores) == 1 and reads == [str(model)]


# -- a learning rate changed on resume ---------------------------------------------------------------------------


def test_a_learning_rate_changed_on_resume_is_kept_by_the_checkpoints_it_writes(tmp_path, monkeypatch):
    """pqn anneals its step size from --learning-rate each iteration: lr = (1 - iteration / iterations) * rate."""
    monkeypatch.chdir(tmp_path)
    flags = tiny("pqn", checkpoint_every=512)  # 32 iterations of 64 agent steps
    iterations = flags["total_timesteps"] // (flags["num_envs"] * flags["num_steps"])
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, pqn, k=100)
        run_until_stopped(pqn.main, pqn.Args(**flags))
    path = run_dir_of() / "checkpoint.pt"
    first = read_checkpoint(str(path))
    new_rate = first["args"]["learning_rate"] * 3
    replayed = first["global_step"] // flags["num_envs"]  # envs.step calls of the resume's replay
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, pqn, k=replayed + 100)
        run_until_stopped(pqn.main, pqn.Args(resume=str(path), learning_rate=new_rate))
    second = read_checkpoint(str(path))
    done = second["state"]["iteration"]
    assert second["global_step"] > first["global_step"] and second["args"]["learning_rate"] == new_rate
    assert second["state"]["optimizer"]["lr"] == pytest.approx((1 - (done - 1) / iterations) * new_rate)
    pqn.main(pqn.Args(resume=str(path)))  # no flag: the run goes on with the rate it was given
    final = read_checkpoint(str(path))
    assert final["state"]["iteration"] == iterations and final["args"]["learning_rate"] == new_rate
    assert final["state"]["optimizer"]["lr"] == pytest.approx((1 - (iterations - 1) / iterations) * new_rate)


def test_a_bare_pickle_is_refused_unread_as_not_torch_zip_layout(copies):
    checkpoint, _ = copies
    with open(checkpoint, "wb") as file:
        pickle.dump({"a": 1}, file, protocol=4)
    assert "not a zip archive" in refused(pqn.main, pqn.Args(resume=str(checkpoint)))


def test_a_checkpoint_whose_end_record_defers_to_zip64_loads_as_before(copies):
    """A checkpoint over 4 GB (a large replay) gives its central directory's place only in the zip64 end record."""
    checkpoint, _ = copies
    before = read_checkpoint(str(checkpoint))
    data = bytearray(checkpoint.read_bytes())
    data[-22:] = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    checkpoint.write_bytes(bytes(data))
    after = read_checkpoint(str(checkpoint))
    assert after["digest"] == before["digest"] == content_digest({k: v for k, v in after.items() if k != "digest"})
