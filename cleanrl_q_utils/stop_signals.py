"""Stopping a run by signal. SIGINT, SIGTERM and SIGHUP (a closed terminal) ask the run to stop after the current
step with a checkpoint. A second Ctrl-C (SIGINT) exits at once, the last checkpoint intact; a repeated SIGTERM or
SIGHUP does not: programs send those, one stop can reach a process twice (GNU `timeout` signals the process and then
its process group), and programs that will not wait send SIGKILL. Any signal exits at once while nothing new can be
saved (the envs being replayed on resume) or after training. A run started under `nohup` keeps going when its
terminal closes, as nohup promises.

Output that cannot be written does not stop anything: once the console is gone (a closed pipe, as when `| tee log`
ends on the same Ctrl-C; a closed terminal after SIGHUP), the standard streams fall silent (`QuietWhenGone`), and the
run goes on to its checkpoint and its exit status as if it had been read.

Layer 2 (parts): imports no module of this package."""

import contextlib
import errno
import os
import signal
import sys
from typing import Callable

# What writing to a console that is gone fails with: EPIPE, a pipe whose reader has exited; EIO, a terminal closed.
CONSOLE_GONE = (errno.EPIPE, errno.EIO)


class QuietWhenGone:
    """sys.stdout or sys.stderr, whose writes and flushes drop the text, for the rest of the process, once the console
    is gone (CONSOLE_GONE), rather than raise into whatever printed: a signal handler, a run's last lines, the
    interpreter's final flush (which would turn the exit status into 120). Its file descriptor is pointed at
    /dev/null, so that what was buffered and what C code writes there go nowhere too. Everything else is the stream's.

    A print from a signal handler that interrupted a print of the same stream (Python's buffered streams refuse such
    a reentrant call) is dropped as well: a lost line is better than a run lost on it."""

    def __init__(self, stream):
        self.stream, self.gone = stream, False

    def write(self, text):
        if not self.gone:
            try:
                return self.stream.write(text)
            except (OSError, RuntimeError) as error:
                self.drop_or_raise(error)
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        if not self.gone:
            try:
                self.stream.flush()
            except (OSError, RuntimeError) as error:
                self.drop_or_raise(error)

    def drop_or_raise(self, error: Exception) -> None:
        if isinstance(error, RuntimeError) and "reentrant" in str(error):
            return
        if not isinstance(error, OSError) or error.errno not in CONSOLE_GONE:
            raise error
        self.gone = True
        with contextlib.suppress(OSError, ValueError, AttributeError):  # a stream without a descriptor (pytest's)
            descriptor, null = self.stream.fileno(), os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, descriptor)
            os.close(null)
            self.stream.flush()  # what the stream still buffered goes to /dev/null, not into the next flush's error

    def __getattr__(self, name):  # called only for what this class does not define
        if name == "stream":  # not set yet (a copy being made): not the stream's
            raise AttributeError(name)
        return getattr(self.stream, name)


def quiet_when_gone() -> Callable[[], None]:
    """Wraps sys.stdout and sys.stderr in `QuietWhenGone` (those not wrapped yet); returns what puts back the streams
    it wrapped, where they are still the wrapped ones."""
    wrapped = {}
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, QuietWhenGone):
            wrapped[name] = QuietWhenGone(stream)
            setattr(sys, name, wrapped[name])

    def put_back():
        for name, guard in wrapped.items():
            if getattr(sys, name) is guard:
                setattr(sys, name, guard.stream)
        wrapped.clear()

    return put_back


HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """The handlers of one run, installed on creation and given back by `restore`. The run reads `stop_requested` and
    `signum`; it sets `writing` (the temporary file of a checkpoint being written, else False), `replaying` and
    `training_done`, which decide how a signal is answered. `last_checkpoint()` names the file the messages point to.
    While they are installed the standard streams are `QuietWhenGone` (already so in a script, by quiet_start; here
    for a `main` called from Python)."""

    def __init__(self, last_checkpoint: Callable[[], str]):
        self.put_back_streams = quiet_when_gone()
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
            print(f"exiting on {name}: training had finished; the final evaluation is not done; last checkpoint: {last}")
            self.restore()
            raise SystemExit(128 + signum)
        if second_interrupt or self.replaying:  # nothing new to save yet while replaying: exit at once
            print(f"exiting at once on {name}; last good checkpoint: {last}")
            self.restore()
            raise SystemExit(128 + signum)
        if self.stop_requested:  # SIGTERM or SIGHUP again: the stop under way goes on
            return
        self.stop_requested = True
        print(f"{name}: stopping after this step, with a checkpoint; a second Ctrl-C exits at once")

    def restore(self) -> None:
        """Gives the previous handlers and streams back (once; later calls do nothing)."""
        self.put_back_streams()
        for sig, handler in self.previous_handlers.items():
            signal.signal(sig, handler)
        self.previous_handlers = {}
        if self.wakeup is not None:
            os.close(signal.set_wakeup_fd(self.previous_wakeup))
            os.close(self.wakeup)
            self.wakeup = None
