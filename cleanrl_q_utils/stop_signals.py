"""Stopping a run by signal. SIGINT, SIGTERM and SIGHUP (a closed terminal) ask the run to stop after the current
step with a checkpoint. A second Ctrl-C (SIGINT) exits at once, the last checkpoint intact; a repeated SIGTERM or
SIGHUP does not: programs send those, one stop can reach a process twice (GNU `timeout` signals the process and then
its process group), and programs that will not wait send SIGKILL. Any signal exits at once while nothing new can be
saved (the envs being replayed on resume) or after training. A run started under `nohup` keeps going when its
terminal closes, as nohup promises."""

import contextlib
import os
import signal
from typing import Callable

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """The handlers of one run, installed on creation and given back by `restore`. The run reads `stop_requested` and
    `signum`; it sets `writing` (the temporary file of a checkpoint being written, else False), `replaying` and
    `training_done`, which decide how a signal is answered. `last_checkpoint()` names the file the messages point to."""

    def __init__(self, last_checkpoint: Callable[[], str]):
        self.last_checkpoint, self.signum = last_checkpoint, None
        self.stop_requested = self.replaying = self.writing = self.training_done = False
        handled = [sig for sig in HANDLED_SIGNALS if sig != signal.SIGHUP or signal.getsignal(sig) != signal.SIG_IGN]
        self.previous_handlers = {sig: signal.signal(sig, self.on_signal) for sig in handled}
        # Python runs a handler once for signals that arrive during one long C call (say, copying a large replay);
        # the wakeup pipe gets a byte (the signal's number) for every one, so two Ctrl-Cs are never taken for one.
        self.wakeup, wakeup_write = os.pipe()
        os.set_blocking(self.wakeup, False)
        os.set_blocking(wakeup_write, False)
        self.previous_wakeup = signal.set_wakeup_fd(wakeup_write)

    def on_signal(self, signum, frame):
        self.signum, name = signum, signal.Signals(signum).name
        interrupts = int(signum == signal.SIGINT)
        with contextlib.suppress(BlockingIOError):
            interrupts = os.read(self.wakeup, 64).count(signal.SIGINT)
        second_interrupt = signum == signal.SIGINT and (self.stop_requested or interrupts > 1)
        last = self.last_checkpoint() or "none"
        if self.writing and second_interrupt:
            # A checkpoint is being written by another thread, inside torch: the process ends now, without the
            # interpreter's shutdown (which would abort that thread); the temporary file is removed by the writer's
            # caller never returning, so it is removed here. The logs were flushed before the write began.
            with contextlib.suppress(OSError):
                os.remove(self.writing)
            print(f"exiting at once on {name}, during a checkpoint write; last good checkpoint: {last}", flush=True)
            os._exit(128 + signum)
        if self.training_done:
            self.restore()
            print(f"exiting on {name}: training had finished; the final evaluation is not done; last checkpoint: {last}")
            raise SystemExit(128 + signum)
        if second_interrupt or self.replaying:  # nothing new to save yet while replaying: exit at once
            self.restore()
            print(f"exiting at once on {name}; last good checkpoint: {last}")
            raise SystemExit(128 + signum)
        if self.stop_requested:  # SIGTERM or SIGHUP again: the stop under way goes on
            return
        self.stop_requested = True
        print(f"{name}: stopping after this step, with a checkpoint; a second Ctrl-C exits at once")

    def restore(self) -> None:
        """Gives the previous handlers back (once; later calls do nothing)."""
        for sig, handler in self.previous_handlers.items():
            signal.signal(sig, handler)
        self.previous_handlers = {}
        if self.wakeup is not None:
            os.close(signal.set_wakeup_fd(self.previous_wakeup))
            os.close(self.wakeup)
            self.wakeup = None
