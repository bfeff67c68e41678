"""The command line: `parse` reads a script's `Args` (`cli` also runs its `main`), `--help` lists the flags by group,
`resume` merges a checkpoint's flags with those given on the command line (which may change, which may not);
`with_configuration` and `with_minatar_defaults` fill the flags not given from a script's configuration.

Layer 4 (run plumbing): imports flag_errors, checkpoint_files, minatar and flag_checks."""

import os
import shlex
import shutil
import sys
from dataclasses import fields, replace
from typing import Optional

from cleanrl_q_utils import minatar
from cleanrl_q_utils.checkpoint_files import (
    all_finite,
    content_digest,
    flag_of_another_type,
    header_error,
    is_model_file,
    learned_entries,
    read_checkpoint,
)
from cleanrl_q_utils.flag_checks import rounded_total
from cleanrl_q_utils.flag_errors import flag_error, is_plain_name

# The flags a resumed run may change from the command line: how the run is carried out and logged, what happens after
# training, and a smaller step after a NaN stop. Every other flag keeps the checkpoint's value; giving it another one
# stops the run, by name.
CHANGEABLE_ON_RESUME = (
    *("checkpoint_every", "checkpoint_replay", "track", "wandb_project_name", "wandb_entity", "cuda"),
    *("save_model", "capture_video", "eval_episodes", "eval_epsilon"),
    *("learning_rate", "max_grad_norm"),
)


# Flags added after the first checkpoints were written: a checkpoint without them resumes with their defaults.
LATER_FLAGS = {
    *("eval_only", "model_path", "resume_fresh_envs", "min_epsilon"),
    *("td_loss_coef", "conv_layer_norm", "config", "lstm_state_merge"),
}


def resume(given, script: str, checkpoint_format: int):
    """(args, checkpoint) of a run: `given` unchanged and no checkpoint, or with --resume the checkpoint and its flags.

    A flag given on the command line wins whatever its value, if it may change on resume (CHANGEABLE_ON_RESUME);
    another flag given with a value other than the checkpoint's stops the run, by name; a flag not given keeps the
    checkpoint's value. What changed is listed in the start-up block (`checkpoint["changed"]`). `script` is the
    script's path (`__file__`); a checkpoint of another script or format or shape, whose contents changed, or whose
    networks or optimizers hold NaN or inf, stops the run in one line before anything is built."""
    if given.resume is None:
        if given.resume_fresh_envs:
            flag_error("resume_fresh_envs", True, "only with --resume PATH (how to rebuild a resumed run's games)")
        return given, None
    if not os.path.isfile(given.resume):
        flag_error("resume", given.resume, "not a file" if os.path.exists(given.resume) else "no such file")
    checkpoint, names = read_checkpoint(given.resume, "resume"), {field.name for field in fields(given)}
    if is_model_file(checkpoint):
        flag_error("resume", given.resume, "a model file (--save-model), not a checkpoint: evaluate it with --eval-only")
    try:
        malformed = header_error(checkpoint)
        if malformed:
            raise ValueError(malformed)
        script = os.path.basename(script)
        if checkpoint["script"] != script:
            raise ValueError(f"written by {checkpoint['script']}, not {script}")
        if checkpoint["format"] != checkpoint_format or set(checkpoint["args"]) - LATER_FLAGS != names - LATER_FLAGS:
            raise ValueError(f"format {checkpoint['format']}, expected {checkpoint_format}")
        if content_digest({k: v for k, v in checkpoint.items() if k != "digest"}) != checkpoint["digest"]:
            raise ValueError("its contents do not match their checksum (a damaged file)")
        if not is_plain_name(checkpoint["run_name"]):
            raise ValueError(f"its run name {checkpoint['run_name']!r} is not a folder name")
        wrong = flag_of_another_type(checkpoint["args"], type(given)())
        if wrong:
            raise ValueError(f"its flag {wrong} holds {checkpoint['args'][wrong]!r}")
    except (KeyError, TypeError, ValueError) as error:
        flag_error("resume", given.resume, f"not a readable checkpoint ({type(error).__name__}: {error})")
    # The learned entries Run.save named: refused here, before a run folder or log is touched, rather than resumed and
    # later named as the last good checkpoint by the NaN stop.
    if not all_finite([checkpoint["state"][key] for key in learned_entries(checkpoint)]):
        flag_error("resume", given.resume, "its networks or optimizers hold NaN or inf; resume from an earlier checkpoint")
    saved = {**{name: getattr(type(given)(), name) for name in LATER_FLAGS & names}, **checkpoint["args"]}
    # How to resume is said anew each time: --resume, and --resume-fresh-envs (fresh games, or the exact replay).
    args, changed = replace(type(given)(**saved), resume=given.resume, resume_fresh_envs=given.resume_fresh_envs), []
    for name in sorted(flags_given(given) - {"resume", "resume_fresh_envs"}):
        value = getattr(given, name)
        if value == saved[name] or name == "total_timesteps" and rounded_total(args, value) == saved[name]:
            continue  # the same value (a launcher repeats the whole command), or the total it was rounded up to
        if name not in CHANGEABLE_ON_RESUME:
            changeable = ", ".join("--" + flag.replace("_", "-") for flag in CHANGEABLE_ON_RESUME if flag in names)
            flag_error(name, value, f"cannot change on resume (the checkpoint has {saved[name]}); these can: {changeable}")
        args = replace(args, **{name: value})
        changed.append(f"--{name.replace('_', '-')} {saved[name]} -> {value}")
    checkpoint["changed"] = changed
    return args, checkpoint


