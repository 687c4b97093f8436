"""Spark needs Java 17 or newer: say so clearly before anything starts a JVM."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

REQUIRED = 17


def java_executable() -> str | None:
    """The `java` that Spark would run: JAVA_HOME's, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return java if java and os.path.exists(java) else None


def java_version() -> str | None:
    """What `java -version` says of the Java (its version and build lines), without the "Picked up
    JDK_JAVA_OPTIONS" note; None when there is no java."""
    java = java_executable()
    if java is None:
        return None
    result = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    return "\n".join(line for line in (result.stderr + result.stdout).splitlines() if "Picked up" not in line)


def java_major() -> int | None:
    version = java_version()
    if version is None:
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def java_problem() -> str | None:
    """What is wrong with this machine's Java for Spark (and Kafka), or None."""
    major = java_major()
    if major is None:
        return (
            f"Java is not installed: Spark needs Java {REQUIRED}+. Install it (Debian/Ubuntu: "
            "`apt-get install openjdk-17-jre-headless`) or set JAVA_HOME."
        )
    if major < REQUIRED:
        return f"Java {major} found, but Spark 4 needs Java {REQUIRED}+: install a newer JDK or set JAVA_HOME."
    return None


def require_java() -> None:
    problem = java_problem()
    if problem:
        sys.exit(problem)


if __name__ == "__main__":
    require_java()
    print(f"java {java_major()} ok")
