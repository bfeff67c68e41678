"""Flag errors, the ground of the package: the one-line stop of a bad flag (`flag_error`, `check_flags`), the rule of a
plain name (`is_plain_name`) and the memory that checks compare a run's needs with (`available_memory_bytes`).

Layer 1 (ground): imports the standard library only, and no module of this package."""

import os
import string
from typing import NoReturn


def flag_error(flag: str, value, allowed: str) -> NoReturn:
    """Stops the run with one line that names the flag, its value and what is allowed."""
    raise SystemExit(f"error: --{flag.replace('_', '-')}={value}: {allowed}")


def check_flags(checks: list[tuple[str, object, bool, str]]) -> None:
    """`checks` holds (flag, value, ok, allowed) rows; the first row that is not ok stops the run."""
    for flag, value, ok, allowed in checks:
        if not ok:
            flag_error(flag, value, allowed)


# A run's name (--exp-name in it) names its folder, its model file and its W&B run, and is part of the commands a run
# prints: it is kept to characters that no shell, file system or URL reads as anything but themselves.
PLAIN_NAME_CHARACTERS = frozenset(string.ascii_letters + string.digits + "._-+=,@")
PLAIN_NAME_RULE = "letters, digits and . _ - + = , @ only, not starting with '-', not '.' or '..'"


def is_plain_name(name, most_bytes: int = 255) -> bool:
    """A name that is one folder or file name of plain characters (PLAIN_NAME_RULE): no path separator, space, quote
    or shell character, no leading '-' (it would read as a flag), not `.` or `..`, not empty, not too long."""
    plain = isinstance(name, str) and name not in ("", ".", "..") and set(name) <= PLAIN_NAME_CHARACTERS
    return plain and not name.startswith("-") and len(name) <= most_bytes


def available_memory_bytes() -> int:
    """RAM the kernel says can be allocated without swapping (MemAvailable), else the free pages, else (macOS, which
    counts no free pages for sysconf) all of the RAM: a bound that still stops what could never fit."""
    try:
        with open("/proc/meminfo") as meminfo:
            return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
