"""Output that cannot be written, and commands printed for pasting: a run whose output pipe closes (`| tee log` ended
by the same Ctrl-C) or whose terminal is gone (a dropped ssh session: SIGHUP, then EIO on every write) still writes
its checkpoint and exits with 128 + the signal's number, without a traceback; `--help` into a closed pipe exits 0;
the printed resume line, pasted into a shell, runs exactly the resume; a run name a shell would read is refused."""

import importlib.util
import os
import pty
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from benchmark_runs import script_env
from test_signals import hangup_as_from_a_terminal
from toy_run import Args

from cleanrl_q_utils import command_line, stop_signals, training_run
from cleanrl_q_utils.checkpoint_files import read_checkpoint
from cleanrl_q_utils.flag_checks import check_common_flags

from helpers import REPO, end_iteration, run_dir_of
from tiny import tiny

SCRIPTS = sorted(path.stem for path in (REPO / "cleanrl").glob("*.py") if path.stem != "__init__")


def command_of(script: str, **overrides) -> list[str]:
    """The command line of `script`'s tiny run, made long (it is stopped by a signal) and checkpointing only then."""
    flags = tiny(script, total_timesteps=10**6, checkpoint_every=0, **overrides)
    words = [sys.executable, str(REPO / "cleanrl" / f"{script}.py")]
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        words += [flag if value else f"--no-{flag[2:]}"] if isinstance(value, bool) else [flag, str(value)]
    return words


def wait_for_run_folder(process, tmp_path, console=None) -> None:
    """Waits until the run's folder exists, after which its signal handlers are in place; reads `console` (the pty's
    side of a terminal) meanwhile, as a terminal would, so that the run never waits on a full terminal."""
    deadline = time.time() + 60
    while not (tmp_path / "runs").is_dir() or not any((tmp_path / "runs").iterdir()):
        assert process.poll() is None, process.communicate()
        assert time.time() < deadline, "the run did not start within 60 s"
        if console is not None and select.select([console], [], [], 0.02)[0]:
            os.read(console, 65536)
        time.sleep(0.02)


def assert_stopped_with_a_checkpoint(process, tmp_path, signum) -> None:
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert read_checkpoint(run_dir_of(tmp_path) / "checkpoint.pt")["global_step"] > 0


@pytest.mark.parametrize("script", ["pqn", "dqn_dueling_per"])
@pytest.mark.parametrize("buffered", [False, True], ids=["unbuffered", "buffered"])
def test_ctrl_c_after_the_output_pipe_closed_still_writes_the_checkpoint_and_exits_130(script, buffered, tmp_path):
    # Unbuffered (python -u, PYTHONUNBUFFERED), the stop message itself meets the closed pipe; buffered, the
    # interpreter's last flush does, which would turn the exit status into 120.
    env = script_env()
    if buffered:
        del env["PYTHONUNBUFFERED"]
    reader, writer = os.pipe()
    process = subprocess.Popen(
        command_of(script),
        cwd=tmp_path,
        stdout=writer,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=hangup_as_from_a_terminal,
    )
    os.close(writer)
    try:
        wait_for_run_folder(process, tmp_path)
        os.close(reader)  # `tee` ended by the same Ctrl-C
        process.send_signal(signal.SIGINT)
        assert_stopped_with_a_checkpoint(process, tmp_path, signal.SIGINT)
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize("script", ["pqn", "dqn_dueling_per"])
def test_a_hangup_after_the_terminal_closed_still_writes_the_checkpoint_and_exits_129(script, tmp_path):
    console, terminal = pty.openpty()
    process = subprocess.Popen(
        command_of(script),
        cwd=tmp_path,
        stdout=terminal,
        stderr=subprocess.PIPE,
        text=True,
        env=script_env(),
        preexec_fn=hangup_as_from_a_terminal,
    )
    os.close(terminal)
    try:
        wait_for_run_folder(process, tmp_path, console)
        os.close(console)  # the terminal is gone: every write to it now fails with EIO
        process.send_signal(signal.SIGHUP)
        assert_stopped_with_a_checkpoint(process, tmp_path, signal.SIGHUP)
    finally:
        if process.poll() is None:
            process.kill()


