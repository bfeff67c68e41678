"""cleanrl_q_utils.environments: the warnings it silences."""

import os
import subprocess
import sys


def test_gymnasium_saying_a_stopped_recording_was_not_saved_is_silenced():
    # In a child process: pytest's own warning filters (pyproject.toml) would hide the warning anyway.
    code = (
        "import warnings, cleanrl_q_utils.environments\n"  # what gymnasium's RecordVideo warns when collected unclosed
        "warnings.warn('\\x1b[33mWARN: Unable to save last video! Did you call close()?\\x1b[0m', UserWarning)\n"
        "warnings.warn('another warning', UserWarning)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
    assert done.returncode == 0 and "another warning" in done.stderr and "video" not in done.stderr, done.stderr
