#!/usr/bin/env bash
# The coverage tier (tox -e coverage), whole or in two parts so that CI can run the realkernel
# tests alone, after the tiers it runs side by side (a test that sets a hugepage pool must not
# run beside another process's real allocations):
#   tools/coverage_tier.sh             the allocator's gcov floor, the suite, the report
#   tools/coverage_tier.sh shared      the gcov floor and the suite without the realkernel tests
#   tools/coverage_tier.sh realkernel  the realkernel tests, then the report over both parts
# coverage.py writes one data file per part (-p) beside COVERAGE_FILE and combines them for the
# report, whose floor (87) counts what runs in pytest's process. external/child.py (the
# allocator's server) and external/run_job.py (each run, in a fork of it) run only in processes
# coverage.py does not follow, so they are left out of the count rather than counted as 0%.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${COVERAGE_FILE:?set by tox -e coverage}"
part=${1:-all}
omit="*/umbp_sim/external/child.py,*/umbp_sim/external/run_job.py"

suite() { coverage run -p --branch --source=umbp_sim -m pytest -p no:cacheprovider "$@"; }
fresh() { rm -f "$COVERAGE_FILE" "$COVERAGE_FILE".*; }
report() {
  coverage combine
  coverage report --show-missing --skip-covered --fail-under=87 --omit="$omit"
}

case "$part" in
  all) bash tools/allocator_coverage.sh; fresh; suite -m "not pagecache"; report ;;
  shared) bash tools/allocator_coverage.sh; fresh; suite -m "not pagecache and not realkernel" ;;
  realkernel) suite -m "realkernel and not pagecache"; report ;;
  *) echo "usage: tools/coverage_tier.sh [all|shared|realkernel]" >&2; exit 64 ;;
esac
