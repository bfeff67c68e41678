"""The documentation site: hyperparameter tables read from the scripts, and formulas typeset without network access.

The browser check builds the site, serves it on 127.0.0.1 and opens a page with formulas in headless Chromium
(Debian's `chromium` package; skipped when it is not installed). Chromium's own name lookups are pointed nowhere,
so nothing but the local server can be reached, and its network log tells which requests the page made.
"""

import dataclasses
import functools
import html
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers import REPO, import_file, import_script

# An algorithm's page; its history page (`<algo>-history.md`: sweeps and earlier configurations) has no table.
ALGORITHM_PAGES = sorted(page for page in (REPO / "docs" / "rl-algorithms").glob("*.md") if not page.stem.endswith("-history"))
HISTORY_PAGES = sorted((REPO / "docs" / "rl-algorithms").glob("*-history.md"))
SCRIPTS = sorted(path.name for path in (REPO / "cleanrl").glob("*.py") if path.name != "__init__.py")


hyperparameters = import_file(REPO / "docs" / "hooks" / "hyperparameters.py", "docs_hook_hyperparameters")


@pytest.mark.parametrize("script", SCRIPTS)
def test_fields_read_from_the_source_are_the_dataclass_fields(script):
    """The table's parser against the imported `Args`: same fields in the same order, same defaults."""
    fields = hyperparameters.read_args(REPO / "cleanrl" / script)
    args = import_script(script).Args
    assert [field.name for field in fields] == [field.name for field in dataclasses.fields(args)]
    for field, declared in zip(fields, dataclasses.fields(args)):
        assert field.doc, f"{script}: --{field.name} has no docstring"
        if field.name == "exp_name":  # the script's file name, computed at import
            assert declared.default == script[: -len(".py")]
        elif isinstance(declared.default, str):
            assert field.default == (declared.default or '""')
        else:
            assert eval(field.default, {"__builtins__": {}}) == declared.default, f"{script}: --{field.name}"


def test_every_script_has_a_table_on_an_algorithm_page():
    tabled = []
    for page in ALGORITHM_PAGES:
        markers = hyperparameters.MARKER.findall(page.read_text())
        assert len(markers) == 1, f"{page.name}: one `<!-- hyperparameters: ... -->` line expected"
        tabled += markers[0].split()
    assert sorted(tabled) == SCRIPTS


def test_every_algorithm_flag_of_the_scripts_is_a_row():
    table = hyperparameters.expand("<!-- hyperparameters: iqn.py iqn_atari.py -->", "rl-algorithms/iqn.md")
    assert table.startswith(
        "| Flag | `iqn.py` | `iqn.py` on MinAtar | `iqn_atari.py` | Description |\n|---|---|---|---|---|\n"
    )
    rows = [line.split(" | ")[0][2:] for line in table.splitlines() if line.startswith("| `--")]
    fields = [hyperparameters.read_args(REPO / "cleanrl" / script) for script in ("iqn.py", "iqn_atari.py")]
    flags = dict.fromkeys(
        f"`{field.flag}`" for script in fields for field in script if not hyperparameters.is_run_flag(field.name)
    )
    assert rows == list(flags)
    assert "`--checkpoint-every`" not in rows and "`--checkpoint-every`" in table  # named once, under the table


@pytest.mark.parametrize("script", ["pqn.py", "dqn_dueling_per.py", "iqn.py", "r2d2.py", "recurrent_iqn.py"])
def test_the_minatar_column_is_the_configuration_a_minatar_id_brings(script):
    """The table's MinAtar column against the imported script: the flags `MINATAR_DEFAULTS` sets in bold, with their
    values, and every other flag at its default."""
    module = import_script(script)
    read = hyperparameters.read_minatar_defaults(REPO / "cleanrl" / script)
    assert {name: eval(value, {"__builtins__": {}}) for name, value in read.items()} == module.MINATAR_DEFAULTS
    table = hyperparameters.hyperparameter_table([script])
    for line in table.splitlines()[2:]:
        if line.startswith("| `--"):
            flag, default, on_minatar = line.split(" | ")[:3]
            name = flag.removeprefix("| `--").removesuffix("`").replace("-", "_")
            assert on_minatar == (f"**`{read[name]}`**" if name in read else default), line


# The pages that open with the answer: what the algorithm is, its results beside the published ones, how to run it.
PAGES_THAT_LEAD_WITH_RESULTS = ["pqn.md", "dqn_dueling_per.md", "iqn.md", "r2d2.md", "recurrent_iqn.md"]


