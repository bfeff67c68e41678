"""cleanrl_q_utils.flag_errors: a violated constraint names the flag, its value and what is allowed."""

import pytest

from cleanrl_q_utils.flag_errors import check_flags


def test_check_flags_names_the_first_bad_flag():
    with pytest.raises(SystemExit, match=r"^error: --num-envs=0: at least 1$"):
        check_flags([("seed", 1, True, "any"), ("num_envs", 0, False, "at least 1"), ("gamma", 2, False, "in [0, 1]")])
