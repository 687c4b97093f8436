#!/usr/bin/env bash
# Installs a Debian package that `make` needs when what it provides is missing:
#   bash devtools/install_debian.sh COMMAND PACKAGE WHY
# COMMAND is a command name or an absolute path; if it is there, nothing happens. `make setup` installs maven
# this way (devtools/jvm.py resolves the JVM jars with it), `make test` chromium (the browser test drives it;
# nothing is downloaded by playwright). Without apt, root or sudo it only warns: what needs the package then
# fails and says so.
set -uo pipefail
if [ "$#" -ne 3 ]; then
  echo "usage: $0 COMMAND PACKAGE WHY" >&2
  exit 2
fi
command="$1" package="$2" why="$3"
if [ "${command#/}" != "$command" ]; then [ -x "$command" ] && exit 0; else command -v "$command" >/dev/null 2>&1 && exit 0; fi
echo "installing Debian's $package: $why"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$package" >/dev/null; }; then
  echo "warning: could not install $package; install it (apt-get install -y $package): $why" >&2
fi
exit 0