def level_two_headings(text: str) -> list[str]:
    """The page's `## ` headings in order, outside code blocks (a `# comment` line in a bash block is no heading)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return [line[3:].strip() for line in text.splitlines() if line.startswith("## ")]


@pytest.mark.parametrize("page", PAGES_THAT_LEAD_WITH_RESULTS)
def test_an_algorithm_page_opens_with_its_results_and_the_command(page):
    """Overview, then a results table whose columns keep ours apart from others', then Usage with a command; the
    details and the experiments follow."""
    text = (REPO / "docs" / "rl-algorithms" / page).read_text()
    headings = level_two_headings(text)
    assert headings[:3] == ["Overview", "Results", "Usage"], headings
    assert headings.index("Implementation details") < headings.index("Experiment results")
    results = text[text.index("\n## Results\n") : text.index("\n## Usage\n")]
    header = next(line for line in results.splitlines() if line.startswith("|"))
    assert "| ours |" in header and ("| theirs (published) |" in header or "| others' |" in header), header
    block = re.match(r"\n## Usage\n\n```bash\n(.*?)```", text[text.index("\n## Usage\n") :], re.S)
    assert block and re.search(r"^python cleanrl/\w+\.py", block[1], re.M), page


@pytest.mark.parametrize("history", HISTORY_PAGES, ids=lambda path: path.name)
def test_a_history_page_and_its_algorithm_page_link_each_other(history):
    algorithm = history.with_name(history.name.replace("-history.md", ".md"))
    assert f"]({algorithm.name}" in history.read_text()
    assert f"]({history.name}#" in algorithm.read_text()
    assert f"rl-algorithms/{history.name}" in (REPO / "mkdocs.yml").read_text()


def without_code_blocks(page: Path) -> str:
    """A Markdown page with each fenced code block turned into blank lines, so line numbers stay the file's."""
    return re.sub(r"```.*?```", lambda block: "\n" * block.group().count("\n"), page.read_text(), flags=re.S)


def test_plus_minus_is_written_one_way():
    """Mean ± std is written with the sign itself, never `+-` or `+/-`."""
    for page in sorted((REPO / "docs").rglob("*.md")):
        assert not re.search(r"\d \+/?- \d", without_code_blocks(page)), page.relative_to(REPO)


def test_every_table_row_is_under_a_header():
    """A row after a line that is no row starts a table, so a header separator must follow it.

    A blank line or a sentence between two rows splits the table, and Markdown shows the stray rows as text.
    """
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        lines = without_code_blocks(page).splitlines()
        for number, (before, row, after) in enumerate(zip(lines, lines[1:], lines[2:] + [""]), start=2):
            if row.startswith("|") and not before.startswith("|"):
                assert re.fullmatch(r"\|[-:| ]+\|", after), f"{page.relative_to(REPO)}:{number}: a row with no header"


TWO_SCRIPTS = {
    "a.py": '''
import os
from dataclasses import dataclass


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    env_id: str = "CartPole-v1"
    """the id of the environment"""
    total_timesteps: int = 500_000
    """total environment steps"""
    gamma: float = 0.99
    """the discount factor"""
    wandb_project_name: str = "p"
    """the wandb project"""
    ratio: float = 1 / 30
    """the share | of steps"""
''',
    "b.py": '''
from dataclasses import dataclass


@dataclass
class Args:
    env_id: str = "Breakout-v5"
    """the id of the Atari environment"""
    gamma: float = 0.99  # the paper: 0.997
    """the discount factor"""
    frame_stack: int = 4
    """frames per input"""
''',
}


def test_table_of_two_scripts(tmp_path):
    for name, source in TWO_SCRIPTS.items():
        (tmp_path / name).write_text(source)
    markdown = "# Page\n\n<!-- hyperparameters: a.py b.py -->\n\nText.\n"
    table = hyperparameters.expand(markdown, "rl-algorithms/x.md", scripts_dir=tmp_path)
    lines = table.splitlines()
    assert lines[:2] == ["# Page", ""]
    assert lines[2:10] == [
        "| Flag | `a.py` | `b.py` | Description |",
        "|---|---|---|---|",
        "| `--env-id` | `CartPole-v1` | `Breakout-v5` | "
        "`a.py`: the id of the environment<br>`b.py`: the id of the Atari environment |",
        "| `--total-timesteps` | `500_000` | - | total environment steps |",
        "| `--gamma` | `0.99` | `0.99` | the discount factor<br>`b.py`: (the paper: 0.997) |",
        "| `--ratio` | `1 / 30` | - | the share \\| of steps |",
        "| `--frame-stack` | - | `4` | frames per input |",
        "",
    ]
    assert lines[10].startswith("Not in the table: the run flags `--exp-name`, `--wandb-project-name` (naming, device, ")
    assert "[Basic usage](../get-started/basic-usage.md)" in lines[10]
    assert lines[11:] == ["", "Text."]
    # the link to Basic usage is relative to the page
    assert "[Basic usage](get-started/basic-usage.md)" in hyperparameters.expand(markdown, "index.md", scripts_dir=tmp_path)