# Each script's --help, run as the program (`__main__`) with its output into a closed pipe, in a child forked from one
# process that has imported the libraries once (a fraction of a second each rather than the seconds of torch's import).
# A child ends as the interpreter does, but for its slow clean-up of torch: it flushes sys.stdout and sys.stderr (a
# failure there is the exit status 120) and exits with the status of SystemExit. Prints "path status" per script.
HELP_INTO_A_CLOSED_PIPE = """
import importlib, os, pkgutil, runpy, sys, traceback
import cleanrl_q_utils, envpool, tyro
for module in pkgutil.iter_modules(cleanrl_q_utils.__path__):
    if module.name != "quiet_start":  # imported by each script, as its program, for the first time
        importlib.import_module(f"cleanrl_q_utils.{module.name}")
for module in ("stable_baselines3", "sb3_contrib"):
    if importlib.util.find_spec(module):
        importlib.import_module(module)
reader, writer = os.pipe()
os.close(reader)
for path, errors in zip(sys.argv[1::2], sys.argv[2::2]):
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.dup2(writer, 1)
        os.dup2(os.open(errors, os.O_WRONLY | os.O_CREAT), 2)
        sys.argv, status = [path, "--help"], 0
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as stop:
            status = stop.code or 0
        except BaseException:
            traceback.print_exc()
            status = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                traceback.print_exc(file=sys.__stderr__)
                status = 120
        os._exit(status)
    print(path, os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def test_help_into_a_closed_pipe_exits_0_without_a_traceback_in_every_script(tmp_path):
    paths = [REPO / "cleanrl" / f"{script}.py" for script in SCRIPTS]
    if importlib.util.find_spec("stable_baselines3") and importlib.util.find_spec("sb3_contrib"):
        paths.append(REPO / "benchmark" / "sb3_baselines.py")
    argv = [word for path in paths for word in (str(path), str(tmp_path / f"{path.stem}.err"))]
    done = subprocess.run(
        [sys.executable, "-c", HELP_INTO_A_CLOSED_PIPE, *argv], cwd=tmp_path, capture_output=True, text=True, env=script_env()
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{path} 0" for path in paths]
    for path in paths:
        assert (tmp_path / f"{path.stem}.err").read_text() == "", path.name


class Gone:
    """A console whose reader is gone: every write and flush fails as a closed pipe's does."""

    def __init__(self):
        self.writes = 0

    def write(self, text):
        self.writes += 1
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_console_that_is_gone_falls_silent_and_other_errors_still_raise():
    gone = Gone()
    quiet = stop_signals.QuietWhenGone(gone)
    assert quiet.write("a line\n") == len("a line\n")
    quiet.flush()
    quiet.write("another\n")
    assert gone.writes == 1  # silent from the first failure on, without trying again
    full = stop_signals.QuietWhenGone(Gone())
    full.stream.write = lambda text: (_ for _ in ()).throw(OSError(28, "No space left on device"))
    with pytest.raises(OSError, match="No space"):
        full.write("x")


def test_a_print_from_a_signal_handler_inside_another_print_is_dropped_and_output_goes_on():
    written = []

    class Busy:  # what Python's buffered stream says to a signal handler's print in the middle of another print
        def write(self, text):
            if text == "from the handler\n":
                raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stdout>'>")
            written.append(text)

    quiet = stop_signals.QuietWhenGone(Busy())
    quiet.write("from the handler\n")
    quiet.write("next line\n")
    assert written == ["next line\n"] and not quiet.gone


