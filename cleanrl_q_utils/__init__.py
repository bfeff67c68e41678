"""What the cleanrl-q scripts (cleanrl/) share. Run plumbing, with no reinforcement learning in it, one module per
concern: flag_checks.py; command_line.py (flags, --help, the flags of a resume); training_run.py (a run's life: logs,
checkpoints); stop_signals.py; run_folder.py (folder, device, start-up block); checkpoint_files.py; episode_scores.py
(true scores, progress line); model_files.py (--save-model, --eval-only); environments.py (video env, the envs'
rebuild on resume); quiet_start.py (signals while a script loads); minatar.py (MinAtar's games through gymnasium);
classic_control.py (envpool where it installs, else gymnasium's classic control stepped as envpool steps it).
segment_tree.py: the sum and min trees under the prioritized replay buffers, which stay in the scripts. Two pieces
of model code, kept out of the scripts only for speed: flat_radam.py (pqn.py's optimizer) and lstm_unroll.py (the
recurrent IQN scripts' LSTM unroll)."""
