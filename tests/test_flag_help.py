"""One wording per flag across the scripts, and `--help` that lists the flags by group."""

import ast
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cleanrl_q_utils import command_line

from helpers import import_script

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(path.stem for path in (REPO / "cleanrl").glob("*.py") if path.stem != "__init__")
TRANSITION_REPLAY = ("dqn_dueling_per", "iqn", "iqn_atari")
PQN = ("pqn", "pqn_atari_envpool", "pqn_atari_envpool_lstm")
R2D2 = ("r2d2", "r2d2_atari")
PER_ACTOR_EPSILONS = (*R2D2, "recurrent_iqn", "recurrent_iqn_atari")

# Fields whose name means different things in different scripts: the scripts of each group share one wording
# (None: each script words it for its own network).
EXCEPTIONS = {
    "batch_size": (
        (TRANSITION_REPLAY, PER_ACTOR_EPSILONS),
        "a batch is of transitions in the scripts with transition replay, of sequences in those with sequence replay",
    ),
    "start_e": (
        ((*TRANSITION_REPLAY, *PQN), PER_ACTOR_EPSILONS),
        "one epsilon for all environments, or the base of the per-actor epsilons base^(1 + alpha i / (N - 1))",
    ),
    "end_e": (
        ((*TRANSITION_REPLAY, *PQN), PER_ACTOR_EPSILONS),
        "one epsilon for all environments, or the base of the per-actor epsilons base^(1 + alpha i / (N - 1))",
    ),
    "hidden_size": (None, "each network uses the width for different layers (torso, embedding, head, dueling streams)"),
}


