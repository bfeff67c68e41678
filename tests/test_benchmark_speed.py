import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("steady_sps", Path(__file__).parents[1] / "benchmark" / "steady_sps.py")
steady_sps = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(steady_sps)


def test_steady_sps_is_the_rate_between_the_last_two_progress_lines():
    lines = [
        "warming up\n",
        "step      2000/100000 | SPS    400 | return(100)      nan | ETA 00:04:05\n",  # t = 5 s: fast acting-only warm-up
        "step      3000/100000 | SPS    150 | return(100)     1.20 | ETA 00:10:00\n",  # t = 20 s
        "step      5000/100000 | SPS    125 | return(100)     1.50 | ETA 00:12:00\n",  # t = 40 s
    ]
    # (5000 - 3000) steps in (40 - 20) s; the average since the start (125) would include the warm-up.
    assert steady_sps.steady_sps(lines) == pytest.approx(100.0)


def test_steady_sps_needs_two_progress_lines():
    assert steady_sps.steady_sps(["step 10/100 | SPS 5 | return(100) nan | ETA 00:00:18\n"]) is None
