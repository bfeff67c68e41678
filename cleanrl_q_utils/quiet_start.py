"""Imported first by every script, before the libraries that take seconds to load (torch, envpool).

When the script is the program being run, a SIGINT, SIGTERM or SIGHUP in those seconds ends it quietly with exit status
128 + the signal's number: Python's default prints a KeyboardInterrupt traceback for SIGINT. `plumbing.Run` replaces
these handlers with its own while a run lives and puts them back after it. Imported by anything else (a test importing
a script), it does nothing.
"""

import signal
import sys


def exit_on_signal(signum, frame):
    print(f"exiting on {signal.Signals(signum).name}", flush=True)
    raise SystemExit(128 + signum)


def imported_by_main_program() -> bool:
    frame = sys._getframe(2)  # above this function and the module body: the import machinery, then the importer
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    return frame is not None and frame.f_globals.get("__name__") == "__main__"


if imported_by_main_program():
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, exit_on_signal)
