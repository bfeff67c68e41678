"""What the cleanrl-q scripts (cleanrl/) share and no reader of an algorithm needs to see: plumbing.py (flags, run
folder and logs, checkpoints, signals, model files and video), minatar.py (MinAtar's games through gymnasium),
quiet_start.py (signals while a script loads), and two pieces kept out of the scripts only for speed: flat_radam.py
(pqn.py's optimizer) and lstm_unroll.py (the recurrent IQN scripts' LSTM unroll, model code)."""
