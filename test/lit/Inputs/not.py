"""Run a command and invert its exit status, like LLVM's ``not``: exit 0
when the command failed normally, 1 when it succeeded or was killed by a
signal (a crash is never the failure a test expects)."""

from __future__ import annotations

import subprocess
import sys


def main(argv: list[str]) -> int:
    """Run ``argv`` with inherited streams; return the inverted status."""
    if not argv:
        print("not: expected a command to run", file=sys.stderr)
        return 2
    try:
        completed = subprocess.run(argv, check=False)
    except OSError as error:
        print(f"not: cannot run '{argv[0]}': {error.strerror}", file=sys.stderr)
        return 1
    if completed.returncode < 0:
        print(f"not: '{argv[0]}' was killed by signal {-completed.returncode}", file=sys.stderr)
        return 1
    return 0 if completed.returncode != 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
