"""benchmark/launch.py under faults, with stand-in runs (a few lines of Python that answer signals as the scripts do):
paths that would lead outside --output-dir, signals to the launcher, a closed console, a rerun with another command,
bad input. Each fault ends in one line or a clean stop, never a traceback, and leaves nothing half-made."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from helpers import REPO

LAUNCH = REPO / "benchmark" / "launch.py"

# A stand-in run, in its run folder: starts a run directory, says it is ready, and on SIGINT, SIGTERM or SIGHUP
# finishes its "step" (STEP seconds), writes runs/r/checkpoint.pt holding the signals it got, and exits with 128 + the
# first one; a second SIGINT exits at once, as the scripts do. Started with --resume it exits 0 at once.
RUN = """
import os, pathlib, signal, sys, time
STEP = float(os.environ.get("STEP", "0.3"))
if "--resume" in sys.argv:
    pathlib.Path("resumed").write_text(" ".join(sys.argv[1:]))
    sys.exit(0)
run = pathlib.Path("runs/r")
run.mkdir(parents=True, exist_ok=True)
got = []
def on_signal(signum, frame):
    got.append(signum)
    pathlib.Path("signals").write_text(" ".join(map(str, got)))
    if got.count(signal.SIGINT) > 1:
        pathlib.Path("exited-at-once").write_text("")
        os._exit(128 + signum)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, on_signal)
print("ready", flush=True)
pathlib.Path("pid").write_text(str(os.getpid()))  # after its last print before a signal: the launcher may be gone
while not got:
    time.sleep(0.01)
time.sleep(STEP)
(run / "checkpoint.pt").write_text(" ".join(map(str, got)))
print("checkpoint written", flush=True)
sys.exit(128 + got[0])
"""


def launch(*args: str, cwd: Path = REPO, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LAUNCH), *args], capture_output=True, text=True, timeout=120, cwd=cwd, **popen)


def hangup(disposition) -> Callable[[], None]:
    """A child's SIGHUP handling set to `disposition`: whether pytest itself runs under nohup (SIGHUP ignored, inherited)
    must not decide what the tests see."""
    return lambda: signal.signal(signal.SIGHUP, disposition)


def start_launcher(*args: str, env: dict | None = None, **popen) -> subprocess.Popen:
    """The launcher in a process group of its own (as a job of a shell): a signal to the group is what a terminal's
    Ctrl-C, `timeout` or a closed terminal sends."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("preexec_fn", hangup(signal.SIG_DFL))
    return subprocess.Popen(
        [sys.executable, str(LAUNCH), *args],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **(env or {})},
        **popen,
    )


def wait_for(paths: list[Path], process: subprocess.Popen, seconds: float = 30) -> None:
    deadline = time.time() + seconds
    while not all(path.exists() for path in paths):
        assert process.poll() is None, process.communicate()
        assert time.time() < deadline, f"no {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def workdirs(out: Path, *env_ids: str) -> list[Path]:
    return [out / "run" / f"{env_id}__1" for env_id in env_ids]


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and "Traceback" not in result.stdout
    return line


# ----- paths -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exp_name", ["../../escaped", "ABSOLUTE", "..", "a/b"])
def test_a_path_shaped_exp_name_is_refused_before_anything_is_created(tmp_path, exp_name):
    """ABSOLUTE: an absolute path, tmp_path/absolute-exp."""
    exp_name = str(tmp_path / "absolute-exp") if exp_name == "ABSOLUTE" else exp_name
    out, cwd = tmp_path / "deep" / "out", tmp_path / "deep" / "cwd"
    cwd.mkdir(parents=True)
    args = ["--output-dir", str(out), "--log-dir", str(tmp_path / "logs"), "--env-ids", "E", "--seeds", "1"]
    result = launch(*args, "--", sys.executable, "-c", "print(1)", "--exp-name", exp_name, cwd=cwd)
    assert one_error_line(result).startswith(f"error: --exp-name={exp_name} (in the command): must be ")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == [Path("deep"), Path("deep/cwd")]


