"""What a run reports while it trains: true game scores of vectorized envs (`EpisodeStats`: whole episodes, unclipped,
envpool's reset step excluded) and the console's progress line with its time-left estimate (`Progress`).

Layer 2 (parts): imports no module of this package."""

import time
from collections import deque
from typing import Optional

import numpy as np


def format_duration(seconds: float) -> str:
    """`3 days 08:35:58`, or `08:35:58` under a day."""
    seconds = int(max(seconds, 0))
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days} day{'s' if days > 1 else ''} {clock}" if days else clock


class EpisodeStats:
    """True game scores of vectorized envs: rewards summed over whole episodes (unclipped, time-outs included).
    envpool's reset step (the step after an episode end, which only resets) counts toward no episode."""

    def __init__(self, num_envs: int, window: int = 100):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.scores: list[float] = []  # every finished episode, in order
        self.recent = deque(maxlen=window)

    def update(self, reward, is_reset_step, episode_over, writer=None, global_step: int = 0) -> list[tuple[float, int]]:
        """Adds one vectorized step; logs and returns (score, length) of every episode that ended with it."""
        self.returns += np.where(is_reset_step, 0.0, reward)
        self.lengths += ~is_reset_step
        finished = [(float(self.returns[i]), int(self.lengths[i])) for i in np.flatnonzero(episode_over)]
        self.returns[episode_over], self.lengths[episode_over] = 0.0, 0
        for score, length in finished:
            self.scores.append(score)
            self.recent.append(score)
            if writer is not None:
                writer.add_scalar("charts/episodic_return", score, global_step)
                writer.add_scalar("charts/episodic_length", length, global_step)
        return finished

    def drop_games_in_progress(self) -> None:
        """Forgets the partial scores of the games in progress (a resume with fresh games drops them)."""
        self.returns[:], self.lengths[:] = 0.0, 0

    def state_dict(self) -> dict:
        return {"returns": self.returns.copy(), "lengths": self.lengths.copy(), "scores": list(self.scores)}

    def load_state_dict(self, state: dict) -> None:
        self.returns[:], self.lengths[:], self.scores[:] = state["returns"], state["lengths"], state["scores"]
        self.recent.clear()
        self.recent.extend(self.scores[-self.recent.maxlen :])


