"""Bounded parallel execution for many small transfers (the s3transfer pattern: one call for the user,
a thread pool inside, never more than a window of futures in memory)."""

from __future__ import annotations

import contextvars
import itertools
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Protocol, TypeVar


class Sized(Protocol):
    @property
    def size(self) -> int: ...


T = TypeVar("T")
R = TypeVar("R")
S = TypeVar("S", bound=Sized)

DEFAULT_CONCURRENCY = 16


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of at most `size` items (the last may be shorter)."""
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def largest_first(items: Iterable[S]) -> list[S]:
    """`items` by size, the largest first: the order for a pool of transfers whose time follows their size. The pool
    ends when its last transfer does, and a large one started last would run on alone (scheduling the longest job
    first bounds that tail by the smallest ones)."""
    return sorted(items, key=lambda item: item.size, reverse=True)


def run_parallel(fn: Callable[[T], R], items: Iterable[T], *, concurrency: int = DEFAULT_CONCURRENCY) -> Iterator[R]:
    """Apply `fn` to every item with at most `concurrency` threads and at most 4x that many pending
    futures (so a 100,000-file checkpoint does not create 100,000 futures at once). Results are yielded
    as they complete. The first exception stops submitting new work, waits for running work, and is
    raised."""
    if concurrency <= 1:
        yield from map(fn, items)
        return
    it = iter(items)
    window = concurrency * 4
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="savepoints") as pool:
        # Each task runs in a copy of the caller's context variables (logging context, for one).
        def submit(item: T) -> Future[R]:
            return pool.submit(contextvars.copy_context().run, fn, item)

        pending: set[Future[R]] = {submit(item) for item in itertools.islice(it, window)}
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for future in done:
                if future.exception() is not None:
                    for other in pending:
                        other.cancel()
                    wait(pending)
                    raise future.exception()  # type: ignore[misc]
                yield future.result()
            pending |= {submit(item) for item in itertools.islice(it, window - len(pending))}


def map_parallel(fn: Callable[[T], R], items: Iterable[T], *, concurrency: int = DEFAULT_CONCURRENCY) -> list[R]:
    """`run_parallel`, its results in the order of `items` (for few items: all are held at once)."""
    indexed = list(enumerate(items))
    results: dict[int, R] = dict(run_parallel(lambda pair: (pair[0], fn(pair[1])), indexed, concurrency=concurrency))
    return [results[i] for i in range(len(indexed))]
