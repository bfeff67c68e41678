"""Signals and full disks in every phase of a run, in child processes: what is printed, the exit status (128 + the
signal's number; 2 for a disk error), no traceback, no abort, no empty run folder, the last checkpoint intact."""

import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cleanrl_q_utils.checkpoint_files import read_checkpoint

from helpers import run_dir_of

ROOT = Path(__file__).resolve().parent.parent


def hangup_as_from_a_terminal() -> None:
    """A child's SIGHUP back to the default: under nohup (SIGHUP ignored, inherited) the scripts rightly go on through
    a hangup, which would fail the tests that send one however pytest was started."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def run_child(code: str, tmp_path, **popen):
    """A child process running `code` with the plumbing and the toy Args of toy_run.py imported."""
    head = f"""
        import sys, signal, time, torch
        sys.path.insert(0, {str(ROOT)!r})
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from cleanrl_q_utils import command_line, run_folder, training_run
        from toy_run import Args, SCRIPT
        from helpers import end_iteration
        sys.argv = ["toy"]
        """
    command = [sys.executable, "-c", textwrap.dedent(head) + textwrap.dedent(code)]
    popen.setdefault("preexec_fn", hangup_as_from_a_terminal)
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, text=True, **popen)


def wait_for_line(process, text: str) -> None:
    for line in process.stdout:
        if text in line:
            return
    pytest.fail(f"the child ended before printing {text!r}: {process.stderr.read()}")


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (the SigCgt mask of /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (signum - 1) & 1)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_the_libraries_load_exits_quietly(tmp_path, signum):
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "cleanrl" / "pqn.py"), "--total-timesteps", "1024"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=hangup_as_from_a_terminal,
    )
    deadline = time.time() + 30
    while not catches(process.pid, signal.SIGHUP):  # the script's first import has run
        assert time.time() < deadline and process.poll() is None
        time.sleep(0.005)
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, (out, err)
    assert "Traceback" not in err and f"exiting on {signal.Signals(signum).name}" in out
    assert not (tmp_path / "runs").exists()


def test_a_signal_while_the_libraries_load_ends_the_process_even_inside_code_that_catches_everything(tmp_path):
    # Library code that swallows every exception (or C++ that a raised SystemExit would abort) must not keep a run
    # going that was asked to stop while it loaded.
    process = run_child(
        """
        import cleanrl_q_utils.quiet_start
        try:
            signal.raise_signal(signal.SIGTERM)
        except BaseException:
            pass
        print("went on", flush=True)
        """,
        tmp_path,
    )
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM and "went on" not in out and "Traceback" not in err, (out, err)
    assert out.strip() == "exiting on SIGTERM"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_training_stops_after_the_step_with_a_checkpoint(tmp_path, signum):
    process = run_child(
        f"""
        def main(args):
            with training_run.Run(args, None, SCRIPT, 7) as run:
                for step in range(1, 100):
                    if step == 3:
                        signal.raise_signal({int(signum)})
                    if end_iteration(run, step, 1, step == 99, lambda: {{"step": step}}):
                        break
        main(command_line.parse(Args))
        """,
        tmp_path,
    )
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signum and "Traceback" not in err
    assert "stopping after this step, with a checkpoint" in out and "continue the run with" in out
    run_dir = run_dir_of(tmp_path)
    assert read_checkpoint(run_dir / "checkpoint.pt")["state"]["step"] == 3


def test_a_run_started_with_nohup_goes_on_through_a_hangup(tmp_path):
    process = run_child(
        """
        import cleanrl_q_utils.quiet_start
        def main(args):
            with training_run.Run(args, None, SCRIPT, 7) as run:
                for step in range(1, 10):
                    if step == 3:
                        signal.raise_signal(signal.SIGHUP)
                    if end_iteration(run, step, 1, step == 9, lambda: {"step": step}):
                        break
            print("ran to step", step)
        main(command_line.parse(Args))
        """,
        tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),  # what nohup does
    )
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0 and "ran to step 9" in out and "SIGHUP" not in out, (out, err)


def test_a_signal_after_training_exits_at_once_and_says_so_with_the_final_checkpoint_kept(tmp_path):
    process = run_child(
        """
        def main(args):
            with training_run.Run(args, None, SCRIPT, 7) as run:
                assert not end_iteration(run, 10, 10, True, lambda: {"x": 1})
                print("evaluating", flush=True)
                time.sleep(60)  # the final evaluation
                print("evaluation done", flush=True)
        sys.argv = ["toy", "--checkpoint-every", "5"]
        main(command_line.parse(Args))
        """,
        tmp_path,
    )
    wait_for_line(process, "evaluating")
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM and "Traceback" not in err
    assert "training had finished" in out and "stopping after this step" not in out and "evaluation done" not in out
    run_dir = run_dir_of(tmp_path)
    assert read_checkpoint(run_dir / "checkpoint.pt")["global_step"] == 10


def test_one_signal_sent_to_the_process_and_to_its_group_is_one_stop_request(tmp_path):
    """GNU `timeout` (and other supervisors) signal the process and then its process group: the run gets the same
    SIGTERM twice within microseconds. That is one request: the run stops after its step with a checkpoint. The
    child is busy inside one torch call, as a run is inside an env step or an update, so both arrive before the
    handler runs. The call is sized on the machine to last about two seconds: on a fast CPU a fixed size ends before
    the second signal, and the run, stopped and its handlers given back, would die of it."""
    process = run_child(
        """
        torch.set_num_threads(1)
        small = torch.ones(1500, 1500)
        start = time.perf_counter()
        small @ small
        size = min(8000, int(1500 * max(1.0, 2.0 / (time.perf_counter() - start)) ** (1 / 3)))
        big = torch.ones(size, size)
        with training_run.Run(Args(), None, SCRIPT, 7) as run:
            print("started", flush=True)
            big @ big  # the first step's work: both signals arrive inside this one call
            for step in range(1, 4):
                if end_iteration(run, step, 1, step == 3, lambda: {"x": step}):
                    break
        """,
        tmp_path,
        start_new_session=True,  # its own process group, as under `timeout`
    )
    try:
        wait_for_line(process, "started")
        os.kill(process.pid, signal.SIGTERM)  # what `timeout` does: the process, then its group
        time.sleep(0.02)  # two deliveries, not one merged pending signal, as when the child runs on a core of its own
        os.killpg(process.pid, signal.SIGTERM)
        out, err = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGTERM, out + err
    assert "stopping after this step, with a checkpoint" in out and "exiting at once" not in out
    assert read_checkpoint(run_dir_of(tmp_path) / "checkpoint.pt")["global_step"] == 1


def test_two_signals_while_a_run_starts_leave_no_run_folder(tmp_path):
    process = run_child(
        """
        def versions(script):
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            return {}
        run_folder.software_versions = versions
        def main(args):
            with training_run.Run(args, None, SCRIPT, 7):
                print("started", flush=True)
        main(command_line.parse(Args))
        """,
        tmp_path,
    )
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGINT and "Traceback" not in err and "started" not in out
    assert list((tmp_path / "runs").iterdir()) == []


def test_a_full_disk_while_logging_ends_in_one_line_with_status_2(tmp_path):
    def small_files():  # writes beyond 64 kB fail with EFBIG, as writes to a full disk fail with ENOSPC
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))

    process = run_child(
        """
        def main(args):
            with training_run.Run(args, None, SCRIPT, 7) as run:
                for step in range(1, 1_000_000):
                    run.writer.add_scalar("x", float(step), step)
                    if step % 1000 == 0:
                        run.writer.flush()
        main(command_line.parse(Args))
        """,
        tmp_path,
        preexec_fn=small_files,
    )
    out, err = process.communicate(timeout=120)
    assert process.returncode == 2 and "Traceback" not in err
    assert err.strip().splitlines() == ["error: writing failed: File too large; last good checkpoint: none written"]


def test_a_read_only_working_directory_is_refused_in_one_line():
    process = run_child("training_run.Run(command_line.parse(Args), None, SCRIPT, 7)", "/sys")  # read-only
    out, err = process.communicate(timeout=60)
    assert process.returncode == 2 and err.strip().startswith("error: cannot create the run folder runs/")
    assert len(err.strip().splitlines()) == 1


def test_the_launcher_refuses_a_folder_it_cannot_write_and_a_seed_given_twice(tmp_path):
    launch = [sys.executable, str(ROOT / "benchmark" / "launch.py"), "--env-ids", "CartPole-v1"]
    for extra, message in [
        (["--seeds", "1", "--output-dir", "/sys/sweep"], "error: --output-dir=/sys/sweep: the runs cannot write there"),
        (["--seeds", "1", "2", "1"], "error: --seeds=1 2 1: 1 is given twice"),
    ]:
        done = subprocess.run([*launch, *extra, "--", "python", "x.py"], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr.strip().startswith(message), done.stderr
