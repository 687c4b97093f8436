#!/usr/bin/env bash
# Debian's chromium for the savepoints page's browser test (tests/test_ui_browser.py: playwright's Python
# API drives the system browser; nothing is downloaded). `make test` runs this when /usr/bin/chromium is
# missing; if it cannot install (no apt, no root or sudo), the browser test fails and says so.
set -uo pipefail
[ -x /usr/bin/chromium ] && exit 0
echo "installing Debian's chromium for the browser test (tests/test_ui_browser.py)"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null; }; then
  echo "warning: could not install chromium; install it (apt-get install -y chromium) or the browser test fails" >&2
fi
exit 0
