"""The life of one training run, as a script's `main` writes it. The script calls the package and gets values back;
the package never receives a function of the script:

    if args.eval_only:  # --eval-only --model-path: rebuild a saved agent and evaluate it, no training
        args, weights = model_files.read_for_evaluation(args, __file__)  # the model file's flags and weights
        validate_args(args)
        device, video_folder = model_files.start_evaluation(args, __file__)
        return model_files.report_evaluation(args, evaluate(weights, args, device, video_folder), video_folder)
    args, checkpoint = command_line.resume(args, __file__, CHECKPOINT_FORMAT)  # --resume: the checkpoint, its flags
    memory = validate_args(args)  # flag ranges (flag_checks), the script's own cross-flag rules, the memory it needs
    with training_run.Run(args, checkpoint, __file__, CHECKPOINT_FORMAT, memory=memory) as run:  # start-up block, logs
        ...build envs, networks, buffers on run.device (the generators are seeded)...
        def checkpoint_state(iterations_done): return dict(q_network=q_network.state_dict(), ...)  # plain values
        if checkpoint:
            with run.restoring() as saved:  # the saved plain values; the generators are restored on leaving
                q_network.load_state_dict(saved["q_network"]) ...  # the script fills its own objects
            envs, obs = run.fast_forward(envs, action_log, obs, stats)
        progress = run.progress(global_step)
        for ...:
            ...each update returns torch.isfinite(grad_norm); updates_finite &= it, on the device...
            if logging: run.check_finite(updates_finite, global_step)  # the NaN stop, one read per log line
            if run.checkpoint_due(global_step, steps_this_iteration, is_last):
                run.save(global_step, checkpoint_state(iteration + 1), learned=("q_network", "optimizer"))
            if run.stopped:  # a signal asked to stop; the checkpoint just written says how to continue
                break
        if args.save_model and not run.stopped and (model_path := run.save_model(q_network.state_dict())):
            run.log_evaluation(model_path, evaluate(q_network.state_dict(), args, device, run.video_folder))
        run.finish(stats.scores)  # the summary line

`Run` holds the run folder and its lock, the TensorBoard writer (W&B with --track), the signal handlers and the
checkpoints; a run stopped by a signal leaves the block with SystemExit(128 + the signal's number).

Layer 4 (run plumbing): imports flag_errors, checkpoint_files, episode_scores, stop_signals, environments, run_folder
and model_files."""

import contextlib
import os
import shlex
import shutil
import threading
import time
from typing import Optional

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter

from cleanrl_q_utils import checkpoint_files, environments, episode_scores, model_files, run_folder, stop_signals
from cleanrl_q_utils.flag_errors import flag_error


