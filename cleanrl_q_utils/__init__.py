"""What the cleanrl-q scripts (cleanrl/) share: run plumbing, with no reinforcement learning in it, one module per
concern, in four layers. A module imports only modules of its own layer or of those below it, never in a circle, and
only at the top of the file; each module's docstring names the modules it imports.

1. ground: flag_errors.py (the one-line stop of a bad flag, plain names, available memory), standard library only.
2. parts: checkpoint_files.py (safe loads, atomic writes, the kinds of file a script reads); minatar.py (MinAtar's
   games through gymnasium); classic_control.py (gymnasium's classic control stepped as envpool steps it, where
   envpool does not install); episode_scores.py (true scores, progress line); stop_signals.py; quiet_start.py (signals
   while a script loads); segment_tree.py (the trees under the prioritized replay buffers); flat_radam.py and
   lstm_unroll.py (model code kept out of the scripts only for speed).
3. checks and helpers: flag_checks.py (flag ranges, env ids, the memory a run needs); environments.py (video env, the
   envs' rebuild on resume).
4. run plumbing: run_folder.py (folder, device, start-up block); model_files.py (--save-model, --eval-only);
   command_line.py (flags, --help, the flags of a resume, a script's configurations); training_run.py (a run's life:
   logs, checkpoints)."""
