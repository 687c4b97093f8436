#!/usr/bin/env bash
# Debian's maven for `make setup`: devtools/jvm.py resolves the JVM jars (Kafka broker, Spark's Kafka connector,
# S3A, Delta) with it. `make setup` runs this when `mvn` is missing; if it cannot install (no apt, no root or
# sudo), devtools/jvm.py stops next with a message saying how to install it.
set -uo pipefail
command -v mvn >/dev/null 2>&1 && exit 0
echo "installing Debian's maven (make setup resolves the JVM jars with it)"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq maven >/dev/null; }; then
  echo "warning: could not install maven; install it (apt-get install -y maven)" >&2
fi
exit 0
