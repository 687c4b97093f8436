"""What the status says when the job's own argument parser rejects its arguments (JOB_ARGUMENTS_REJECTED).

argparse prints its complaint on the driver's stderr and exits; the status should carry that complaint itself, not
only "see the driver log". It is read from the SystemExit's traceback (the frame of argparse's `error`, which holds
the parser and the message), so nothing has to capture stderr while the job builds its query. Where the complaint
names an argument the runtime used to pass and passes no more, the message says what to do instead: an application
written to the older contract fails at start with it, and the fix is one line of its code.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from types import FrameType, TracebackType

# The arguments the runtime appended to the job's until a release, and where the job reads that value now.
REMOVED_ARGUMENTS = {
    "--kafka-bootstrap-servers": "read the broker with kafka_bootstrap_servers(spark)",
}
CONTRACT_DOCS = "docs/writing-a-job.md, CHANGELOG.md"


def rejection_message(exc: SystemExit, job_args: list[str]) -> str:
    """One line for the status: the job's arguments, argparse's own complaint (when argparse exited), and for a
    removed argument the job still asks for, the change and its fix."""
    complaint = parser_complaint(exc)
    message = f"the job rejected its arguments {job_args} (exit {exc.code})"
    if complaint is None:
        return f"{message}: see the driver log"
    message = f"{message}: {complaint}"
    for name, instead in REMOVED_ARGUMENTS.items():
        # named in the complaint and not given: the job still declares what the runtime no longer passes
        if name in complaint and not any(arg == name or arg.startswith(f"{name}=") for arg in job_args):
            message += f"; the runtime no longer passes {name}: {instead} ({CONTRACT_DOCS})"
    return message


def parser_complaint(exc: SystemExit) -> str | None:
    """`PROG: error: MESSAGE` as argparse printed it, on one line; a `sys.exit("text")`'s text; else None."""
    found = None
    for frame in _frames(exc.__traceback__):  # the innermost `error` of a parser: argparse's own, under overrides
        parser, text = frame.f_locals.get("self"), frame.f_locals.get("message")
        if frame.f_code.co_name == "error" and isinstance(parser, argparse.ArgumentParser) and isinstance(text, str):
            found = f"{parser.prog}: error: {text}"
    if found is None and isinstance(exc.code, str):
        found = exc.code
    return " ".join(found.split()) if found is not None else None


def _frames(tb: TracebackType | None) -> Iterator[FrameType]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next