def test_the_last_exp_name_of_the_command_is_the_one_checked(tmp_path):
    args = ["--output-dir", str(tmp_path / "out"), "--env-ids", "E", "--seeds", "1", "--", sys.executable, "-c", "1"]
    result = launch(*args, "--exp-name", "fine", "--exp_name=../x")
    assert one_error_line(result).startswith("error: --exp-name=../x (in the command)")


def test_an_env_id_too_long_for_a_folder_name_is_refused(tmp_path):
    result = launch("--output-dir", str(tmp_path / "out"), "--env-ids", "E" * 300, "--seeds", "1", "--", "true")
    assert one_error_line(result).startswith("error: --env-ids=EEE")
    assert not (tmp_path / "out").exists()


def test_env_ids_that_would_share_a_run_folder_are_refused(tmp_path):
    result = launch(
        "--output-dir", str(tmp_path / "out"), "--env-ids", "ALE/Pong-v5", "ALE-Pong-v5", "--seeds", "1", "--", "true"
    )
    assert one_error_line(result).endswith(": ALE/Pong-v5 and ALE-Pong-v5 would share the run folders ALE-Pong-v5__<seed>")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("link", ["run", "run/E__1", "run/E__1/runs", "run/E__1/console.log", "run/E__1/launch.json"])
def test_a_link_that_leads_out_of_the_output_dir_is_refused(tmp_path, link):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / link).parent.mkdir(parents=True, exist_ok=True)
    target = elsewhere if not link.endswith((".log", ".json")) else elsewhere / "file"
    (out / link).symlink_to(target)
    result = launch("--output-dir", str(out), "--env-ids", "E", "--seeds", "1", "--", sys.executable, "-c", "print(1)")
    line = one_error_line(result)
    assert line.startswith(f"error: --output-dir={out}: ") and "outside it; remove that link" in line
    assert list(elsewhere.iterdir()) == []


def test_a_log_link_that_leads_out_of_the_log_dir_is_refused(tmp_path):
    logs, outside = tmp_path / "logs", tmp_path / "precious.txt"
    logs.mkdir()
    outside.write_text("keep")
    (logs / "E__1.log").symlink_to(outside)
    result = launch("--log-dir", str(logs), "--env-ids", "E", "--seeds", "1", "--", sys.executable, "-c", "print(1)")
    assert one_error_line(result).startswith(f"error: --log-dir={logs}: ")
    assert outside.read_text() == "keep"


@pytest.mark.parametrize("flag", ["--output-dir", "--log-dir"])
def test_a_folder_flag_naming_a_file_gives_one_line(tmp_path, flag):
    (tmp_path / "a-file").write_text("")
    result = launch(flag, str(tmp_path / "a-file"), "--env-ids", "E", "--seeds", "1", "--", "true")
    assert one_error_line(result) == f"error: {flag}={tmp_path / 'a-file'}: is a file, not a folder; name a folder (it " + (
        "is created if missing)"
    )


def test_an_unbalanced_quote_in_resume_args_gives_one_line(tmp_path):
    out = tmp_path / "out"
    result = launch("--output-dir", str(out), "--resume-args", "--x 'open", "--env-ids", "E", "--seeds", "1", "--", "true")
    assert one_error_line(result) == "error: --resume-args=--x 'open: no closing quotation; quote it as a shell would"
    assert not out.exists()


def test_attempts_that_fail_in_the_same_second_are_set_aside_under_different_names(tmp_path):
    """The scripts name a run folder after the second it started: attempts that fail within one second make folders
    of one name, and each must be set aside without taking the place of the one before."""
    same_name = (
        "import pathlib, sys; d = pathlib.Path('runs/E__run__1__100'); d.mkdir(parents=True); (d / 'x').touch(); sys.exit(1)"
    )
    args = ["--output-dir", str(tmp_path), "--max-retries", "2", "--env-ids", "E", "--seeds", "1"]
    result = launch(*args, "--", sys.executable, "-c", same_name)
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert "FAILED (exit 1)" in result.stdout
    names = sorted(p.name for p in (tmp_path / "run" / "E__1" / "runs").iterdir())
    assert names == ["E__run__1__100", "E__run__1__100.2.failed", "E__run__1__100.failed"]


