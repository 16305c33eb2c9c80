"""How far the long waits inside a run have got, for whoever shows it (the CLI's bars; nobody by default).

Steps deep in the library — scoring a domain, KD fine-tuning, a local-only baseline's training,
waiting for a checkpoint write — call :func:`step` (or iterate through :func:`tracked`); a front end
hears them inside ``with listening(callback):``. A listener only observes: nothing a run computes
or writes depends on whether anyone listens. The listener is context-local (a ContextVar), so the
checkpoint writer's thread, or a second run in the same process, never reports into this one's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")
# (activity, done, total, detail): ``done`` of ``total`` parts of ``activity`` are finished, and
# ``detail`` names the part now under way ("" once done == total, which ends the activity)
Listener = Callable[[str, int, int, str], None]

_listener: ContextVar[Listener | None] = ContextVar("secfed_progress_listener", default=None)


def step(activity: str, done: int, total: int, detail: str = "") -> None:
    """Tell the listener, if any, that ``done`` of ``total`` parts of ``activity`` are finished."""
    listener = _listener.get()
    if listener is not None:
        listener(activity, done, total, detail)


def tracked(activity: str, items: Sequence[T], detail: Callable[[T], str] = lambda item: "") -> Iterator[T]:
    """``items`` one by one, stepping ``activity`` before each (naming it by ``detail``) and once after
    the last, so a listener sees every part start and the activity end."""
    total = len(items)
    for done, item in enumerate(items):
        step(activity, done, total, detail(item))
        yield item
    step(activity, total, total)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Every :func:`step` in this context (this thread or task) goes to ``listener``."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)
