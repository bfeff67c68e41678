"""benchmark/*.sh: the same switches and defaults in every script, a plan printed before anything starts, and the
benchmark commands of the docs pages, run as written with DRY_RUN=1 (launch.py --dry-run: nothing is trained)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SWEEP_SCRIPTS = ["pqn", "iqn", "r2d2", "recurrent_iqn", "dqn_dueling_per", "sb3", "minatar"]
WITH_ATARI = {"pqn": 30, "iqn": 15, "r2d2": 6, "recurrent_iqn": 57}  # Atari runs each adds with ATARI=1


def bash(command: str, **env: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])  # `python` is this one
    base = {k: v for k, v in os.environ.items() if k not in ("WORKERS", "TRACK", "ATARI", "SEEDS", "LAUNCHER_ARGS")}
    return subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, cwd=REPO, env={**base, "PATH": path, **env}, timeout=120
    )


def test_every_benchmark_script_is_listed():
    scripts = sorted(path.stem for path in (REPO / "benchmark").glob("*.sh"))
    assert scripts == sorted([*SWEEP_SCRIPTS, "atari_speed", "minatar_speed"])


@pytest.mark.parametrize("script", SWEEP_SCRIPTS)
def test_defaults_plan_and_atari_switch(script):
    """By default: no Atari run, no W&B, WORKERS=2; the plan (runs, estimated time) comes before the first command."""
    result = bash(f"bash benchmark/{script}.sh", DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    commands = [line for line in lines if line.startswith("WANDB_RUN_GROUP=")]
    match = re.match(rf"{script}\.sh: (\d+) runs in \d+ launches, estimated time about [\d.]+ (min|h|days) \(local "
                     r"backend, WORKERS=2; TRACK=0, ATARI=0\)", lines[0])  # fmt: skip
    assert match, lines[0]
    assert int(match[1]) == len(commands) > 0
    assert lines.index(commands[0]) > 1
    assert all("--no-track" in command and "--track" not in command.split() for command in commands)
    assert not any("_atari" in command or "-v5" in command for command in commands)
    if script in WITH_ATARI:
        assert "Atari sweeps left out (ATARI=1 adds them" in result.stdout
        with_atari = bash(f"bash benchmark/{script}.sh", DRY_RUN="1", ATARI="1", TRACK="1", SEEDS="7")
        assert with_atari.returncode == 0, with_atari.stderr
        atari_commands = [line for line in with_atari.stdout.splitlines() if "-v5 --seed" in line]
        assert len(atari_commands) == WITH_ATARI[script]
        assert all("--track" in line.split() for line in atari_commands)
        classic_seeds = {line.split()[-1] for line in with_atari.stdout.splitlines() if "-v1 --seed" in line}
        assert classic_seeds <= {"7"}  # SEEDS replaces the seeds of the classic-control sweeps


@pytest.mark.parametrize("switch, value", [("TRACK", "yes"), ("ATARI", "2"), ("WORKERS", "0"), ("DRY_RUN", "x")])
def test_a_bad_switch_stops_the_script_in_one_line(switch, value):
    result = bash("bash benchmark/iqn.sh", **{switch: value})
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {switch}={value}: must be ") and len(result.stderr.splitlines()) == 1
    assert result.stdout == ""


def test_a_dry_run_piped_into_a_reader_that_stops_early_ends_quietly():
    """`bash benchmark/minatar.sh | head`: the launcher stops printing its plan, with no traceback. `true` reads
    nothing, so every line the launcher prints meets a closed pipe."""
    launch = "python benchmark/launch.py --dry-run --env-ids CartPole-v1 --seeds 1 2 3 -- python cleanrl/pqn.py"
    result = bash(f"{launch} | true; exit ${{PIPESTATUS[0]}}")
    assert (result.returncode, result.stderr) == (0, "")


def docs_commands(marker: str = "bash benchmark/") -> list[str]:
    """Every command line of README.md and the docs pages (shell code blocks) that holds `marker`."""
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = page.read_text()
        for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            found += [line.split("#")[0].strip() for line in joined.splitlines() if marker in line]
    return sorted(set(found))


@pytest.mark.parametrize("command", docs_commands())
def test_the_docs_benchmark_commands_run_as_written(command, tmp_path):
    """With DRY_RUN=1 added in front: each launch prints its runs instead of starting them. The launcher makes its
    --output-dir even then, so the cluster examples' shared folder becomes a temporary one."""
    result = bash(f"DRY_RUN=1 {command.replace('/shared/', f'{tmp_path}/')}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\.sh: \d+ runs .*estimated time about|(atari|minatar)_speed\.sh: \d+ runs", result.stdout), (
        result.stdout
    )
    if "ATARI_LAUNCHER_ARGS" in command:  # a cluster example: its point is the Atari sweep
        assert "-v5 --seed" in result.stdout and "Atari sweeps left out" not in result.stdout


@pytest.mark.parametrize("command", docs_commands("python benchmark/launch.py"))
def test_the_docs_launch_commands_run_as_written(command, tmp_path):
    """With --dry-run added: one command line per env id and seed."""
    command = command.replace("/shared/", f"{tmp_path}/").replace("benchmark/launch.py", "benchmark/launch.py --dry-run", 1)
    result = bash(command)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"--env-id \S+ --seed \d+", result.stdout), result.stdout


def planned_runs(stdout: str) -> set[tuple[str, str, str]]:
    """(game, run name, seed) of each command a dry run prints: --exp-name where given, else the script's own name
    (cleanrl/<name>.py's default; sb3_<algo> for benchmark/sb3_baselines.py)."""
    runs = set()
    for line in stdout.splitlines():
        if not line.startswith("WANDB_RUN_GROUP="):
            continue
        words = line.split()
        flag = {name: words[i + 1] for i, name in enumerate(words[:-1]) if name.startswith("--")}
        script = next(Path(word).stem for word in words if word.endswith(".py"))
        name = flag.get("--exp-name", f"sb3_{flag['--algo']}" if script == "sb3_baselines" else script)
        runs.add((flag["--env-id"].replace("/", "-"), name, flag["--seed"]))
    return runs


def test_minatar_sh_runs_under_the_names_of_the_kept_records_and_reports_them():
    """A rerun of benchmark/minatar.sh reproduces the kept MinAtar records: each run it plans has a record of the same
    game, run name and seed in benchmark/episodes/minatar, and its report asks for exactly the names of its runs."""
    result = bash("bash benchmark/minatar.sh", DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    planned = planned_runs(result.stdout)
    records = {
        tuple(path.name.split("__")[:3]) for path in (REPO / "benchmark" / "episodes" / "minatar").glob("*.episodes.csv.gz")
    }
    assert planned and planned <= records, sorted(planned - records)
    (report,) = [line for line in result.stdout.splitlines() if "benchmark/report.py" in line]
    asked = report.split("--exp-names ")[1].split(" --")[0].split()
    assert sorted(asked) == sorted({name for _, name, _ in planned})
