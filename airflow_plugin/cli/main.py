"""`savepoints`: parse, resolve the context once, run the command, render its output, and turn whatever
went wrong into one clear line and an exit code (exit_codes.py)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..core.errors import SavepointsError
from ..core.jobs.context import Settings
from ..core.jobs.launcher import default_command
from ..core.parallel import DEFAULT_CONCURRENCY
from ..core.sources.kafka import KafkaSettings
from . import exit_codes
from .parser import parse
from .render import BarProgress, emit, fail


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at the time (not the stream of the first call: tests swap it)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _configure_logging(level: int) -> None:
    root = logging.getLogger()
    if not any(isinstance(handler, _StderrHandler) for handler in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("py4j").setLevel(logging.WARNING)


def settings(args: argparse.Namespace) -> Settings:
    """The caller's side of the context: flags, the user, a progress bar, the spark-submit builder. A command
    takes --kafka-bootstrap and --concurrency only where they act (options.py)."""
    builder = default_command
    if getattr(args, "spark_conn", None):  # the Spark provider's connection builds the command
        from ..hooks.spark_submit import connection_command_builder

        builder = connection_command_builder(args.spark_conn)
    return Settings(
        jobs_file=args.jobs,
        store=args.store,
        kafka=KafkaSettings(kafka) if (kafka := getattr(args, "kafka_bootstrap", None)) else None,
        command_builder=builder,
        progress=BarProgress(),
        requested_by=os.environ.get("USER", ""),
        concurrency=getattr(args, "concurrency", DEFAULT_CONCURRENCY),  # only the commands that copy take it
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    _configure_logging(logging.INFO if args.verbose else logging.WARNING)
    try:
        output = args.run(args, settings(args).resolve())
        emit(output, args.json)
        if output.error is not None:
            raise output.error
        return output.exit_code
    except SavepointsError as exc:
        return fail(str(exc), exit_codes.exit_code(exc), args.json)
    except KeyboardInterrupt:
        return fail("interrupted", exit_codes.INTERRUPTED, args.json)
    except Exception as exc:  # an unexpected failure still gets one clear line, not a traceback
        logging.getLogger(__name__).info("unexpected error", exc_info=True)
        return fail(
            f"unexpected {type(exc).__name__}: {exc} (run with -v for details)", exit_codes.UNEXPECTED, args.json
        )


if __name__ == "__main__":
    sys.exit(main())
