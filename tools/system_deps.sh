#!/bin/sh
# System packages the test suite needs beyond PyPI: Debian's headless Chromium, which the
# browser tier (`tox -e browser`, `pytest -m browser`: the HTML pages parsed and screenshotted)
# uses. Installs it with apt-get when missing (as root, or through passwordless sudo).
# Without either it says what to run and exits 0: the default test run needs no Chromium, and
# the browser tier's tests skip with the same reason (CI, as root, installs it).
set -eu
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ]; then
  run=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  run="sudo -n"
else
  echo "tools/system_deps.sh: headless Chromium is missing (only the browser tier needs it); as root: apt-get install chromium" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "tools/system_deps.sh: no apt-get here; for the browser tier install Chromium (chromium) with your package manager" >&2
  exit 0
fi
DEBIAN_FRONTEND=noninteractive $run apt-get update -q
DEBIAN_FRONTEND=noninteractive $run apt-get install -y -q --no-install-recommends chromium