def with_configuration(args, configuration: dict, name: str):
    """`args` with the values of `configuration` (a script's MinAtar or Atari settings, say) in every flag that the
    command line did not give: given flags win. Prints the values it set, as `{env id}: {name}: --flag value ...`."""
    given = flags_given(args)
    used = {flag: value for flag, value in configuration.items() if flag not in given and hasattr(args, flag)}
    if used:
        print(f"{args.env_id}: {name}: " + " ".join(f"--{flag.replace('_', '-')} {value}" for flag, value in used.items()))
    return replace(args, **used)


def with_minatar_defaults(args, defaults: dict):
    """`args` with a script's MinAtar configuration `defaults` for a MinAtar id, except the flags given on the command
    line (they win); prints what was used. Other ids are left as they are, and so are a resumed run (its checkpoint
    holds its flags) and an evaluation (its model file holds them)."""
    if not minatar.is_minatar(args.env_id) or args.resume is not None or args.eval_only:
        return args
    return with_configuration(args, defaults, "the MinAtar configuration")


def flags_given(args) -> set[str]:
    """The fields of `args` given on the command line (`--name`, `--name=value`, `--no-name`, with - or _), plus, for a
    script's `main` called from Python, the fields whose values differ from the defaults."""
    names, defaults = {field.name for field in fields(args)}, type(args)()
    given = {name for name in names if getattr(args, name) != getattr(defaults, name)}
    for token in sys.argv[1:]:
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0].replace("-", "_")
            given |= {name, name[3:]} & names if name.startswith("no_") else {name} & names
    return given


def parse(args_class, minatar: Optional[dict] = None, atari: Optional[dict] = None):
    """A script's flags, parsed into `args_class`: `if __name__ == "__main__": main(command_line.parse(Args))`. `--help`
    prints the flags by group and exits; `minatar` and `atari` are the configurations that a MinAtar id or an Atari id
    brings (the script's MINATAR_DEFAULTS, ATARI_DEFAULTS), shown there. A run stopped by a signal (after writing its
    checkpoint) leaves `main` with SystemExit(128 + the signal's number): shells and schedulers tell it from a finished
    run by that exit status."""
    import tyro

    if {"-h", "--help"} & set(sys.argv[1:]):  # tyro's help is one flat list; the flags read better by group
        print_grouped_help(args_class, sys.modules[args_class.__module__].__doc__, minatar, atari)
        raise SystemExit(0)
    return tyro.cli(args_class)


