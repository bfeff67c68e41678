"""Model files: `--save-model` writes the weights with every flag of the run (`save_weights`), `--eval-only --model-path`
reads them back without running code (`read_for_evaluation`, `start_evaluation`, `report_evaluation`): the script
rebuilds the agent from the saved flags and loads the weights into it (`put_weights`).

Layer 4 (run plumbing): imports flag_errors, checkpoint_files, flag_checks and run_folder."""

import os
import time
from dataclasses import fields, replace
from typing import Optional

import numpy as np
import torch
import torch.nn as nn

from cleanrl_q_utils.checkpoint_files import (
    MODEL_FILE,
    PLAIN_FLAG_TYPES,
    all_finite,
    flag_of_another_type,
    is_checkpoint,
    is_model_file,
    load_safely,
    unreadable_reason,
    write_atomically,
)
from cleanrl_q_utils.flag_checks import check_evaluation_flags
from cleanrl_q_utils.flag_errors import flag_error
from cleanrl_q_utils.run_folder import describe_device, pick_device, seed_everything

# The flags an --eval-only run takes from the command line; every other flag comes from the saved model file.
EVALUATION_FLAGS = ("eval_only", "model_path", "eval_episodes", "eval_epsilon", "capture_video", "seed", "cuda")
# Flags saved with the model that say how its training run went, not what the agent is: a resumed run's model file
# names the checkpoint it resumed from, which an evaluation neither needs nor may combine with --eval-only.
TRAINING_RUN_FLAGS = ("resume",)


def save_weights(path: str, script: str, args, weights: dict) -> None:
    """A model file holds the weights (a network's state_dict) and every flag of the run, which rebuild the network
    (sizes, env) later. It is written whole or not at all (a temporary file renamed over `path`)."""
    model = {"kind": MODEL_FILE, "script": os.path.basename(script), "args": vars(args), "model": weights}
    write_atomically(path, lambda file: torch.save(model, file))


def read_model_file(path: str) -> dict:
    """The contents of a model file, loaded without running code and within bounded memory (`load_safely`): a dict of
    its `kind`, `script`, `args` (plain values) and `model` (weights: names and tensors). A file of bare weights
    (written before flags were saved) reads as {"model": ...}. Any other shape, or weights that hold NaN or inf, is
    refused in one line."""
    try:
        saved = load_safely(path)
    except Exception as error:
        flag_error("model_path", path, f"not a readable model file ({unreadable_reason(error)})")
    if is_checkpoint(saved):
        flag_error("model_path", path, "a checkpoint, not a model file: --save-model writes one (or --resume this)")
    if not isinstance(saved, dict):
        flag_error("model_path", path, f"not a readable model file (its top level is a {type(saved).__name__}, not a dict)")
    saved = saved if is_model_file(saved) else {"model": saved}
    wrong = model_file_error(saved)
    if wrong:
        flag_error("model_path", path, f"not a readable model file ({wrong})")
    return saved


def model_file_error(saved: dict) -> Optional[str]:
    """Why `saved` (a model file's contents, or {"model": bare weights}) has not the shape `save_weights` writes, or None."""
    fields_of = dict(kind=str, script=str, args=dict) if "kind" in saved else {}
    for field, kind in fields_of.items():
        if not isinstance(saved.get(field), kind):
            return f"its field {field} holds a {type(saved.get(field)).__name__}"
    if set(saved) != {*fields_of, "model"}:
        return f"its fields are {sorted(map(str, saved))}"
    if fields_of and not all(isinstance(k, str) and isinstance(v, PLAIN_FLAG_TYPES) for k, v in saved["args"].items()):
        return "its flags are not names with plain values"
    weights = saved["model"]
    if not isinstance(weights, dict) or not weights:
        return "its weights are not a dict of tensors"
    if not all(isinstance(name, str) and type(value) is torch.Tensor for name, value in weights.items()):
        return "its weights are not a dict of names and tensors"
    if not all_finite(weights):
        return "its weights hold NaN or inf"
    return None


def put_weights(network: nn.Module, weights: dict, path: Optional[str]) -> None:
    """Loads `weights` (a state_dict, read from the model file at `path`) into `network`, or stops with one line when
    they do not fit it (a file of another script, or of bare weights saved with other network sizes)."""
    try:
        network.load_state_dict(weights)
    except (RuntimeError, TypeError, AttributeError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        flag_error("model_path", path, f"its weights do not fit this script's network ({first.strip()[:160]})")


def evaluation_line(path: str, scores: list[float]) -> str:
    if not scores:
        return f"evaluation of {path}: no episodes played (--eval-episodes 0)"
    return (
        f"evaluation of {path} over {len(scores)} episodes: mean {np.mean(scores):.2f} ± {np.std(scores):.2f} "
        f"(min {np.min(scores):.2f}, max {np.max(scores):.2f})"
    )


def read_for_evaluation(given, script: str) -> tuple:
    """--eval-only --model-path PATH, first half: (args, weights) of the saved agent, read once and checked. Only
    EVALUATION_FLAGS come from the command line; every other flag comes from the model file (other values given for
    them are named and ignored). The script then checks the flags (its `validate_args`), calls `start_evaluation`,
    plays the episodes with `weights` and hands the scores to `report_evaluation`."""
    check_evaluation_flags(given)
    saved, name = read_model_file(given.model_path), os.path.basename(script)
    if "args" not in saved:
        print(f"note: {given.model_path} holds weights only: the network is built from the command-line flags")
        return given, saved["model"]
    if saved["script"] != name:
        flag_error("model_path", given.model_path, f"written by {saved['script']}, not {name}")
    if wrong := flag_of_another_type(saved["args"], type(given)()):  # checked before any flag is used
        flag_error(
            "model_path", given.model_path, f"not a readable model file (its flag {wrong} holds {saved['args'][wrong]!r:.60})"
        )
    names, defaults = {field.name for field in fields(given)}, type(given)()
    taken = names.difference(EVALUATION_FLAGS, TRAINING_RUN_FLAGS)
    kept = {key: value for key, value in saved["args"].items() if key in taken}
    for key, value in kept.items():
        if getattr(given, key) not in (value, getattr(defaults, key)):
            print(f"eval-only: ignoring --{key.replace('_', '-')}={getattr(given, key)}; the model's value is {value}")
    return replace(given, **kept), saved["model"]


def start_evaluation(args, script: str) -> tuple:
    """--eval-only, second half: seeds the generators, picks the device and says what is evaluated; returns (device,
    video folder). No run folder: an evaluation leaves nothing in the model's run folder, whose run may be going on."""
    # Seeded, so that an evaluation repeats exactly; a training run's own evaluation instead continues the generators
    # that training advanced (same environment seeds, other random draws: see docs/get-started/basic-usage.md).
    seed_everything(args.seed, getattr(args, "torch_deterministic", True))
    device = pick_device(args.cuda)
    name = os.path.basename(script)
    print(f"{name}: evaluating {args.model_path} on {args.env_id}, device {describe_device(device, args.cuda)}")
    run_of_model = os.path.basename(os.path.dirname(os.path.abspath(args.model_path)))
    return device, f"videos/{run_of_model}-eval-{int(time.time())}"


def report_evaluation(args, scores: list[float], video_folder: str) -> list[float]:
    """--eval-only, last: prints the evaluation's line (and where its videos are); returns the scores."""
    print(evaluation_line(args.model_path, scores))
    if args.capture_video:
        print(f"videos in {video_folder}")
    return scores
