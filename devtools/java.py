"""Spark needs Java 17 or newer: say so clearly before anything starts a JVM."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

REQUIRED = 17


def java_major() -> int | None:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    result = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def require_java() -> None:
    major = java_major()
    if major is None:
        sys.exit(
            f"Java is not installed: Spark needs Java {REQUIRED}+. Install it (Debian/Ubuntu: "
            "`apt-get install openjdk-17-jre-headless`) or set JAVA_HOME."
        )
    if major < REQUIRED:
        sys.exit(f"Java {major} found, but Spark 4 needs Java {REQUIRED}+: install a newer JDK or set JAVA_HOME.")


if __name__ == "__main__":
    require_java()
    print(f"java {java_major()} ok")