# `--help` groups: the fields of each, in their order in `Args`; a field not named here is an algorithm flag.
HELP_GROUPS = {
    "run": ("exp_name", "seed", "torch_deterministic", "cuda", "track", "wandb_project_name", "wandb_entity"),
    "environment": ("env_id", "num_envs", "frame_stack", "max_episode_steps", "mask_velocity"),
    "algorithm": (),
    "replay": (
        *("buffer_size", "batch_size", "learning_starts", "replay_ratio", "seq_len", "burn_in", "sequence_period"),
        *("prioritized_replay", "prioritized_replay_alpha", "prioritized_replay_beta", "prioritized_replay_eps"),
        "priority_eta",
    ),
    "checkpoints": ("checkpoint_every", "checkpoint_replay", "resume", "resume_fresh_envs"),
    "evaluation": ("save_model", "capture_video", "eval_episodes", "eval_epsilon", "eval_only", "model_path"),
}


# How `--help` names the ids that bring a configuration of their own, and what such an id looks like.
CONFIGURATION_IDS = {"minatar": ("MinAtar ids", "MinAtar/Breakout-v0"), "atari": ("Atari ids", "Breakout-v5")}


def print_grouped_help(
    args_class, script_doc: Optional[str], minatar: Optional[dict] = None, atari: Optional[dict] = None
) -> None:
    """`--help`: the first paragraph of the script's docstring, a usage line, then the fields of `args_class` under
    the headings of HELP_GROUPS, each as `--flag TYPE  (default: X)` with its docstring below. A flag that a MinAtar or
    an Atari id sets to another value (`minatar`, `atari`: name -> value) shows it in the same parentheses,
    `(default: X; MinAtar ids: Y)`, and a paragraph under the usage line says so."""
    import ast
    import inspect
    import textwrap
    import typing

    source = textwrap.dedent(inspect.getsource(args_class))
    body = ast.parse(source).body[0].body
    docs = {
        statement.target.id: " ".join(following.value.value.split())
        for statement, following in zip(body, body[1:])
        if isinstance(statement, ast.AnnAssign)
        and isinstance(following, ast.Expr)
        and isinstance(following.value, ast.Constant)
    }
    group_of = {name: group for group, names in HELP_GROUPS.items() for name in names}
    by_group = {group: [] for group in HELP_GROUPS}
    hints = typing.get_type_hints(args_class)
    for field in fields(args_class):
        by_group[group_of.get(field.name, "algorithm")].append(field)
    width = min(shutil.get_terminal_size().columns, 100)
    summary = " ".join((script_doc or "").strip().split("\n\n")[0].split())  # the docstring's first paragraph
    lines = [textwrap.fill(summary, width), "", f"usage: python {shlex.quote(sys.argv[0])} [-h] [--flag VALUE ...]"]
    # Only the values that differ from a flag's default: the others change nothing.
    defaults = {field.name: field.default for field in fields(args_class)}
    configurations = {
        CONFIGURATION_IDS[kind]: {name: value for name, value in values.items() if defaults.get(name, value) != value}
        for kind, values in (("minatar", minatar), ("atari", atari))
        if values
    }
    for (label, example), values in configurations.items():
        text = (
            f"{label} (--env-id {example}) bring a configuration of their own: the {len(values)} flags marked "
            f"'{label}: VALUE' below take that value, unless given on the command line; a resumed run keeps its "
            "checkpoint's flags and --eval-only its model file's."
        )
        lines += ["", textwrap.fill(text, width)]
    for group, members in by_group.items():
        lines += ["", f"{group}:"] if members else []
        for field in members:
            flag, kind = "--" + field.name.replace("_", "-"), hints[field.name]
            if kind is bool:
                usage = f"{flag} / --no-{flag[2:]}"
            else:
                kinds = [arg for arg in typing.get_args(kind) if arg is not type(None)] or [kind]  # Optional[str]: STR
                usage = f"{flag} {getattr(kinds[0], '__name__', str(kinds[0])).upper()}"
            brought = "".join(
                f"; {label}: {values[field.name]}" for (label, _), values in configurations.items() if field.name in values
            )
            lines.append(f"  {usage}  (default: {field.default}{brought})")
            indent = " " * 6
            text = docs.get(field.name, "")
            lines.append(textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False))
    print("\n".join(lines))
