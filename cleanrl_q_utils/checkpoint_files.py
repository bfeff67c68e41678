"""Checkpoint files: what a checkpoint stores of each entry of a script's state (`state_of`, `load_into`), the random
generators, the checksum, the atomic synced write (`write_checkpoint`), and the safe load (`read_checkpoint`, with
`torch.load(weights_only=True)`: numpy arrays are stored as tensors of their bytes, so that no file needs code run
to be read)."""

import contextlib
import hashlib
import os
import pickle
import random
import tempfile
import threading
import warnings
from collections import deque
from typing import Callable

import numpy as np
import torch

from cleanrl_q_utils.flag_checks import flag_error


def read_checkpoint(path: str, flag: str = "resume") -> dict:
    """A checkpoint's contents, loaded without running code: `torch.load(weights_only=True)` unpickles only tensors and
    plain values (numbers, strings, lists, tuples, dicts), and numpy arrays are stored as tensors of their bytes (see
    `to_safe`). A file holding anything else, a pickled object that could run code included, is refused in one line."""
    try:
        return from_safe(load_safely(path, "cpu"))
    except Exception as error:
        flag_error(flag, path, f"not a readable checkpoint ({unreadable_reason(error)})")


def load_safely(path: str, map_location, **kwargs):
    """`torch.load(weights_only=True)` without torch's warnings (on a file's pickle protocol, say): a file it refuses
    is then said in one line."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, map_location=map_location, weights_only=True, **kwargs)


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
            array = value["bytes"].numpy().view(np.dtype(value[NUMPY_MARK])).reshape(value["shape"])
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


def state_of(value):
    """What a checkpoint stores of one entry of a script's checkpoint state."""
    if hasattr(value, "state_dict"):  # networks, optimizers, buffers, EpisodeStats
        return value.state_dict()
    if isinstance(value, np.random.Generator):
        return value.bit_generator.state
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return value.copy() if isinstance(value, np.ndarray) else value.detach().cpu().clone()
    return list(value) if isinstance(value, (list, deque)) else value


def load_into(value, saved) -> None:
    """Restores one entry of a script's checkpoint state in place; plain numbers are left to the script."""
    if hasattr(value, "load_state_dict"):
        value.load_state_dict(saved)
    elif isinstance(value, np.random.Generator):
        value.bit_generator.state = saved
    elif isinstance(value, np.ndarray):
        value[: len(saved)] = saved  # a log may be saved only up to the steps done
    elif isinstance(value, torch.Tensor):
        value.copy_(saved)
    elif isinstance(value, (list, deque)):
        value.clear()
        value.extend(saved)


def set_learning_rate(value, learning_rate: float) -> None:
    """Sets the step size of `value` if it is an optimizer: torch's (every parameter group) or the flat RAdam (`lr`)."""
    if isinstance(value, torch.optim.Optimizer):
        for group in value.param_groups:
            group["lr"] = learning_rate
    elif hasattr(value, "load_state_dict") and isinstance(getattr(value, "lr", None), float):
        value.lr = learning_rate


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


def restore_state(checkpoint: dict, state: dict, args) -> dict:
    """Loads `checkpoint` into `state` (a script's checkpoint state) in place, then the random generators (last:
    building the networks and envs drew from them); a learning rate given on resume replaces the restored
    optimizer's. Returns the saved entries. A state that does not fit stops the run in one line."""
    saved = checkpoint["state"]
    if set(saved) != set(state):
        flag_error("resume", args.resume, f"holds {sorted(saved)}, expected {sorted(state)}")
    try:
        for key, value in state.items():
            load_into(value, saved[key])
        learning_rate = getattr(args, "learning_rate", None)
        if learning_rate != checkpoint["args"].get("learning_rate", learning_rate):
            for value in state.values():
                set_learning_rate(value, learning_rate)
        set_rng_states(checkpoint["rng"])
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError) as error:
        first = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
        flag_error("resume", args.resume, f"its state does not fit this run ({type(error).__name__}: {first})")
    return saved
