"""Imported first by every script, before the libraries that take seconds to load (torch, envpool).

When the script is the program being run, a SIGINT, SIGTERM or SIGHUP in those seconds ends it quietly with exit status
128 + the signal's number: Python's default prints a KeyboardInterrupt traceback for SIGINT. `training_run.Run` replaces
these handlers with its own while a run lives and puts them back after it.

From then on, output that cannot be written is dropped: sys.stdout and sys.stderr fall silent once their console is
gone (`stop_signals.QuietWhenGone`: a closed pipe, `--help | head` or `| tee log` ended by Ctrl-C; a terminal closed),
so that neither a run's checkpoint nor the exit status depends on whether anyone still reads them.

Imported by anything else (a test importing a script), it does nothing.

Layer 2 (parts): imports stop_signals.
"""

import os
import signal
import sys

from cleanrl_q_utils.stop_signals import quiet_when_gone


def exit_on_signal(signum, frame):
    # The process ends here, not by raising SystemExit: raised inside a library's import that C++ called back into
    # (torch's), it aborts the process (std::terminate), and some library code swallows it, so the run would go on.
    # Before `training_run.Run` takes the signals over, nothing of the run is written: there is nothing to clean up.
    print(f"exiting on {signal.Signals(signum).name}", flush=True)
    sys.stderr.flush()
    os._exit(128 + signum)


def imported_by_main_program() -> bool:
    frame = sys._getframe(2)  # above this function and the module body: the import machinery, then the importer
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    return frame is not None and frame.f_globals.get("__name__") == "__main__"


if imported_by_main_program():
    quiet_when_gone()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signum != signal.SIGHUP or signal.getsignal(signum) != signal.SIG_IGN:  # `nohup`: a closed terminal is ignored
            signal.signal(signum, exit_on_signal)