# ----- reruns ------------------------------------------------------------------------------------------------------


def test_a_rerun_with_another_command_is_refused_and_the_same_command_skips_the_finished_run(tmp_path):
    args = ["--output-dir", str(tmp_path), "--env-ids", "E", "--seeds", "1", "--", sys.executable, "-c"]
    first = launch(*args, "print('first')")
    assert first.returncode == 0 and "[E 1] first" in first.stdout
    changed = launch(*args, "print('second')")
    line = one_error_line(changed)
    assert f"{tmp_path / 'run' / 'E__1'} holds a run of another command" in line and "use a new --output-dir" in line
    assert "second" not in changed.stdout
    same = launch(*args, "print('first')")
    assert same.returncode == 0 and "ok (finished before)" in same.stdout and "[E 1] first" not in same.stdout
    record = (tmp_path / "run" / "E__1" / "launch.json").read_text()
    assert "print('first')" in record and '"returncode": 0' in record


def test_a_folder_without_a_record_keeps_the_old_behaviour(tmp_path):
    """Run folders made before the launcher kept a record: a finished one is skipped, as before."""
    workdir = tmp_path / "run" / "E__1"
    workdir.mkdir(parents=True)
    (workdir / "finished").touch()
    result = launch("--output-dir", str(tmp_path), "--env-ids", "E", "--seeds", "1", "--", sys.executable, "-c", "print(5)")
    assert result.returncode == 0 and "ok (finished before)" in result.stdout


# ----- signals -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_the_launcher_reaches_each_run_once_and_waits_for_their_checkpoints(tmp_path, signum):
    """Two runs at a time, a third queued: the signal (to the launcher's process group, as a terminal or `timeout`
    sends it) reaches each running run once; each writes its checkpoint; the queued one never starts; the launcher
    exits with 128 + the signal's number and leaves no run behind. The same command again resumes the stopped runs
    (and starts the queued one, here left out: it would wait for a signal)."""
    args = ["--output-dir", str(tmp_path), "--workers", "2", "--env-ids", "A", "B", "C", "--seeds", "1"]
    command = ["--", sys.executable, "-c", RUN]
    launcher = start_launcher(*args, *command)
    running, queued = workdirs(tmp_path, "A", "B"), tmp_path / "run" / "C__1"
    wait_for([workdir / "pid" for workdir in running], launcher)
    pids = [int((workdir / "pid").read_text()) for workdir in running]
    os.killpg(launcher.pid, signum)
    stdout, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signum, stdout + stderr
    assert "Traceback" not in stdout + stderr
    for workdir, pid in zip(running, pids):
        assert (workdir / "runs" / "r" / "checkpoint.pt").read_text() == str(int(signum)), "not exactly once"
        assert not alive(pid)
    assert not (queued / "pid").exists()
    assert "not started: the launcher was stopped" in stdout and "0/3 runs succeeded, 3 stopped\n" in stdout
    assert f"{signal.Signals(signum).name}: passed on to the 2 running runs" in stdout

    again = launch("--output-dir", str(tmp_path), "--workers", "2", "--env-ids", "A", "B", "--seeds", "1", *command)
    assert again.returncode == 0, again.stdout + again.stderr
    for workdir in running:
        assert f"--resume {workdir / 'runs' / 'r' / 'checkpoint.pt'}" in (workdir / "resumed").read_text()


def test_a_launcher_under_nohup_goes_on_through_a_hangup(tmp_path):
    args = ["--output-dir", str(tmp_path), "--env-ids", "A", "--seeds", "1", "--", sys.executable, "-c", RUN]
    launcher = start_launcher(*args, preexec_fn=hangup(signal.SIG_IGN))
    (workdir,) = workdirs(tmp_path, "A")
    wait_for([workdir / "pid"], launcher)
    os.killpg(launcher.pid, signal.SIGHUP)
    time.sleep(0.5)
    assert launcher.poll() is None and not (workdir / "signals").exists()
    os.killpg(launcher.pid, signal.SIGTERM)
    stdout, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 143 and (workdir / "signals").read_text() == "15", stdout + stderr


