#!/usr/bin/env bash
# Line and branch coverage of csrc/allocator, measured by the allocator tests.
#
# Builds the extension with gcov (UMBP_COVERAGE=ON, -O0) into its own build directory and venv,
# so the normal development build is untouched; runs the allocator tests; reports with gcovr
# and fails under the thresholds of issue 4 (95% lines, 90% branches).
#
# gcovr counts the hidden branches of C++ exception handling and of inlined library code; those
# are excluded (--exclude-throw-branches, --exclude-unreachable-branches), as is usual.
#
# Usage: tools/allocator_coverage.sh [pytest args...]
# Env:   COV_VENV (default: build/coverage-venv), COV_BUILD (default: build/coverage),
#        FAIL_UNDER_LINE (95), FAIL_UNDER_BRANCH (90), COV_TESTS (default: the allocator, profile and handle-lifetime tests)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=${COV_VENV:-$root/build/coverage-venv}
build=${COV_BUILD:-build/coverage}
line=${FAIL_UNDER_LINE:-95}
branch=${FAIL_UNDER_BRANCH:-90}

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv --system-site-packages "$venv"
fi
# Editable install pointing at the coverage build directory (scikit-build-core build-dir).
UMBP_COVERAGE=ON "$venv/bin/pip" install --no-build-isolation -q \
  --config-settings=build-dir="$build" -e "$root"

# Fresh counters for this run.
find "$build" -name '*.gcda' -delete

# shellcheck disable=SC2086
tests=${COV_TESTS:-$(ls tests/test_allocator*.py tests/test_profiles.py tests/test_handle_lifetimes.py)}
# shellcheck disable=SC2086
"$venv/bin/python" -m pytest -q -p no:cacheprovider $tests "$@"

gcovr --root "$root" --object-directory "$build" --gcov-ignore-parse-errors=negative_hits.warn \
  --filter 'csrc/allocator/' \
  --exclude-throw-branches --exclude-unreachable-branches \
  --txt - --print-summary \
  --fail-under-line "$line" --fail-under-branch "$branch"
