"""mkdocs hook: serve MathJax from the built site, so that formulas render without network access.

MathJax 3 comes from the `django-static-mathjax` package of the `docs` extra (its files only; Django is not
needed). At build time its `es5/` tree is added to the site under `assets/mathjax/`: the combined
`tex-mml-chtml.js` that mkdocs.yml loads, plus the fonts and the components it loads on demand. Nothing is
copied into the repository.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

SITE_PREFIX = "assets/mathjax"
BUNDLE = "tex-mml-chtml.js"
"""the combined component that mkdocs.yml's `extra_javascript` loads"""


def mathjax_es5_dir() -> Path:
    """The `es5/` folder of the installed MathJax distribution."""
    try:
        root = Path(str(importlib.resources.files("mathjax"))) / "static" / "mathjax"
    except ModuleNotFoundError:
        root = None
    if root is None or not (root / "es5" / BUNDLE).is_file():
        raise PluginError("MathJax not found: install the docs extra (pip install -e '.[docs]')")
    return root / "es5"


def mathjax_files(es5: Path) -> list[tuple[str, Path]]:
    """(path in the site, file) pairs: every component, font and extension, and of the top-level bundles only
    the one the site loads (the others weigh 15 MB and are never requested)."""
    pairs = [(f"{SITE_PREFIX}/{BUNDLE}", es5 / BUNDLE), (f"{SITE_PREFIX}/LICENSE", es5.parent / "LICENSE")]
    for path in sorted(es5.rglob("*")):
        if path.is_file() and path.parent != es5:
            pairs.append((f"{SITE_PREFIX}/{path.relative_to(es5).as_posix()}", path))
    return pairs


def on_files(files: Files, config) -> Files:
    for site_path, source in mathjax_files(mathjax_es5_dir()):
        files.append(File.generated(config, site_path, abs_src_path=str(source)))
    return files
