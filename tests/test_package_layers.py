"""The layers of cleanrl_q_utils/, read from the modules' own import statements: no circle, no import of a package
module inside a function, a module imports only modules of its own layer or of lower ones, the ground imports the
standard library only, and each module's docstring states its layer and the package modules it imports."""

import ast
import re
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cleanrl_q_utils"

# Each module's layer (docs/contributing.md shows the same table): 1 ground, 2 parts, 3 checks and helpers, 4 run plumbing.
LAYERS = {
    "flag_errors": 1,
    **dict.fromkeys(
        (
            "checkpoint_files",
            "minatar",
            "classic_control",
            "episode_scores",
            "stop_signals",
            "quiet_start",
            "segment_tree",
            "lstm_unroll",
            "flat_radam",
        ),
        2,
    ),
    **dict.fromkeys(("flag_checks", "environments"), 3),
    **dict.fromkeys(("run_folder", "model_files", "command_line", "training_run"), 4),
}
MODULES = sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem != "__init__")


def package_modules_named(node: ast.AST, modules) -> set[str]:
    """The package modules that one import statement `node` imports (none for any other statement)."""
    if isinstance(node, ast.Import):
        return {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("cleanrl_q_utils.")}
    if not isinstance(node, ast.ImportFrom):
        return set()
    if node.module == "cleanrl_q_utils" or node.level == 1 and node.module is None:
        return {alias.name for alias in node.names if alias.name in modules}
    if node.module and node.module.startswith("cleanrl_q_utils."):
        return {node.module.split(".")[1]}
    if node.level == 1 and node.module:
        return {node.module.split(".")[0]}
    return set()


def imported_modules(tree: ast.Module, modules) -> set[str]:
    """Package modules imported anywhere in a module, inside its functions too."""
    return set().union(*(package_modules_named(node, modules) for node in ast.walk(tree)))


def imports_inside_definitions(tree: ast.Module, modules) -> list[tuple[str, int]]:
    """(package module, line) of every import of a package module inside a function or class."""
    found = []
    for definition in ast.walk(tree):
        if isinstance(definition, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for node in ast.walk(definition):
                found += [(module, node.lineno) for module in package_modules_named(node, modules)]
    return found


def first_circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of `graph` (module: modules it imports) as [a, b, ..., a], or [] when there is none."""
    state = {}  # module: "open" while on the current path, "done" once all it reaches is explored

    def visit(module, path):
        state[module] = "open"
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == "open":
                return path[path.index(imported) :] + [imported]
            if imported not in state and (circle := visit(imported, path + [imported])):
                return circle
        state[module] = "done"
        return []

    for module in sorted(graph):
        if module not in state and (circle := visit(module, [module])):
            return circle
    return []


def parsed(module: str) -> ast.Module:
    return ast.parse((PACKAGE / f"{module}.py").read_text())


def import_graph() -> dict[str, set[str]]:
    return {module: imported_modules(parsed(module), MODULES) for module in MODULES}


def test_every_package_module_has_a_layer():
    assert set(MODULES) == set(LAYERS)


def test_the_circle_finder_finds_a_circle_and_only_a_circle():
    assert first_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert first_circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_the_package_imports_form_no_circle():
    assert first_circle(import_graph()) == []


def test_a_package_module_is_imported_only_at_the_top_of_a_module():
    assert imports_inside_definitions(ast.parse("def f():\n    from cleanrl_q_utils import minatar\n"), MODULES)
    assert not imports_inside_definitions(ast.parse("def f():\n    import tyro\n"), MODULES)
    inside = {module: imports_inside_definitions(parsed(module), MODULES) for module in MODULES}
    assert {module: found for module, found in inside.items() if found} == {}


@pytest.mark.parametrize("module", MODULES)
def test_a_module_imports_only_its_own_layer_or_lower_ones(module):
    higher = {imported for imported in import_graph()[module] if LAYERS[imported] > LAYERS[module]}
    assert higher == set(), f"{module} (layer {LAYERS[module]}) imports a higher layer"


def test_the_ground_imports_the_standard_library_only():
    for module in (name for name, layer in LAYERS.items() if layer == 1):
        tree = parsed(module)
        roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        roots |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert roots <= sys.stdlib_module_names, f"{module} imports {sorted(roots - sys.stdlib_module_names)}"


@pytest.mark.parametrize("module", MODULES)
def test_a_modules_docstring_states_its_layer_and_what_it_imports(module):
    """The paragraph 'Layer N (name): imports ...' names the module's layer and exactly the package modules it imports."""
    docstring = ast.get_docstring(parsed(module)) or ""
    stated = re.search(r"^Layer (\d) \([^)]*\): (imports[^\n]*(?:\n[^\n]+)*)", docstring, re.MULTILINE)
    assert stated, f"{module}'s docstring has no 'Layer N (...): imports ...' paragraph"
    assert int(stated.group(1)) == LAYERS[module]
    named = set(re.findall(r"\w+", stated.group(2))) & set(MODULES)
    assert named == import_graph()[module]
