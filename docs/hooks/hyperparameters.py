"""mkdocs hook: the table of default hyperparameters on each algorithm page, read from the scripts at build time.

A page asks for a table with a comment line naming the scripts, one column each:

    <!-- hyperparameters: iqn.py iqn_atari.py -->

and the build replaces that line with a table of the fields of the scripts' `Args` dataclasses: the flag, its
default in each script and its docstring (what `--help` prints), then the `#` comment on the field's line, if any,
after the script's name: a script's own remark (where its default comes from, why it was chosen). The fields are
read from the source with `ast`, so the build imports neither torch nor envpool, and a flag added to a script
appears on its page at the next build. The run flags that every script shares (`RUN_FLAGS`) are named once under the
table instead.

`python docs/hooks/hyperparameters.py iqn.py iqn_atari.py` prints the table of those scripts.
"""

from __future__ import annotations

import ast
import posixpath
import re
import sys
from dataclasses import dataclass
from pathlib import Path

SCRIPTS_DIR = Path(__file__).resolve().parents[2] / "cleanrl"
MARKER = re.compile(r"^<!--\s*hyperparameters:\s*(?P<scripts>[\w. ]+?)\s*-->[ \t]*$", re.MULTILINE)
RUN_FLAGS = (
    "exp_name",
    "torch_deterministic",
    "cuda",
    "track",
    "wandb_project_name",
    "wandb_entity",
    "capture_video",
    "save_model",
    "checkpoint_every",
    "checkpoint_replay",
    "resume",
    "resume_fresh_envs",
    "eval_only",
    "model_path",
)
"""fields that set up a run (naming, device, logging, checkpoints) rather than the algorithm: listed once"""
RUN_FLAG_PREFIXES = ("wandb_", "checkpoint_", "resume_")
"""a new field with one of these prefixes counts as a run flag too"""


@dataclass
class Field:
    """One field of a script's `Args`."""

    name: str
    default: str
    """the default as the table shows it: a string's value, otherwise the source text of the expression"""
    doc: str
    """the docstring under the field (empty when it has none)"""
    note: str = ""
    """the `#` comment on the field's line, without the `#` (empty when it has none)"""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def is_run_flag(name: str) -> bool:
    return name in RUN_FLAGS or name.startswith(RUN_FLAG_PREFIXES)


def show_default(source: str, node: ast.expr | None) -> str:
    if node is None:
        return "(required)"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value if node.value else '""'
    return ast.get_source_segment(source, node)


def read_args(script: Path) -> list[Field]:
    """The fields of the `Args` dataclass of `script`, in declaration order."""
    source = script.read_text()
    classes = [node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == "Args"]
    if not classes:
        raise ValueError(f"{script}: no `class Args`")
    fields, body, lines = [], classes[0].body, source.splitlines()
    for i, statement in enumerate(body):
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        following = body[i + 1] if i + 1 < len(body) else None
        is_doc = (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        )
        doc = " ".join(following.value.value.split()) if is_doc else ""
        line = lines[statement.end_lineno - 1].encode()[statement.end_col_offset :].decode().strip()
        note = line[1:].strip() if line.startswith("#") else ""
        fields.append(Field(statement.target.id, show_default(source, statement.value), doc, note))
    return fields


def read_minatar_defaults(script: Path) -> dict[str, str] | None:
    """The flags a MinAtar id sets in `script` (its module-level `MINATAR_DEFAULTS = dict(...)`), as the table shows
    them; None for a script without one."""
    source = script.read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "MINATAR_DEFAULTS" for t in node.targets):
            return {keyword.arg: show_default(source, keyword.value) for keyword in node.value.keywords}
    return None


def cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|")


def code(text: str) -> str:
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{cell(text)}{pad}{fence}"


def describe(scripts_by_doc: dict[str, list[str]]) -> list[str]:
    """The lines of a flag's description, given the scripts that describe it each way.

    One description: itself. Descriptions that share a whole first phrase and differ only in what follows it
    (a parenthesis, or a clause after `;` or `,`): the phrase, then each script's addition. Otherwise each
    description after the names of its scripts.
    """
    docs = list(scripts_by_doc)
    if len(docs) == 1:
        return docs
    names = {doc: ", ".join(f"`{script}`" for script in scripts) for doc, scripts in scripts_by_doc.items()}
    words = [doc.split(" ") for doc in docs]
    common = 0
    while all(len(w) > common and w[common] == words[0][common] for w in words):
        common += 1
    rests = [" ".join(w[common:]) for w in words]
    if common >= 3 and all(rest == "" or rest[0] in "(;," for rest in rests):
        return [" ".join(words[0][:common])] + [f"{names[doc]}: {rest}" for doc, rest in zip(docs, rests) if rest]
    return [f"{names[doc]}: {doc}" for doc in docs]


