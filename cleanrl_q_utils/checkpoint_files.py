"""Checkpoint files: the saved state handed back on resume (`resumed_state`, with a learning rate given on resume), the
random generators, the checksum, the atomic synced write (`write_checkpoint`), and the safe load of every file a script reads
(`load_safely`, `read_checkpoint`): `torch.load(weights_only=True)`, so that no file runs code (numpy arrays are stored
as tensors of their bytes), after `check_torch_zip` has checked, before any record is read, that the file is torch.save's
zip layout and that what loading it allocates is bounded by its size; the two kinds of file a script reads
(`is_checkpoint`, `is_model_file`: a model file is marked MODEL_FILE) and the shape of a checkpoint's header
(`header_error`).

Layer 2 (parts): imports flag_errors only."""

import contextlib
import hashlib
import os
import pickle
import pickletools
import random
import struct
import tempfile
import threading
import warnings
import zipfile
from typing import Callable, Optional

import numpy as np
import torch

from cleanrl_q_utils.flag_errors import available_memory_bytes, flag_error


def read_checkpoint(path: str, flag: str = "resume") -> dict:
    """A checkpoint's contents, loaded without running code and within bounded memory (`load_safely`); numpy arrays
    are stored as tensors of their bytes (see `to_safe`). A file that is not a dict of such values, a pickled object
    that could run code or a compressed record included, is refused in one line."""
    try:
        saved = load_safely(path)
        if not isinstance(saved, dict):
            raise RefusedFile(f"its top level is a {type(saved).__name__}, not a dict")
        return from_safe(saved)
    except Exception as error:
        flag_error(flag, path, f"not a readable checkpoint ({unreadable_reason(error)})")


class RefusedFile(ValueError):
    """A file that this module refuses to load, with the one-line reason."""