def test_a_second_ctrl_c_is_passed_on_and_the_runs_exit_at_once(tmp_path):
    args = ["--output-dir", str(tmp_path), "--workers", "2", "--env-ids", "A", "B", "--seeds", "1"]
    launcher = start_launcher(*args, "--", sys.executable, "-c", RUN, env={"STEP": "30"})
    running = workdirs(tmp_path, "A", "B")
    wait_for([workdir / "pid" for workdir in running], launcher)
    os.killpg(launcher.pid, signal.SIGINT)
    wait_for([workdir / "signals" for workdir in running], launcher)
    started = time.time()
    os.killpg(launcher.pid, signal.SIGINT)
    stdout, stderr = launcher.communicate(timeout=20)
    assert launcher.returncode == 130 and time.time() - started < 10, stdout + stderr
    assert "Traceback" not in stdout + stderr and "SIGINT again: passed on" in stdout
    for workdir in running:
        assert (workdir / "signals").read_text() == "2 2" and (workdir / "exited-at-once").exists()


def test_a_launcher_killed_outright_still_has_its_runs_checkpoint(tmp_path):
    """SIGKILL cannot be answered: the runs get SIGTERM from the kernel when the launcher dies (parent-death signal;
    the kernel may send it more than once, as the launcher's threads end one by one, and a run takes a repeated SIGTERM
    for the one stop under way)."""
    launcher = start_launcher("--output-dir", str(tmp_path), "--env-ids", "A", "--seeds", "1", "--", sys.executable, "-c",
                              RUN, stdout=subprocess.DEVNULL)  # fmt: skip
    (workdir,) = workdirs(tmp_path, "A")
    wait_for([workdir / "pid"], launcher)
    pid = int((workdir / "pid").read_text())
    launcher.kill()
    launcher.wait(timeout=10)
    deadline = time.time() + 60
    while alive(pid) and time.time() < deadline:
        time.sleep(0.02)
    assert not alive(pid)
    assert set((workdir / "runs" / "r" / "checkpoint.pt").read_text().split()) == {str(int(signal.SIGTERM))}


def test_a_closed_console_neither_stops_the_launcher_nor_its_runs(tmp_path):
    """The launcher's output piped into a reader that goes away (`| head -1`): the runs go on to their end, their
    output still in their logs, and the exit code is that of the runs."""
    chatty = "import sys\nfor i in range(3000): print(f'line {i}', flush=True)\nsys.exit(0 if sys.argv[-1] == '1' else 3)"
    args = ["--output-dir", str(tmp_path), "--env-ids", "A", "--seeds", "1", "2", "--", sys.executable, "-c", chatty]
    launcher = start_launcher(*args)
    launcher.stdout.readline()
    launcher.stdout.close()
    assert launcher.wait(timeout=60) == 1, launcher.stderr.read()
    assert "Traceback" not in launcher.stderr.read()
    for seed in (1, 2):
        assert "line 2999" in (tmp_path / "run" / f"A__{seed}" / "console.log").read_text()


def test_a_launcher_started_with_its_output_closed_still_runs_everything(tmp_path):
    launch_command = (
        f"{sys.executable} {LAUNCH} --output-dir {tmp_path} --env-ids A --seeds 1 -- {sys.executable} -c 'print(7)'"
    )
    result = subprocess.run(["bash", "-c", f"{launch_command} >&- 2>&-"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert (tmp_path / "run" / "A__1" / "console.log").read_text() == "7\n"


@pytest.mark.parametrize("folder", ["runs/CartPole-v1__pqn__1__1", "my runs/CartPole-v1__pqn__1__1"])
def test_the_run_folder_is_read_whole_from_the_start_up_block_even_with_spaces(folder):
    from helpers import import_file

    launcher = import_file(LAUNCH, "launch_under_test")
    line = f"  run directory: {folder}  (watch it: tensorboard --logdir 'my runs')\n"
    assert launcher.RUN_DIRECTORY.match(line)[1] == folder
    assert launcher.RUN_DIRECTORY.match(f"  run directory: {folder}\n")[1] == folder
