"""Real processes that start in milliseconds: the command line (or a worker function) in children of one
forkserver that imported the engine and boto3 once, instead of a new interpreter each time (about a second
on this machine). Each child is its own OS process: SIGKILL kills it mid-write, and nothing of the test
process (threads, clients, the embedded S3 server) is shared with it."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

_SERVER = multiprocessing.get_context("forkserver")
_SERVER.set_forkserver_preload(["boto3", "airflow_plugin.cli.main", "tests.support.processes"])


def cli(args: list[str], env: dict[str, str]) -> BaseProcess:
    """`savepoints ARGS` in a child with `env` added to its environment; its output is discarded."""
    return spawn(_cli, args, env)


def spawn(target: Callable[..., Any], *args: Any) -> BaseProcess:
    process = _SERVER.Process(target=target, args=args)
    process.start()
    return process


def _cli(args: list[str], env: dict[str, str]) -> None:
    os.environ.update(env)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    from airflow_plugin.cli.main import main

    os._exit(main(args))


def wait_for(condition: Callable[[], bool], timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False
