"""Run a command with inherited streams, then print ``exit status: N`` on
stdout and exit 0, so a test can check the exact status with FileCheck."""

from __future__ import annotations

import subprocess
import sys


def main(argv: list[str]) -> int:
    """Run ``argv`` and report its exit status (negative: killed by a signal)."""
    if not argv:
        print("exit_status: expected a command to run", file=sys.stderr)
        return 2
    sys.stdout.flush()
    status = subprocess.run(argv, check=False).returncode
    print(f"exit status: {status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