def test_a_run_called_from_python_is_not_lost_to_a_closed_console(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdout", Gone())
    with pytest.raises(SystemExit) as stop, training_run.Run(Args(), None, "/somewhere/cleanrl/toy.py", 7) as run:
        signal.raise_signal(signal.SIGINT)  # its message goes to the closed console
        assert end_iteration(run, 1, 1, False, lambda: {"x": 1})
    assert stop.value.code == 128 + signal.SIGINT
    assert read_checkpoint(run_dir_of(tmp_path) / "checkpoint.pt")["global_step"] == 1
    assert isinstance(sys.stdout, Gone)  # the run gave the stream back


def test_the_printed_resume_line_pasted_into_a_shell_runs_exactly_the_resume(tmp_path, monkeypatch, capsys):
    # Folders above the run may hold any character: a space, quotes, a `;`, a `$(...)`.
    where = tmp_path / "my runs; $(touch PWNED) 'quoted' \"double\""
    where.mkdir()
    monkeypatch.chdir(where)
    script = str(where / "cleanrl" / "toy.py")
    with pytest.raises(SystemExit), training_run.Run(Args(exp_name="a=b,c@d+e.f-g_h"), None, script, 7) as run:
        signal.raise_signal(signal.SIGINT)
        assert end_iteration(run, 1, 1, False, lambda: {"x": 1})
    line = capsys.readouterr().out.splitlines()[-1].strip()
    checkpoint = str(where / run_dir_of() / "checkpoint.pt")
    expected = ["python", script, "--resume", checkpoint]
    assert shlex.split(line) == expected
    # What a shell makes of it: `python` here prints its arguments, one per NUL.
    pasted = subprocess.run(["sh", "-c", f"python() {{ printf '%s\\0' \"$@\"; }}; {line}"], capture_output=True, text=True)
    assert pasted.stdout.split("\0")[:-1] == expected[1:]
    assert not list(tmp_path.rglob("PWNED"))


@pytest.mark.parametrize("name", ["x;touch PWNED;y", "a b", "$(id)", "-x", "it's", "café", "a|b", "."])
def test_an_exp_name_a_shell_or_a_file_system_would_read_is_refused_in_one_line(name):
    with pytest.raises(SystemExit) as refusal:
        check_common_flags(Args(exp_name=name))
    message = str(refusal.value.code)
    assert message.startswith(f"error: --exp-name={name}: must be a plain name") and "\n" not in message


def test_a_checkpoint_whose_run_name_a_shell_would_read_is_not_resumed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with training_run.Run(Args(), None, "/somewhere/cleanrl/toy.py", 7) as run:
        run.name = "CartPole-v1__x;touch PWNED__1__1"
        path = run.save(1, {"x": 1}, learned=())
    with pytest.raises(SystemExit, match="its run name .* is not a folder name"):
        command_line.resume(Args(resume=path), "/somewhere/cleanrl/toy.py", 7)


def test_sb3_baselines_interrupted_while_it_loads_exits_130_quietly(tmp_path):
    pytest.importorskip("stable_baselines3")
    from test_signals import catches

    process = subprocess.Popen(
        [sys.executable, str(REPO / "benchmark" / "sb3_baselines.py"), "--algo", "dqn"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=script_env(),
        preexec_fn=hangup_as_from_a_terminal,
    )
    deadline = time.time() + 30
    while not catches(process.pid, signal.SIGHUP):  # its first import has run
        assert time.time() < deadline and process.poll() is None
        time.sleep(0.005)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGINT and "Traceback" not in err, (out, err)
    assert list(Path(tmp_path).iterdir()) == []


def test_the_launcher_whose_console_closed_still_runs_every_run_to_its_end_and_logs_it(tmp_path):
    # A run prints more than a pipe holds (64 KiB): were the launcher to stop echoing at the closed console, the run
    # would block on its full pipe, and its log would stop.
    lines = "import sys\nfor i in range(4000): print(f'line {i:05d} of a run', sys.argv[-1], '.' * 40)"
    command = [sys.executable, str(REPO / "benchmark" / "launch.py"), "--env-ids", "CartPole-v1", "--seeds", "1", "2"]
    command += ["--log-dir", str(tmp_path / "logs"), "--", sys.executable, "-c", lines]
    reader, writer = os.pipe()
    os.close(reader)
    done = subprocess.run(command, cwd=tmp_path, stdout=writer, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(writer)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    for seed in (1, 2):
        log = (tmp_path / "logs" / f"CartPole-v1__{seed}.log").read_text().splitlines()
        assert len(log) == 4000 and log[-1].startswith("line 03999 of a run"), log[-3:]