def args_docstrings(script: str) -> dict[str, str]:
    """field -> its docstring, read from the `Args` class of cleanrl/<script>.py with `ast` (field, then a string)."""
    tree = ast.parse((REPO / "cleanrl" / f"{script}.py").read_text())
    (args,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Args"]
    docs = {}
    for statement, following in zip(args.body, args.body[1:]):
        if isinstance(statement, ast.AnnAssign):
            assert isinstance(following, ast.Expr) and isinstance(following.value.value, str), f"{script}: {statement}"
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


DOCS = {script: args_docstrings(script) for script in SCRIPTS}


def wordings(field: str) -> dict[str, str]:
    """script -> docstring of `field`, for the scripts that have it."""
    return {script: docs[field] for script, docs in DOCS.items() if field in docs}


def test_all_ten_scripts_are_read():
    assert len(SCRIPTS) == 10 and all(len(docs) >= 30 for docs in DOCS.values())


def test_a_shared_flag_has_one_wording():
    shared = sorted({field for docs in DOCS.values() for field in docs if len(wordings(field)) > 1})
    assert len(shared) > 50
    differing = {
        field: wordings(field) for field in shared if field not in EXCEPTIONS and len(set(wordings(field).values())) > 1
    }
    assert differing == {}


@pytest.mark.parametrize("field", sorted(EXCEPTIONS))
def test_each_exception_is_needed_and_each_of_its_groups_has_one_wording(field):
    groups, reason = EXCEPTIONS[field]
    assert reason
    by_script = wordings(field)
    assert len(set(by_script.values())) > 1, f"--{field} has one wording now: drop it from EXCEPTIONS"
    if groups is None:
        return
    assert sorted(script for group in groups for script in group) == sorted(by_script), field
    for group in groups:
        assert len({by_script[script] for script in group}) == 1, (field, group)
    assert len({by_script[group[0]] for group in groups}) == len(groups), f"--{field}: two groups share a wording"


def test_every_field_named_in_the_help_groups_exists():
    """A stale name in command_line.HELP_GROUPS would silently move nothing."""
    named = [name for names in command_line.HELP_GROUPS.values() for name in names]
    assert len(named) == len(set(named))
    assert set(named) <= {field for docs in DOCS.values() for field in docs}


def grouped_help(script: str, capsys) -> str:
    module = import_script(script)
    command_line.print_grouped_help(module.Args, module.__doc__)
    return capsys.readouterr().out


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_every_flag_once_under_its_group(script, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    text = grouped_help(script, capsys)
    module = import_script(script)
    first_line = module.__doc__.strip().split("\n")[0]
    assert text.startswith(first_line[:60]) and "\nusage: python " in text
    headings = [line[:-1] for line in text.splitlines() if line and not line[0].isspace() and line.endswith(":")]
    assert headings == [group for group in command_line.HELP_GROUPS if group in headings]
    assert headings[:3] == ["run", "environment", "algorithm"] and headings[-2:] == ["checkpoints", "evaluation"]
    group, seen = None, []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.endswith(":") and line[:-1] in headings:
            group = line[:-1]
        elif line.startswith("  --"):
            seen.append((line.split()[0], group))
            assert lines[i + 1].startswith("      ") and lines[i + 1].strip(), f"{line}: no description below"
    fields = dataclasses.fields(module.Args)
    assert len(seen) == len(fields) and len(dict(seen)) == len(fields)  # each flag once
    seen = dict(seen)
    for field in fields:
        flag = "--" + field.name.replace("_", "-")
        expected = next((g for g, names in command_line.HELP_GROUPS.items() if field.name in names), "algorithm")
        assert seen[flag] == expected, flag
        if field.type in (bool, "bool"):
            assert f"  {flag} / --no-{flag[2:]}  (default: {field.default})" in text
        else:
            assert any(line.startswith(f"  {flag} ") and line.endswith(f"(default: {field.default})") for line in lines)
    expected_groups = {  # where a user looks for these flags, written out apart from command_line.HELP_GROUPS
        "--seed": "run",
        "--cuda": "run",
        "--wandb-entity": "run",
        "--env-id": "environment",
        "--num-envs": "environment",
        "--total-timesteps": "algorithm",
        "--gamma": "algorithm",
        "--learning-rate": "algorithm",
        "--buffer-size": "replay",
        "--burn-in": "replay",
        "--prioritized-replay-alpha": "replay",
        "--checkpoint-replay": "checkpoints",
        "--resume": "checkpoints",
        "--save-model": "evaluation",
        "--eval-epsilon": "evaluation",
        "--model-path": "evaluation",
    }
    assert {flag: seen[flag] for flag in expected_groups if flag in seen} == {
        flag: group for flag, group in expected_groups.items() if flag in seen
    }
    assert "  --seed INT  (default: 1)\n      seed of the experiment" in text
    assert DOCS[script]["env_id"] in " ".join(text.split())


def test_dash_dash_help_prints_the_grouped_help_and_exits_zero(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", COLUMNS="100")
    for flags in (["--help"], ["--seed", "3", "-h"]):
        script = str(REPO / "cleanrl" / "pqn.py")
        result = subprocess.run([sys.executable, script, *flags], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("Parallel Q-Network (PQN)")
        assert "\nrun:\n  --exp-name STR  (default: pqn)\n" in result.stdout
        assert "\nreplay:" not in result.stdout  # PQN has no replay: an empty group has no heading
        assert "  --cuda / --no-cuda  (default: True)" in result.stdout
        assert list(tmp_path.iterdir()) == []  # help starts no run


@pytest.mark.parametrize("script", SCRIPTS)
def test_flags_still_parse_with_tyro(script):
    import tyro

    args_class = import_script(script).Args
    args = tyro.cli(args_class, args=["--seed", "7", "--no-cuda", "--gamma", "0.9", "--exp-name", "x"])
    assert (args.seed, args.cuda, args.gamma, args.exp_name) == (7, False, 0.9, "x")
    assert tyro.cli(args_class, args=[]) == args_class()


def help_of(script: str, tmp_path) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", COLUMNS="100")
    path = str(REPO / "cleanrl" / f"{script}.py")
    result = subprocess.run([sys.executable, path, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def values_in_help(text: str, label: str) -> dict[str, str]:
    """--flag -> the value that `label` ('MinAtar ids') shows in the flag's line: `(default: X; MinAtar ids: Y)`."""
    found = {}
    for line in text.splitlines():
        if line.startswith("  --") and f"; {label}: " in line:
            found[line.split()[0]] = line.split(f"; {label}: ")[1].split(";")[0].rstrip(")")
    return found


def changed_flags(before, after) -> dict[str, str]:
    return {
        "--" + field.name.replace("_", "-"): str(getattr(after, field.name))
        for field in dataclasses.fields(before)
        if field.name != "env_id" and getattr(after, field.name) != getattr(before, field.name)
    }


MINATAR_SCRIPTS = [script for script in SCRIPTS if hasattr(import_script(script), "MINATAR_DEFAULTS")]


@pytest.mark.parametrize("script", MINATAR_SCRIPTS)
def test_help_shows_the_values_a_minatar_id_brings(script, tmp_path, monkeypatch):
    """What the help says a MinAtar id brings is what a run with that id gets (command_line.with_minatar_defaults, no flag
    given)."""
    module = import_script(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py"])
    default = module.Args(env_id="MinAtar/Breakout-v0")
    brought = changed_flags(default, command_line.with_minatar_defaults(default, module.MINATAR_DEFAULTS))
    text = help_of(script, tmp_path)
    assert brought and values_in_help(text, "MinAtar ids") == brought
    assert f"the {len(brought)} flags marked 'MinAtar ids: VALUE'" in " ".join(text.split())
    if not hasattr(module, "ATARI_DEFAULTS"):
        assert "Atari ids" not in text


def test_help_shows_the_values_an_atari_id_brings_to_the_dueling_dqn(tmp_path, monkeypatch):
    module = import_script("dqn_dueling_per")
    monkeypatch.setattr(sys, "argv", ["dqn_dueling_per.py"])
    default = module.Args(env_id="Breakout-v5")
    brought = changed_flags(default, module.with_atari_defaults(default))
    text = help_of("dqn_dueling_per", tmp_path)
    assert brought and values_in_help(text, "Atari ids") == brought
    assert values_in_help(text, "MinAtar ids")  # both configurations, each in its own place on a flag's line


def test_pqn_help_marks_the_six_flags_a_minatar_id_changes(tmp_path):
    marked = values_in_help(help_of("pqn", tmp_path), "MinAtar ids")
    assert sorted(marked) == sorted(
        ["--total-timesteps", "--num-steps", "--num-minibatches", "--update-epochs", "--exploration-fraction", "--end-e"]
    )


def test_a_script_without_another_configuration_marks_no_flag(tmp_path):
    text = help_of("pqn_atari_envpool", tmp_path)
    assert "ids:" not in text and "configuration of their own" not in text