def load_safely(path: str, mmap: bool = False):
    """`torch.load(weights_only=True)` on the CPU of a file that `check_torch_zip` passed: no code runs, and what it
    allocates is bounded by the file's size (each tensor's bytes are read once, as stored) and by the pickle's. With
    `mmap`, tensors are views of the mapped file instead, for a caller that reads only the plain values (a file changed
    in place while mapped would crash the process on access: the tensors of what is returned are not to be kept).
    torch's warnings are silenced (on a file's pickle protocol, say): a file it refuses is then said in one line."""
    check_torch_zip(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


# What a file written by torch.save may name in its pickle: the tensor rebuild, its storages and the dicts of weights.
# torch's weights-only unpickler allows more; some of it allocates beyond the file's bytes (a rebuild that converts a
# tensor to another dtype makes a new copy at each reference to the same storage), so a file naming it is refused.
PICKLE_GLOBALS = ("collections OrderedDict", "torch._utils _rebuild_tensor_v2")
# A checkpoint's plain values (flags, generator states, one 9-byte float per finished episode) pickle to kilobytes, a
# few MB after millions of episodes. Unpickled, a byte of a crafted pickle can become up to ~70 bytes of Python
# objects (a 1-byte empty dict in a list), so the pickle is held to this size and to 1/80 of the memory available.
MOST_PICKLE_BYTES = 32 * 1024 * 1024
ZIP_END = struct.Struct("<4sHHHHIIH")  # end of central directory record, as torch.save (miniz) writes it: no comment
ZIP64_LOCATOR = struct.Struct("<4sIQI")
ZIP64_END = struct.Struct("<4sQHHIIQQQQ")
ZIP_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")


def check_torch_zip(path: str) -> None:
    """Refuses, by raising RefusedFile, a file that is not a zip archive as torch.save writes it, before torch reads any
    record: every record stored uncompressed (torch.save never compresses: a compressed record can only be a file
    crafted to inflate, a few MB declaring GBs), each inside the file and overlapping no other, one central directory
    that torch's reader and Python's agree on, a file no larger than the memory available, and a pickle that is small
    and names nothing but tensors and dicts of them. What loading it allocates is then bounded by the file's size."""
    size = os.path.getsize(path)
    available = available_memory_bytes()
    if size > available:
        raise RefusedFile(f"it holds {size / 1e9:,.1f} GB, more than the {available / 1e9:,.1f} GB of memory available")
    with open(path, "rb") as file:
        records = stored_records(file, size)
        pickles = [name for name in records if name.endswith("/data.pkl") and name.count("/") == 1]
        if len(pickles) != 1:
            raise RefusedFile("not a file that torch.save writes (no data.pkl record)")
        start, length = records[pickles[0]]
        if length > min(MOST_PICKLE_BYTES, available // 80):
            raise RefusedFile(f"its pickle holds {length:,} bytes, more than a checkpoint's or model's plain values need")
        file.seek(start)
        check_pickle(file.read(length))


def stored_records(file, size: int) -> dict[str, tuple[int, int]]:
    """{name: (offset of its data, size)} of the records of the zip archive `file` of `size` bytes, checked as
    `check_torch_zip` says. The central directory is found where its end record says, with no comment after it, and
    Python's zipfile must find it there too: two readers that disagreed on it could be shown different records."""
    if size < ZIP_END.size:
        raise RefusedFile("not a zip archive as torch.save writes it (too short)")
    file.seek(size - ZIP_END.size)
    signature, *_, entries, directory_size, directory_start, comment = ZIP_END.unpack(file.read(ZIP_END.size))
    if signature != b"PK\x05\x06" or comment:
        raise RefusedFile("not a zip archive as torch.save writes it")
    if 0xFFFFFFFF in (directory_size, directory_start) or entries == 0xFFFF:  # zip64: sizes in the zip64 end record
        file.seek(max(size - ZIP_END.size - ZIP64_LOCATOR.size, 0))
        signature, _, zip64_end, _ = ZIP64_LOCATOR.unpack(file.read(ZIP64_LOCATOR.size).ljust(ZIP64_LOCATOR.size))
        file.seek(zip64_end)
        fields = ZIP64_END.unpack(file.read(ZIP64_END.size).ljust(ZIP64_END.size))
        if signature != b"PK\x06\x07" or fields[0] != b"PK\x06\x06":
            raise RefusedFile("not a zip archive as torch.save writes it (a broken zip64 record)")
        directory_start = fields[-1]
    try:
        file.seek(0)
        archive = zipfile.ZipFile(file)
    except Exception as error:  # zipfile's own refusals, of a broken central directory say
        raise RefusedFile(f"not a zip archive as torch.save writes it ({str(error)[:120]})") from None
    if archive.start_dir != directory_start:
        raise RefusedFile("its zip archive has data before its first record or a misplaced central directory")
    records, spans = {}, []
    for info in archive.infolist():
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
            raise RefusedFile(
                f"its record {info.filename} declares {info.file_size:,} bytes but stores {info.compress_size:,}"
            )
        if info.compress_type != zipfile.ZIP_STORED:
            raise RefusedFile(
                f"its record {info.filename} is compressed ({info.compress_size:,} bytes declaring {info.file_size:,} "
                "bytes); torch.save stores records uncompressed"
            )
        if info.filename in records:
            raise RefusedFile(f"its record {info.filename} appears twice")
        file.seek(info.header_offset)
        header = file.read(ZIP_LOCAL_HEADER.size)
        if len(header) < ZIP_LOCAL_HEADER.size:
            raise RefusedFile(f"its record {info.filename} lies outside the file")
        signature, _, _, method, *_, name_length, extra_length = ZIP_LOCAL_HEADER.unpack(header)
        if signature != b"PK\x03\x04" or method != zipfile.ZIP_STORED:
            raise RefusedFile(f"its record {info.filename} has a broken or compressed local header")
        start = info.header_offset + ZIP_LOCAL_HEADER.size + name_length + extra_length
        records[info.filename] = (start, info.file_size)
        spans.append((info.header_offset, start + info.file_size, info.filename))
    end = 0
    for first, last, name in sorted(spans):
        if last > directory_start:
            raise RefusedFile(f"its record {name} declares more bytes than the file holds ({size:,} bytes in all)")
        if first < end:
            raise RefusedFile(f"its record {name} overlaps another record")
        end = last
    return records


def check_pickle(data: bytes) -> None:
    """Reads the opcodes of a pickle without running it: every global it names must be in PICKLE_GLOBALS or a storage
    type of torch; one whose name is computed while unpickling (STACK_GLOBAL, which torch.save's default protocol 2
    does not write) is refused, as are the opcodes that build arbitrary objects."""
    try:
        for opcode, argument, _ in pickletools.genops(data):
            if opcode.name in ("STACK_GLOBAL", "INST", "OBJ", "EXT1", "EXT2", "EXT4"):
                raise RefusedFile(f"its pickle uses {opcode.name}, which the files of these scripts never do")
            if opcode.name == "GLOBAL" and argument not in PICKLE_GLOBALS:
                module, _, name = argument.partition(" ")
                if module != "torch" or not name.endswith("Storage") or not name.isidentifier():
                    raise RefusedFile(
                        f"it holds Python objects other than tensors and plain values ({argument.replace(' ', '.')}); "
                        "loading those could run code or take unbounded memory, so it is not"
                    )
    except RefusedFile:
        raise
    except Exception as error:  # a truncated or malformed pickle
        raise RefusedFile(
            f"its pickle is malformed ({str(error).splitlines()[0][:120] if str(error) else type(error).__name__})"
        )


NUMPY_MARK = "numpy array"  # to_safe's form of a numpy array or scalar: {NUMPY_MARK: dtype, "shape": ..., "bytes": ...}


def to_safe(value):
    """`value` with every numpy array and scalar replaced by a dict of its dtype, shape and bytes (a uint8 tensor that
    shares its memory), so that `torch.load(weights_only=True)` reads it back; `from_safe` undoes it bit for bit."""
    if isinstance(value, dict):
        return {key: to_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_safe(item) for item in value)
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value) if np.asarray(value).flags.c_contiguous else np.ascontiguousarray(value)
        if array.dtype.hasobject:
            raise TypeError("a numpy array of Python objects cannot be checkpointed safely")
        raw = torch.from_numpy(array.reshape(-1).view(np.uint8))
        return {NUMPY_MARK: array.dtype.str, "shape": array.shape, "scalar": isinstance(value, np.generic), "bytes": raw}
    return value


def from_safe(value):
    if isinstance(value, dict):
        if NUMPY_MARK in value:
            raw, dtype = value["bytes"], np.dtype(value[NUMPY_MARK])
            if not (isinstance(raw, torch.Tensor) and raw.dtype == torch.uint8 and raw.dim() == 1) or dtype.hasobject:
                raise RefusedFile(f"a numpy array of it is not stored as {NUMPY_MARK}s are")
            array = raw.numpy().view(dtype).reshape(value["shape"])
            return array[()] if value["scalar"] else array
        return {key: from_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(from_safe(item) for item in value)
    return value


def new_temporary_file(path: str) -> tuple[int, str]:
    """(descriptor, path) of a new file beside `path`, with the permissions a plain `open` would give it (mkstemp's
    are owner-only, which would hide checkpoints and models from the colleagues a folder is shared with)."""
    handle, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=os.path.dirname(path) or ".")
    umask = os.umask(0o22)
    os.umask(umask)
    os.fchmod(handle, 0o666 & ~umask)
    return handle, tmp


def write_atomically(path: str, write: Callable) -> None:
    """Calls `write(file)` on a new temporary file beside `path`, syncs it, then renames it over `path`: readers see the
    old file or the new one whole, never a part (a crash, a full disk, a signal), and two writers never share a file."""
    handle, tmp = new_temporary_file(path)
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def content_digest(value, hasher=None) -> str:
    """A BLAKE2 checksum of every tensor, array and number in `value`, in a fixed order. Stored in each checkpoint and
    checked on resume: a byte flipped inside a saved tensor is caught, which torch.load alone would not notice."""
    top = hasher is None
    hasher = hashlib.blake2b(digest_size=16) if top else hasher
    if isinstance(value, dict):
        for key in sorted(value, key=repr):
            hasher.update(repr(key).encode())
            content_digest(value[key], hasher)
    elif isinstance(value, (list, tuple)):
        for item in value:
            content_digest(item, hasher)
    elif isinstance(value, (torch.Tensor, np.ndarray)) and value.dtype != object:
        array = value.detach().cpu().contiguous().numpy() if isinstance(value, torch.Tensor) else value
        data = memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        for start in range(0, len(data), 1 << 26):  # in pieces: a signal is answered between them
            hasher.update(data[start : start + (1 << 26)])
    else:
        hasher.update(repr(value).encode())
    return hasher.hexdigest() if top else ""


def rng_states() -> dict:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def all_finite(value) -> bool:
    """False if a floating tensor or array anywhere in `value` holds NaN or inf."""
    if isinstance(value, dict):
        return all(all_finite(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return all(all_finite(item) for item in value)
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return bool(torch.isfinite(value).all())
    if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating):
        return bool(np.isfinite(value).all())
    return True


def unreadable_reason(error: Exception) -> str:
    """One line on why torch.load refused a file: torch's own message on unpickling runs over many lines."""
    if isinstance(error, RefusedFile):
        return str(error)
    if isinstance(error, pickle.UnpicklingError) and "Weights only load failed" in str(error):
        return "it holds Python objects other than tensors and plain values; loading those could run code, so it is not"
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else 'unreadable'}"


def write_checkpoint(path: str, checkpoint: dict, note_writing: Callable) -> None:
    """Writes `checkpoint` with its digest beside `path`, syncs, then renames it over `path`: a crash, a full disk or
    a second Ctrl-C while writing leaves the previous file whole. Numpy arrays are stored as tensors of their bytes,
    so that the file loads with `weights_only=True`. The write runs in a helper thread, so that the calling thread
    stays free to answer a second Ctrl-C at once; `note_writing` is told the temporary file's path, then False."""
    checkpoint = to_safe({**checkpoint, "digest": content_digest(checkpoint)})
    handle, tmp = new_temporary_file(path)
    failed = []

    def write():
        try:
            with os.fdopen(handle, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
        except BaseException as error:
            failed.append(error)

    writer = threading.Thread(target=write, daemon=True)
    try:
        note_writing(tmp)
        writer.start()
        while writer.is_alive():
            writer.join(0.05)
        if failed:
            raise failed[0]
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    finally:
        note_writing(False)


# The two kinds of file a script reads: a model file (`model_files.save_weights`) is marked by its `kind`; a checkpoint
# (`Run.save`) holds its format, its digest and its state.
MODEL_FILE = "cleanrl-q model"


def is_model_file(contents) -> bool:
    return isinstance(contents, dict) and contents.get("kind") == MODEL_FILE


def is_checkpoint(contents) -> bool:
    return isinstance(contents, dict) and {"format", "digest", "state"} <= set(contents)


# The header of a checkpoint: each field and the types it may hold (`envs_start` and `learned` are absent from the
# checkpoints written before they were added). A file with another shape is refused before any field is used.
HEADER_TYPES = dict(
    format=(int,),
    script=(str,),
    args=(dict,),
    run_name=(str,),
    global_step=(int,),
    rng=(dict,),
    state=(dict,),
    wandb_id=(str, type(None)),
    envs_start=(int,),
    learned=(list,),
    digest=(str,),
)
OPTIONAL_HEADER = ("envs_start", "learned")
PLAIN_FLAG_TYPES = (bool, int, float, str, type(None))


def header_error(checkpoint: dict) -> Optional[str]:
    """Why `checkpoint` (as `read_checkpoint` returns it) does not have the shape `Run.save` writes, or None: a missing
    field, a field of another type, a flag that is not a plain value, random-generator states that are not."""
    missing = set(HEADER_TYPES).difference(checkpoint, OPTIONAL_HEADER)
    if missing:
        return f"it has no field {', '.join(sorted(missing))}"
    for field, kinds in HEADER_TYPES.items():
        value = checkpoint.get(field, kinds[0]())
        if not isinstance(value, kinds) or isinstance(value, bool) or field in ("global_step", "envs_start") and value < 0:
            return f"its field {field} holds {type(value).__name__} {value!r:.40}"
    flags, state = checkpoint["args"], checkpoint["state"]
    if not all(isinstance(name, str) and isinstance(value, PLAIN_FLAG_TYPES) for name, value in flags.items()):
        return "its flags are not names with plain values"
    learned = checkpoint.get("learned", [])
    if not all(isinstance(name, str) for name in [*state, *learned]) or not set(learned) <= set(state):
        return "its state is not named entries (or names learned entries it does not hold)"
    rng = checkpoint["rng"]
    if set(rng) != {"python", "numpy", "torch", "cuda"} or not isinstance(rng["torch"], torch.Tensor):
        return "its random-generator states are not those Run.save writes"
    if not (
        isinstance(rng["python"], tuple) and isinstance(rng["numpy"], tuple) and isinstance(rng["cuda"], (list, type(None)))
    ):
        return "its random-generator states are not those Run.save writes"
    return None


def flag_of_another_type(saved: dict, defaults) -> Optional[str]:
    """The first saved flag whose value is not of its field's type in `defaults` (an int for a float field is fine),
    or a flag the script does not have that holds more than a plain value; None when all fit."""
    for name, value in saved.items():
        default = getattr(defaults, name, None)
        kinds = (type(default), type(None)) if default is None or not isinstance(default, float) else (float, int)
        if hasattr(defaults, name) and default is not None and not isinstance(value, kinds) or isinstance(value, (dict, list)):
            return name
    return None


def resumed_state(checkpoint: dict, args) -> dict:
    """The state of `checkpoint` as the script saved it (plain values), for the script to put into its own objects; a
    learning rate given on resume (`args.learning_rate` other than the checkpoint's) replaces the one of every saved
    optimizer state, torch's (each parameter group) and the flat RAdam's."""
    saved = dict(checkpoint["state"])
    learning_rate = getattr(args, "learning_rate", None)
    if learning_rate != checkpoint["args"].get("learning_rate", learning_rate):
        saved = {key: with_learning_rate(value, learning_rate) for key, value in saved.items()}
    return saved


def with_learning_rate(state, learning_rate: float):
    """`state` with its step size set to `learning_rate` if it is an optimizer's state: torch's (`param_groups`) or the
    flat RAdam's (a float `lr` beside its moments); any other value unchanged."""
    if isinstance(state, dict) and isinstance(state.get("param_groups"), list):
        return {**state, "param_groups": [{**group, "lr": learning_rate} for group in state["param_groups"]]}
    if isinstance(state, dict) and isinstance(state.get("lr"), float) and "exp_avg" in state:
        return {**state, "lr": learning_rate}
    return state


def learned_entries(checkpoint: dict) -> list:
    """The state entries of `checkpoint` that training computes (networks and optimizer moments), which must hold no
    NaN or inf: those its header names (`learned`), or, in a checkpoint written before headers named them, every
    network's or optimizer's state: a dict of only tensors (a state_dict), or one with torch's `param_groups` or the
    flat RAdam's moments. Replays and logs are never among them: they may hold inf by design."""
    if "learned" in checkpoint:
        return list(checkpoint["learned"])

    def is_learned(value) -> bool:
        if not isinstance(value, dict) or not value:
            return False
        weights = all(isinstance(tensor, torch.Tensor) for tensor in value.values())
        return weights or "param_groups" in value or {"lr", "exp_avg", "exp_avg_sq"} <= set(value)

    return [key for key, value in checkpoint["state"].items() if is_learned(value)]
