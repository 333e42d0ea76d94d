#!/usr/bin/env bash
# The long generator run: run it before every change to passes/ or runtime/
# (NOT part of CI: it takes tens of minutes).  Each run uses a new seed
# (the epoch seconds unless HLOALIAS_DIFF_SEED is set), so successive runs
# search where the fixed CI sequence does not.
#
#   bash scripts/fuzz.sh                  # 2000 programs + 200 stateful, new seed
#   HLOALIAS_DIFF_SEED=1234 bash scripts/fuzz.sh   # replay a seed
#   FUZZ_EXAMPLES=500 bash scripts/fuzz.sh         # shorter
#
# Every failure it finds is a bug: fix it and keep its minimal program as a
# fixed regression case in test/py/test_fuzz_regressions.py (or, for a stateful
# program, in FIXED of test_differential_stateful.py) with its seed, so CI keeps it fixed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
cd "$repo_root"
seed="${HLOALIAS_DIFF_SEED:-$(date +%s)}"
examples="${FUZZ_EXAMPLES:-2000}"
stateful="${FUZZ_STATEFUL_EXAMPLES:-$((examples / 10))}"
echo "fuzz: seed $seed, $examples generated programs, $stateful stateful programs"
status=0
HLOALIAS_DIFF_SEED="$seed" HLOALIAS_DIFF_EXAMPLES="$examples" \
    "$HLOALIAS_PYTHON" -m pytest -q -x test/py/test_differential.py -k generated </dev/null || status=1
HLOALIAS_DIFF_SEED="$seed" HLOALIAS_STATEFUL_EXAMPLES="$stateful" \
    "$HLOALIAS_PYTHON" -m pytest -q -x test/py/test_differential_stateful.py -k match_eager </dev/null || status=1
if [ "$status" -ne 0 ]; then
    echo "fuzz: FAILED with seed $seed: add the minimal program above to test/py/test_fuzz_regressions.py" >&2
fi
exit $status
