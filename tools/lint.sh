#!/usr/bin/env bash
# The lint checks of `tox -e lint`, runnable on their own: ruff (lint + format), mypy on
# umbp_sim/, clang-format on every C++ file under csrc/ and bench/ (the repo's .clang-format).
set -euo pipefail
cd "$(dirname "$0")/.."

ruff check .
ruff format --check .
mypy umbp_sim
mapfile -t cxx < <(find csrc bench umbp_sim/bindings \( -name '*.cpp' -o -name '*.h' \) | sort)
clang-format --dry-run -Werror "${cxx[@]}"
echo "lint: ruff, mypy and clang-format (${#cxx[@]} C++ files) clean"
