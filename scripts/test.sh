#!/usr/bin/env bash
# The whole test suite: lit (FileCheck on IR, Python-driven import tests),
# pytest (PJRT byte counts, runtime, differential and hostile tests; the
# runtime suites a second time on the Python call path alone), then
# mypy --strict on the package (scripts/mypy.sh).  Fails if any step fails.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
cd "$repo_root"
status=0
# lit has no __main__ module: call its entry point.
"$HLOALIAS_PYTHON" -c 'import sys; from lit.main import main; sys.exit(main())' -sv test/lit </dev/null || status=1
"$HLOALIAS_PYTHON" -m pytest -q test/py </dev/null || status=1
# The run above takes the native call path wherever it applies
# (runtime/_lane.cpp); the runtime suites again with it off keep the Python
# path, which serves every other call, tested on its own.
HLOALIAS_NATIVE=0 "$HLOALIAS_PYTHON" -m pytest -q test/py/test_runtime.py test/py/test_runtime_trust.py \
    test/py/test_fuzz_regressions.py test/py/test_hostile_api.py </dev/null || status=1
"$repo_root/scripts/mypy.sh" </dev/null || status=1
exit $status