def test_descriptions_of_a_flag_that_differ():
    describe = hyperparameters.describe
    assert describe({"the discount factor": ["a.py", "b.py"]}) == ["the discount factor"]
    assert describe({"the number of envs (CleanRL: 4)": ["a.py"], "the number of envs": ["b.py", "c.py"]}) == [
        "the number of envs",
        "`a.py`: (CleanRL: 4)",
    ]
    assert describe({"the id of a classic env": ["a.py"], "the id of an Atari env": ["b.py"]}) == [
        "`a.py`: the id of a classic env",
        "`b.py`: the id of an Atari env",
    ]


def external_urls(built_html: str) -> list[str]:
    """Absolute or protocol-relative URLs that a page loads by itself: scripts, stylesheets, images, frames."""
    pattern = r"<(?:script|link|img|iframe|source)\b[^>]*?\b(?:src|href)=\"((?:https?:)?//[^\"]*)\""
    return [url for url in re.findall(pattern, built_html) if not url.startswith(("http://127.0.0.1", "//127.0.0.1"))]


def arithmatex_elements(page_html: str) -> list[str]:
    """The inner HTML of every formula element (pymdownx.arithmatex wraps each formula in one)."""
    return [inner for _, inner in re.findall(r"<(span|div) class=\"arithmatex\">(.*?)</\1>", page_html, re.DOTALL)]


def page_requests(netlog: Path, origin: str) -> list[str]:
    """URLs of the requests that the page started (the browser's own background requests have no origin)."""
    log = json.loads(netlog.read_text())
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    starts = [event.get("params", {}) for event in log["events"] if event["type"] == start_job]
    return [
        params["url"] for params in starts if params.get("initiator") == origin or params.get("request_type") == "main frame"
    ]


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    site = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return site


def test_built_site_loads_nothing_from_other_hosts(built_site):
    pages = sorted(built_site.rglob("*.html"))
    assert len(pages) >= 8
    for page in pages:
        assert external_urls(page.read_text()) == [], page.relative_to(built_site)
    for stylesheet in built_site.rglob("*.css"):
        assert not re.search(r"(@import|url\()\s*[\"']?(https?:)?//", stylesheet.read_text()), stylesheet.name
    assert (built_site / "assets" / "mathjax" / "tex-mml-chtml.js").is_file()
    assert (
        built_site / "assets" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2" / "MathJax_Main-Regular.woff"
    ).is_file()
    assert not (built_site / "hooks").exists()  # build code is not published


def test_generated_tables_are_in_the_built_pages(built_site):
    page = (built_site / "rl-algorithms" / "recurrent_iqn" / "index.html").read_text()
    assert "<!-- hyperparameters" not in page
    assert "<code>recurrent_iqn_atari.py</code>" in page and "<code>--burn-in</code>" in page


def test_code_in_tables_breaks_only_between_words(built_site):
    """The theme lets inline code break anywhere; the site's stylesheet stops that in tables, and its script keeps each
    word of such code on one line, so flags and file names are not cut in narrow columns."""
    page = (built_site / "rl-algorithms" / "pqn" / "index.html").read_text()
    assert 'href="../../stylesheets/extra.css"' in page and 'src="../../javascripts/table-code.js"' in page
    css = re.sub(r"/\*.*?\*/", "", (built_site / "stylesheets" / "extra.css").read_text(), flags=re.S)
    rules = {selector.strip(): body for selector, body in re.findall(r"([^{}]+)\{([^}]*)\}", css)}
    table_code = rules[".md-typeset table:not([class]) code"]
    assert "word-break: normal" in table_code and "overflow-wrap: normal" in table_code
    assert "white-space: nowrap" in rules[".md-typeset table:not([class]) code .code-word"]
    script = (built_site / "javascripts" / "table-code.js").read_text()
    assert ".md-typeset table:not([class]) code" in script and '"code-word"' in script


@pytest.fixture
def local_server(built_site):
    """Serves the built site on 127.0.0.1 (a free port) from a thread; yields its origin."""

    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(built_site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium: apt-get install -y chromium")
def test_formulas_are_typeset_offline_in_a_browser(built_site, local_server, tmp_path):
    path = "rl-algorithms/pqn/"
    built = arithmatex_elements((built_site / path / "index.html").read_text())
    assert len(built) >= 10 and all(inner.startswith(("\\(", "\\[")) for inner in built)  # TeX, before MathJax ran

    netlog = tmp_path / "netlog.json"
    command = [
        "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",  # no other host can even be looked up
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--log-net-log={netlog}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        f"{local_server}/{path}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout

    typeset = arithmatex_elements(dom)
    assert len(typeset) == len(built)
    for inner in typeset:
        assert "<mjx-container" in inner, inner[:200]
        text = html.unescape(re.sub(r"<[^>]+>", "", inner))
        assert not any(delimiter in text for delimiter in ("\\(", "\\)", "\\[", "\\]")), text[:200]

    requests = page_requests(netlog, local_server)
    assert f"{local_server}/assets/mathjax/tex-mml-chtml.js" in requests
    assert any(url.endswith(".woff") for url in requests)  # MathJax's fonts, from the site too
    assert [url for url in requests if not url.startswith(local_server + "/")] == []
