"""Running the protocol's bulk work on every core with threads.

The heavy calls — AES-CTR keystream (``update_into``), BLAKE3 and SHA-256 over large buffers,
Ed25519 verification, numpy's element-wise ufuncs — all release the GIL while they run (measured
with ``cryptography`` 50, ``blake3`` 1.0 and numpy 2.4: a pure-Python thread keeps running during a
200 ms ``update_into``, ``blake3``, ``hashlib.sha256`` or ``Ed25519PublicKey.verify`` call;
bench/bench_secagg.py ``--gil`` repeats that check). Threads therefore scale these passes across cores without
copying data between processes.

:func:`workers` is the number of threads a pass may use (default: the CPUs this process may run
on, at most 8; :func:`set_workers` or the ``SECFED_PROTOCOL_THREADS`` environment variable
override it). :func:`ranges` cuts a vector into one range per worker, :func:`run_all` runs a list
of jobs and returns their results in order, :func:`zeros` allocates the large arrays those passes
write into.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

import numpy as np

T = TypeVar("T")
MAX_DEFAULT_WORKERS = 8
# Below this many values per thread, handing work to another thread costs more than it saves.
MIN_WORDS_PER_WORKER = 1 << 18

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_workers: int | None = None


def _default_workers() -> int:
    env = os.environ.get("SECFED_PROTOCOL_THREADS")
    if env:
        try:
            value = int(env)
        except ValueError:
            raise ValueError(f"SECFED_PROTOCOL_THREADS must be a positive integer, got {env!r}") from None
        if value < 1:
            raise ValueError(f"SECFED_PROTOCOL_THREADS must be a positive integer, got {env!r}")
        return value
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_DEFAULT_WORKERS))


def workers() -> int:
    """Threads a bulk pass may use."""
    global _workers
    if _workers is None:
        _workers = _default_workers()
    return _workers


def set_workers(count: int) -> None:
    """Use ``count`` threads for bulk passes from now on (1: everything on the calling thread)."""
    global _workers
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"worker count must be a positive int, got {count!r}")
    _workers = count


def ranges(size: int, unit: int, minimum: int = MIN_WORDS_PER_WORKER) -> list[tuple[int, int]]:
    """``[lo, hi)`` ranges covering ``range(size)``: one per worker at most, each a whole number of
    ``unit``-long pieces (the last may be short), none shorter than ``minimum`` unless there is
    only one."""
    if size <= 0:
        return []
    pieces = -(-size // unit)
    parts = min(max(1, min(workers(), size // minimum)), pieces)
    per = -(-pieces // parts) * unit
    return [(lo, min(lo + per, size)) for lo in range(0, size, per)]


def run_all(jobs: Sequence[Callable[[], T]]) -> list[T]:
    """Run ``jobs`` (the first on the calling thread, the rest on the pool); results in order.

    Every job finishes before anything is raised — a failure never leaves a job still writing into
    shared buffers — and then the exception of the first failing job, in job order, is raised.
    Jobs must not call ``run_all`` themselves.
    """
    if len(jobs) <= 1:
        return [job() for job in jobs]
    futures = [_get_pool(len(jobs) - 1).submit(job) for job in jobs[1:]]
    try:
        first = jobs[0]()
    finally:
        wait(futures)
    return [first, *(future.result() for future in futures)]


def _get_pool(size: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < size:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="secfed-protocols")
            _pool_size = size
        return _pool


def zeros(count: int, dtype: np.dtype | type = np.uint32) -> np.ndarray:
    """A zeroed 1-D array whose memory is already mapped, for a threaded pass to write into.

    Zeroed here, on one thread: when two threads take the first writes into a fresh large array at
    once, their page faults contend (numpy backs large arrays with transparent huge pages), and on
    the 2-core dev VM quantising 11.5 M values into a fresh array took 73 ms on two threads against
    29 ms into a pre-faulted one (3 ms of which is this fill)."""
    out = np.empty(count, dtype=dtype)
    out.fill(0)
    return out