class Progress:
    """The console line of a long run, at most every `interval` seconds: steps, percent done, SPS, recent return and
    time left. The time left comes from the rate since learning started (at `learning_starts`): the steps before it
    only act and run much faster, so a rate that counted them would promise too little time. Until learning starts
    the line says when the warm-up ends (its remaining steps at the acting time per step measured so far) and the
    whole run's estimate from a start-up timing: a script that timed its update before the loop gives
    `seconds_per_update` and `updates_per_step` (updates per agent step once learning runs), and the run takes its
    remaining steps at the measured acting time plus, for every step after the warm-up, `updates_per_step` timed
    updates. The line marks it "updates timed at start-up" until the rate measured since learning started replaces
    it. Without a start-up timing the line gives a lower bound instead, all remaining steps at the acting time ("at
    least", updates not yet timed). A script whose updates are few and long (one per hundreds or thousands of agent
    steps, and only once whole sequences are stored) also gives its update count to `print`: the time left is then the
    remaining steps at the measured acting time per step plus the remaining updates at the measured time per update,
    known from the first update on. `slow_hint`, when given, is printed once: with the first bound or estimate that
    says the run takes over a day more, else never."""

    def __init__(
        self,
        total_timesteps: int,
        start_step: int,
        learning_starts: int = 0,
        interval: float = 10.0,
        slow_hint=None,
        updates_per_step: float = 0.0,
        seconds_per_update: Optional[float] = None,
    ):
        self.total, self.start_step, self.interval, self.slow_hint = total_timesteps, start_step, interval, slow_hint
        self.start_time = self.last_print = time.time()
        self.learning_starts, self.origin = learning_starts, None  # origin: (step, time) of the rate's first point
        self.updates_per_step, self.last_call = updates_per_step, None  # last_call: (step, updates, time)
        self.seconds_per_update = seconds_per_update  # timed by the script before its loop, on a synthetic batch
        # time spent between calls without an update (acting), and between calls with updates (and their steps)
        self.act_steps = self.act_seconds = self.updates_timed = self.update_seconds = self.update_call_steps = 0
        self.warm_up = None  # (first step, its time, last step, its time) of the calls before learning starts

    def sps(self, global_step: int) -> int:
        return int((global_step - self.start_step) / max(time.time() - self.start_time, 1e-9))

    def count(self, global_step: int, updates: int, now: float) -> None:
        """Adds the time since the last call to the acting time, or to the updates' time if updates were made."""
        last, self.last_call = self.last_call, (global_step, updates, now)
        if last is None or global_step <= self.learning_starts:
            return
        if updates == last[1]:
            self.act_steps, self.act_seconds = self.act_steps + global_step - last[0], self.act_seconds + now - last[2]
        else:
            self.updates_timed += updates - last[1]
            self.update_seconds += now - last[2]
            self.update_call_steps += global_step - last[0]

    def time_left(self, global_step: int) -> Optional[float]:
        """Seconds left at the rate since learning started; None before a rate is known."""
        if self.last_call is not None and not self.updates_timed:  # the script counts its updates: none timed yet
            return None
        # Acting and updating timed apart, once a step without an update was seen; a run that updates at every step
        # (a replay ratio high enough for its number of envs) has no acting-only step: its rate is measured whole.
        if self.last_call is not None and self.act_steps and self.act_seconds:
            per_step = self.act_seconds / self.act_steps  # the acting steps of calls with updates are not update time
            per_update = max(self.update_seconds - self.update_call_steps * per_step, 0.0) / self.updates_timed
            return (self.total - global_step) * (per_step + self.updates_per_step * per_update)
        if self.origin is None:
            return None
        steps, seconds = global_step - self.origin[0], time.time() - self.origin[1]
        return (self.total - global_step) * seconds / steps if steps > 0 and seconds > 0 else None

    def acting_seconds_per_step(self) -> Optional[float]:
        """Seconds per agent step between the calls before learning starts, while the run only acts; None until two
        such calls, and in a run that starts learning at once (a resume with its replay)."""
        if self.warm_up is None:
            return None
        first_step, first_time, last_step, last_time = self.warm_up
        steps, seconds = last_step - first_step, last_time - first_time
        return seconds / steps if steps > 0 and seconds > 0 else None

    def warm_up_left(self, global_step: int) -> Optional[float]:
        """Seconds until learning starts, at the acting time per step measured so far."""
        per_step = self.acting_seconds_per_step()
        return None if per_step is None else max(self.learning_starts - global_step, 0) * per_step

    def at_least(self, global_step: int) -> Optional[float]:
        """A lower bound of the time left: every remaining step at the warm-up's acting time, no update counted."""
        per_step = self.acting_seconds_per_step()
        return None if per_step is None else (self.total - global_step) * per_step

    def start_up_estimate(self, global_step: int) -> Optional[float]:
        """Seconds left from the acting time per step measured in the warm-up and the update timed at start-up: every
        remaining step acts, and every step from learning_starts on also trains for updates_per_step updates."""
        per_step = self.acting_seconds_per_step()
        if per_step is None or self.seconds_per_update is None:
            return None
        training_steps = self.total - max(global_step, self.learning_starts)
        return (self.total - global_step) * per_step + training_steps * self.updates_per_step * self.seconds_per_update

    def print(self, global_step: int, recent_scores, force: bool = False, updates: Optional[int] = None) -> None:
        now = time.time()
        if updates is not None:
            self.count(global_step, updates, now)
        self.time_warm_up(global_step, now)
        if self.origin is None and global_step >= self.learning_starts:
            self.origin = (global_step, now)
        if not force and now - self.last_print < self.interval:
            return
        self.last_print = now
        sps, mean = self.sps(global_step), np.mean(recent_scores) if len(recent_scores) else float("nan")
        left, bound = self.time_left(global_step), self.at_least(global_step)
        start_up = self.start_up_estimate(global_step) if left is None else None
        if start_up is not None:
            bound = None  # the estimate says more than the bound, which leaves the updates out
        if global_step >= self.total:
            eta = "done"
        elif left is not None:
            eta = f"ETA {format_duration(left)}"
        elif global_step < self.learning_starts:
            warm_up = self.warm_up_left(global_step)
            ends = f" in {format_duration(warm_up)}" if warm_up is not None else ""
            eta = f"warming up (learning starts at step {self.learning_starts}{ends})"
            if start_up is not None:
                eta += f"; ETA {format_duration(start_up)} (updates timed at start-up)"
            elif bound is not None:
                eta += f"; ETA at least {format_duration(bound)}, updates not yet timed"
        elif start_up is not None:  # learning started, its rate not yet measured
            eta = f"ETA {format_duration(start_up)} (updates timed at start-up)"
        else:  # learning started; with updates counted, the first update has not yet been timed
            eta = "ETA after the first update" if self.last_call is not None and not self.updates_timed else "ETA measuring"
            if bound is not None:
                eta += f" (at least {format_duration(bound)})"
        print(
            f"step {global_step:>9}/{self.total} ({100 * global_step / self.total:5.1f}%) | SPS {sps:>6} | "
            f"return(100) {mean:8.2f} | {eta}"
        )
        slow = next((x for x in (left, start_up, bound) if x is not None), None) if global_step < self.total else None
        if self.slow_hint and slow is not None and slow > 86400:
            if left is not None:
                speed, more = "since learning began", "takes"
            elif start_up is not None:
                speed, more = "so far and the update timed at start-up", "takes about"
            else:
                speed, more = "so far, acting alone (no update counted)", "takes at least"
            print(f"warning: at the speed measured {speed} this run {more} {format_duration(slow)} more; {self.slow_hint}")
            self.slow_hint = None
        elif left is not None:  # a bound under a day says nothing yet: the hint waits for the estimate
            self.slow_hint = None

    def time_warm_up(self, global_step: int, now: float) -> None:
        """Takes the first call as the warm-up's first point and every call up to learning_starts as its last."""
        if self.warm_up is None and global_step < self.learning_starts:
            self.warm_up = (global_step, now, global_step, now)
        elif self.warm_up is not None and global_step <= self.learning_starts:
            self.warm_up = (*self.warm_up[:2], global_step, now)
