"""What /proc says about a process, for the dev tools and the tests (Linux): its stat fields, whether it still
runs, its command line. One parser: a command's name in /proc/<pid>/stat may hold spaces and parentheses."""

from __future__ import annotations

from pathlib import Path

STATE, PARENT, SESSION = 0, 1, 3  # indexes into stat_fields(): proc(5)'s fields 3, 4 and 6


def stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command's name (see the indexes above); None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def running(pid: int) -> bool:
    """Whether it runs: neither gone nor ended (a zombie its parent has not reaped yet has ended)."""
    fields = stat_fields(pid)
    return fields is not None and fields[STATE] != "Z"


def command_line(pid: int) -> str | None:
    """Its command line, as `ps` shows it (the title a process set, if it set one); None when it is gone."""
    try:
        return (Path(f"/proc/{pid}") / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return None


def pids() -> list[int]:
    """Every process's pid."""
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