class Run:
    """One training run: name and directory, TensorBoard writer (synced to W&B with --track), the signal handlers,
    and its checkpoints. Use it as a context manager: leaving the block, however, restores the previous signal
    handlers, closes the logs and releases the run folder's lock (tests call `main` in-process: nothing must leak).

    A run writes only into its own folder: runs/<run name>, or for a resume the folder `resumed_run_dir` names; the
    folder is locked while the run lives. A signal (SIGINT, SIGTERM, SIGHUP) during training stops the run after the
    current step with a checkpoint; a second Ctrl-C exits at once, the last checkpoint intact; after training (the
    model file, the evaluation, the video) it exits at once, the final checkpoint written. Either way the run ends
    with SystemExit(128 + the signal's number), when leaving the block after a stop; `main` called from Python too."""

    def __init__(self, args, checkpoint: Optional[dict], script: str, checkpoint_format: int, cpu_threads=None, memory=None):
        """`memory`: what flag_checks.check_run_memory checked (validate_args returns it), said in the start-up block."""
        self.args, self.checkpoint, self.format, self.memory = args, checkpoint, checkpoint_format, memory
        self.script = os.path.abspath(script)
        self.start_time, self.eval_scores, self.lock, self.writer = time.time(), None, None, None
        self.learn_from = None  # set by note_empty_replay: the step learning resumes after
        self.training_done_after_save = False  # set by checkpoint_due
        self.stopped, self.created, self.last_checkpoint, self.dir = False, False, None, None
        self.global_step = self.start_step = checkpoint["global_step"] if checkpoint else 0  # last step checkpoint_due saw
        # The step at which the current envs started their first games: 0, or that of the last --resume-fresh-envs.
        # They are seeded with seed + that step (envpool takes 31-bit seeds), so that new games are not the first ones.
        fresh = checkpoint is not None and args.resume_fresh_envs
        self.envs_start = self.global_step if fresh else checkpoint.get("envs_start", 0) if checkpoint else 0
        self.env_seed = (args.seed + self.envs_start) % 2**31
        self.device = run_folder.pick_device(args.cuda, cpu_threads)
        self.wandb_id = checkpoint["wandb_id"] if checkpoint else None
        self.signals = stop_signals.StopSignals(lambda: self.last_checkpoint)
        # TensorBoard writes from a thread of its own, which prints a traceback when the disk is full before the
        # error reaches this thread (and `__exit__`, which says it in one line).
        self.previous_excepthook, threading.excepthook = threading.excepthook, self._thread_exception
        try:
            self.name, self.dir, self.created, self.lock = run_folder.open_run_folder(args, checkpoint)
            self.checkpoint_path = f"{self.dir}/checkpoint.pt"
            self.last_checkpoint = args.resume if checkpoint else None  # the newest one, checked by open_run_folder
            self.start_logs(checkpoint)
        except BaseException as error:  # a signal or an error while starting: nothing of this run is left half made
            self.__exit__(type(error), error, None)
            raise
        # Seeded last, just before the script builds its envs and networks: those draws repeat with the seed.
        run_folder.seed_everything(args.seed, getattr(args, "torch_deterministic", True))

    def start_logs(self, checkpoint: Optional[dict]) -> None:
        args = self.args
        setting = {"device": run_folder.describe_device(self.device, args.cuda), **run_folder.software_versions(self.script)}
        run_folder.print_start_block(args, self.script, self.dir, self.checkpoint, self.device, setting, self.memory)
        if args.track:
            import wandb

            run = dict(project=args.wandb_project_name, entity=args.wandb_entity, name=self.name, id=self.wandb_id)
            config = {**vars(args), **setting}
            wandb.init(**run, sync_tensorboard=True, config=config, save_code=True, resume="allow")
            self.wandb_id = wandb.run.id
        # Everything up to the checkpoint's step was logged before it was written; what the interrupted run logged
        # after it is dropped, so that the resumed run does not log those steps twice.
        self.writer = SummaryWriter(self.dir, purge_step=checkpoint["global_step"] + 1 if checkpoint else None)
        if checkpoint is None:
            rows = "\n".join(f"|{key}|{value}|" for key, value in {**vars(args), **setting}.items())
            self.writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + rows)

    def progress(
        self, start_step: int, updates_per_step: float = 0.0, seconds_per_update: Optional[float] = None
    ) -> episode_scores.Progress:
        """The progress line of this run, its time left measured from the step learning (re)starts at (for a script that
        also gives its update count to `print`: from the acting time per step and the time per update, see `Progress`).
        Until then the line says the warm-up's end and the whole run's estimate from `seconds_per_update`, the script's
        update timed before its loop, and `updates_per_step`, its updates per agent step once learning runs (without a
        timing: a lower bound of the run). Atari on a CPU warns with the first estimate or bound if the run would take
        over a day more."""
        slow = self.device.type == "cpu" and self.args.env_id.endswith("-v5")
        learning_starts = self.learn_from or getattr(self.args, "learning_starts", 0)
        hint = run_folder.slow_hint(self.script) if slow else None
        return episode_scores.Progress(
            self.args.total_timesteps,
            start_step,
            learning_starts,
            slow_hint=hint,
            updates_per_step=updates_per_step,
            seconds_per_update=seconds_per_update,
        )

    def note_empty_replay(self, learn_from: int) -> None:
        """Says, on a resume without --checkpoint-replay, that the replay restarts empty and when learning resumes."""
        self.learn_from = learn_from
        print(
            f"resume: the replay was not saved (--checkpoint-replay was off): it refills from empty, and learning "
            f"resumes at step {learn_from}"
        )

    def save_model(self, weights: dict) -> Optional[str]:
        """--save-model at the end of training: writes `weights` (the network's state_dict) with every flag of the run to
        the run folder; returns the model file's path, or None when a signal asked to stop before training ended (the
        checkpoint is then unchanged and the evaluation skipped)."""
        if self.signals.stop_requested:  # asked to stop before the loop took a step (a resume of a finished run)
            self.stopped = True
            print(f"stopped before the final evaluation; the checkpoint is unchanged: {self.last_checkpoint}")
            return None
        path = f"{self.dir}/{self.args.exp_name}.cleanrl_model"
        try:
            model_files.save_weights(path, self.script, self.args, weights)
        except (OSError, RuntimeError) as error:  # torch.save reports a full disk as a RuntimeError
            last = self.last_checkpoint or "none written"
            run_folder.stop_on_disk_error(
                f"error: writing the model file {path} failed ({error}); last good checkpoint: {last}"
            )
        print(f"model saved to {path}")
        return path

    def log_evaluation(self, model_path: str, scores: list[float]) -> list[float]:
        """Logs the scores of the evaluation of the model file at `model_path` and prints their mean; returns them."""
        self.eval_scores = scores
        for episode, score in enumerate(scores):
            self.writer.add_scalar("eval/episodic_return", score, episode)
        print(model_files.evaluation_line(model_path, scores))
        if getattr(self.args, "capture_video", False):
            print(f"videos in {self.video_folder}")
        return scores

    @property
    def video_folder(self) -> str:
        """Where the evaluation after training records its videos (with --capture-video)."""
        return f"{self.dir}/videos"

    def finish(self, scores: list[float]) -> None:
        """The last line of a run: how far it got, how long it took, its recent training return and evaluation."""
        done, global_step = "stopped at" if self.stopped else "finished", self.global_step
        recent = f"return(100) {np.mean(scores[-100:]):.2f} ({len(scores)} episodes)" if scores else "no episode ended"
        took = episode_scores.format_duration(time.time() - self.start_time)
        line = f"{done} step {global_step}/{self.args.total_timesteps} in {took}"
        if self.eval_scores:
            recent += f" | evaluation {np.mean(self.eval_scores):.2f} over {len(self.eval_scores)} episodes"
        print(f"{line} | {recent} | {self.dir}")

    def _thread_exception(self, hook_args) -> None:
        if not (isinstance(hook_args.exc_value, OSError) and hook_args.exc_value.errno in run_folder.DISK_ERRORS):
            self.previous_excepthook(hook_args)

    def close(self, remove_if_new: bool = False) -> None:
        """Restores the signal handlers, closes the logs, releases the lock. `remove_if_new`: a run folder this run
        created and that holds no checkpoint (a run stopped before its first step) is removed, not left empty."""
        self.signals.restore()
        threading.excepthook = self.previous_excepthook
        if self.writer is not None:
            with contextlib.suppress(OSError):
                self.writer.close()
        if self.args.track and self.writer is not None:
            import wandb

            wandb.finish()
        if self.lock is not None:
            if remove_if_new and self.created and self.last_checkpoint is None and self.global_step == self.start_step:
                shutil.rmtree(self.dir, ignore_errors=True)
            os.close(self.lock)
            self.lock = None

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        self.close(remove_if_new=kind is not None)
        if isinstance(error, OSError) and error.errno in run_folder.DISK_ERRORS:  # a full disk, a read-only folder: one line
            where = f" {error.filename}" if error.filename else ""
            last = self.last_checkpoint or "none written"
            run_folder.stop_on_disk_error(
                f"error: writing{where} failed: {error.strerror or error}; last good checkpoint: {last}"
            )
        if kind is None and self.stopped:  # stopped by a signal, checkpoint written: exit as the signal asked
            raise SystemExit(128 + self.signals.signum)

    def fast_forward(self, envs, action_log: np.ndarray, obs: np.ndarray, stats, action_dtype=np.int64):
        """Brings the envs, just built with `run.env_seed`, on from the checkpoint; returns (envs, obs) for the loop.

        envpool cannot save its state, but it is deterministic given its seed and the actions: by default the envs are
        fast-forwarded through the logged actions (`environments.fast_forward_envs`), and the run goes on exactly (a
        signal meanwhile exits at once; the checkpoint is still the newest state). That costs the environment steps of
        the whole run so far. With --resume-fresh-envs the envs start new games instead, at a cost that does not grow
        with the run: the games in progress, counted from `stats` (read, not changed), are dropped; the script then
        makes its next step a reset step, clears its partial scores (`stats.drop_games_in_progress`) and, where its
        replay buffer ends n-step targets only at a stored episode end, marks its last stored step as a time-out, so
        that nothing is trained across the cut. A later exact resume fast-forwards through only the actions since the
        last such cut."""
        envs_count = action_log.shape[1] if action_log.ndim > 1 else 1
        if self.args.resume_fresh_envs:
            dropped = int(np.count_nonzero(stats.lengths))
            self.writer.add_scalar("charts/games_dropped_at_resume", dropped, self.checkpoint["global_step"])
            print(
                f"resume: fresh environments (no fast-forward through the {action_log.size} logged agent steps); "
                f"{dropped} games in progress dropped"
            )
            return environments.FirstStepIsReset(envs), obs
        start_row = self.envs_start // envs_count
        if start_row > 0:  # envs started fresh at that step, whose first step was a reset step
            envs, action_log = environments.FirstStepIsReset(envs), action_log[start_row:]
        self.signals.replaying = True
        environments.fast_forward_envs(envs, action_log, obs, action_dtype)
        self.signals.replaying = False
        return envs, obs

    def save(self, global_step: int, state: dict, learned: tuple) -> str:
        """Writes the checkpoint of `state` (plain values: state dicts, arrays, numbers) at `global_step` over the previous
        one (see `write_checkpoint`). `learned` names the entries that training computes (the networks' and optimizers'
        states): a state whose learned entries hold NaN or inf is not written, and the previous checkpoint stays good.
        After the checkpoint of a stop, prints the command that continues the run."""
        learned = list(learned)
        header = dict(format=self.format, script=os.path.basename(self.script), args=vars(self.args), run_name=self.name)
        checkpoint = dict(
            header, wandb_id=self.wandb_id, global_step=global_step, rng=checkpoint_files.rng_states(), state=state
        )
        # `learned` names the entries a resume checks for NaN and inf before it builds anything
        checkpoint.update(envs_start=self.envs_start, learned=learned)
        if not checkpoint_files.all_finite([state[key] for key in learned]):  # buffers may hold inf by design
            raise SystemExit(
                f"error: non-finite values in the state at step {global_step}; no checkpoint written; "
                f"last good checkpoint: {self.last_checkpoint or 'none written'}"
            )
        self.writer.flush()  # the logs up to this step are on disk before the checkpoint that vouches for them
        try:
            checkpoint_files.write_checkpoint(self.checkpoint_path, checkpoint, self.note_writing)
        except (OSError, RuntimeError) as error:  # torch.save reports a full disk as a RuntimeError
            run_folder.stop_on_disk_error(
                f"error: writing the checkpoint failed at step {global_step} ({error}); is the disk full? "
                f"last good checkpoint: {self.last_checkpoint or 'none written'}"
            )
        self.last_checkpoint = self.checkpoint_path
        if self.stopped:
            self.print_resume_command()
        self.signals.training_done = self.training_done_after_save
        return self.checkpoint_path

    def checkpoint_due(self, global_step: int, steps: int, last: bool) -> bool:
        """Call once at the end of every iteration, after its logging, with the `steps` it took; True when the script
        must now `save` its checkpoint state: global_step crossed a multiple of --checkpoint-every, the last iteration
        (if checkpointing), or a signal asked to stop. After a stop's checkpoint, `stopped` is True: leave the loop."""
        every, stopping = self.args.checkpoint_every, self.signals.stop_requested  # read once: a later signal waits a step
        self.global_step = global_step
        crossed = every > 0 and global_step // every > (global_step - steps) // every
        due = crossed or stopping or (every > 0 and last)
        self.stopped = stopping
        # From the end of training on (after the final checkpoint, if one is due) a signal exits at once.
        self.training_done_after_save = last and not stopping
        self.signals.training_done = self.training_done_after_save and not due
        return due

    def print_resume_command(self) -> None:
        # Quoted: folders above the run may hold spaces or any character a shell reads, and a pasted line must run
        # this command and only this one.
        command = shlex.join(["python", self.script, "--resume", os.path.abspath(self.checkpoint_path)])
        print(f"checkpoint written to {self.checkpoint_path}; continue the run with:\n  {command}")

    @contextlib.contextmanager
    def restoring(self):
        """`with run.restoring() as saved:` the checkpoint's state, as the script's `checkpoint_state` gave it (plain
        values), for the script to put into its own objects inside the block. A learning rate given on resume replaces
        the one in the saved optimizer states. Leaving the block restores the random generators (last: building the
        networks and envs drew from them); a state that does not fit this run stops it in one line."""
        saved = checkpoint_files.resumed_state(self.checkpoint, self.args)
        try:
            yield saved
        except (RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError) as error:
            first = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
            flag_error("resume", self.args.resume, f"its state does not fit this run ({type(error).__name__}: {first})")
        checkpoint_files.set_rng_states(self.checkpoint["rng"])
        step, restored = self.checkpoint["global_step"], ", ".join(sorted(saved))
        print(f"resume: continuing {self.name} from step {step}; restored {restored} and the random generators")

    def check_finite(self, updates_finite: torch.Tensor, global_step: int) -> None:
        """The NaN stop, read at logging intervals: `updates_finite` is a boolean tensor, on the training device, that the
        script has kept as the AND of `torch.isfinite` of every update's gradient norm since the run (re)started. A NaN
        or inf in a loss or in the Q-values reaches the gradient norm; the run then stops naming the last good
        checkpoint (a checkpoint of non-finite weights is never written). Reading it is the only host-device
        synchronisation the check costs."""
        if not bool(updates_finite):
            raise SystemExit(
                f"error: non-finite loss or Q-values by step {global_step}; last good checkpoint: "
                f"{self.last_checkpoint or 'none written'}"
            )

    def note_writing(self, temporary_file) -> None:
        """The temporary file a checkpoint is being written to (False when none): a second Ctrl-C removes it."""
        self.signals.writing = temporary_file