def hyperparameter_table(
    scripts: list[str], scripts_dir: Path = SCRIPTS_DIR, usage_link: str = "../get-started/basic-usage.md"
) -> str:
    """Markdown: one row per algorithm flag of any of `scripts`, one default column per script, the description.

    Rows follow the first script's order, then flags only later scripts have. When the scripts describe a flag
    differently, each description is given after the names of the scripts that use it; a script's remark (the
    comment on the field's line) likewise, after the description. A script with a MinAtar configuration gets a
    second column, its flags with a MinAtar id: the values that id sets in bold, the others as the defaults.
    """
    by_script = {name: {field.name: field for field in read_args(scripts_dir / name)} for name in scripts}
    minatar = {name: read_minatar_defaults(scripts_dir / name) for name in scripts}
    names = list(dict.fromkeys(name for fields in by_script.values() for name in fields))
    columns = [(script, kind) for script in scripts for kind in ("default", "minatar") if kind == "default" or minatar[script]]
    header = ["Flag", *(f"`{s}`" if kind == "default" else f"`{s}` on MinAtar" for s, kind in columns), "Description"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for name in names:
        if is_run_flag(name):
            continue
        fields = {script: by_script[script].get(name) for script in scripts}
        scripts_by_doc: dict[str, list[str]] = {}
        scripts_by_note: dict[str, list[str]] = {}
        for script, field in fields.items():
            if field is not None:
                scripts_by_doc.setdefault(field.doc, []).append(script)
                if field.note:
                    scripts_by_note.setdefault(field.note, []).append(script)
        if len(scripts) == 1:  # the script's remark follows its description
            (field,) = fields.values()
            description = cell(f"{field.doc} ({field.note})" if field.note else field.doc)
        else:
            notes = [", ".join(f"`{script}`" for script in named) + f": ({note})" for note, named in scripts_by_note.items()]
            description = "<br>".join(cell(line) for line in describe(scripts_by_doc) + notes)
        defaults = []
        for script, kind in columns:
            field, overrides = fields[script], minatar[script] or {}
            if field is None:
                defaults.append("-")
            elif kind == "minatar" and name in overrides:
                defaults.append(f"**{code(overrides[name])}**")
            else:
                defaults.append(code(field.default))
        flag = next(field.flag for field in fields.values() if field is not None)
        lines.append("| " + " | ".join([f"`{flag}`", *defaults, description]) + " |")
    run_flags = [name for name in names if is_run_flag(name)]
    note = (
        "Not in the table: the run flags "
        + ", ".join(f"`--{name.replace('_', '-')}`" for name in run_flags)
        + f" (naming, device, logging, checkpoints and evaluating a saved model: see [Basic usage]({usage_link})). "
        + "Boolean flags also have a `--no-` form. The table is generated from the scripts' `Args` when the site "
        + "is built; `python cleanrl/<script>.py --help` prints the same."
        + (
            " A MinAtar id (`--env-id MinAtar/Breakout-v0`) brings the configuration of the MinAtar column; flags given "
            + "on the command line win."
            if any(minatar.values())
            else ""
        )
    )
    return "\n".join(lines) + "\n\n" + note


def expand(markdown: str, page_path: str = "rl-algorithms/page.md", scripts_dir: Path = SCRIPTS_DIR) -> str:
    """Replaces every marker line of `markdown` (the page at `page_path` in docs/) with the table it asks for."""
    usage_link = posixpath.relpath("get-started/basic-usage.md", posixpath.dirname(page_path) or ".")
    return MARKER.sub(lambda match: hyperparameter_table(match["scripts"].split(), scripts_dir, usage_link), markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return expand(markdown, page.file.src_uri)


if __name__ == "__main__":
    print(hyperparameter_table(sys.argv[1:] or ["pqn.py"]))
