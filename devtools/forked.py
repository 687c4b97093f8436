"""Real processes that start in milliseconds: the command line (or a function) in children of one forkserver
that imported the engine and boto3 once, instead of a new interpreter each time (about a second, several
on a busy machine). Each child is its own OS process: SIGKILL kills it mid-write, and nothing of its parent
(threads, clients, an embedded S3 server) is shared with it. For the tests (crashes, races) and the history
benchmark (a command's own time, without the interpreter's start)."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

_SERVER = multiprocessing.get_context("forkserver")
_SERVER.set_forkserver_preload(["boto3", "airflow_plugin.cli.main", "devtools.forked"])


def cli(args: list[str], env: dict[str, str]) -> BaseProcess:
    """`savepoints ARGS` in a child with `env` added to its environment; its output is discarded."""
    from airflow_plugin.cli.main import main

    return call(main, args, env=env)


def call(target: Callable[..., Any], *args: Any, env: dict[str, str], out: str | None = None) -> BaseProcess:
    """`target(*args)` in a child with `env` added to its environment, its output to the file `out` (default:
    discarded); the child's exit code is what `target` returned if that is a number, else 0. `target` must be
    a module's function (the child imports its module: preloaded ones cost nothing)."""
    return spawn(_call, target, args, env, out)


def spawn(target: Callable[..., Any], *args: Any) -> BaseProcess:
    process = _SERVER.Process(target=target, args=args)
    process.start()
    return process


def _call(target: Callable[..., Any], args: tuple[Any, ...], env: dict[str, str], out: str | None) -> None:
    os.environ.update(env)
    written = os.open(out or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(written, 1)
    if out is None:
        os.dup2(written, 2)
    result = target(*args)
    os._exit(result if isinstance(result, int) else 0)


def wait_for(condition: Callable[[], bool], timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False
