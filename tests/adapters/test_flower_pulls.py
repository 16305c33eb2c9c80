"""Flower processes secfed runs look again for a payload still uploading at secfed's poll, not
after Flower's 1 s, 2 s, 4 s … (adapters/flower/pulls.py; issue 22 item 4)."""

from __future__ import annotations

import importlib
import threading
import types
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flwr.supercore.inflatable import inflatable_utils  # noqa: E402
from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError  # noqa: E402

from secfed.adapters.flower import pulls  # noqa: E402


class _Waits(threading.Event):
    """An Event whose timed waits are recorded and return at once (the back-offs, without sleeping)."""

    seen: list[float] = []

    def wait(self, timeout=None):
        if timeout is not None:
            _Waits.seen.append(round(timeout, 6))
            return False
        return super().wait()


def _backoffs(module: types.ModuleType, monkeypatch, late: int) -> list[float]:
    """The back-offs ``module.pull_objects`` takes for an object that is unavailable ``late`` times."""
    monkeypatch.setattr(inflatable_utils.threading, "Event", _Waits)
    monkeypatch.setattr(inflatable_utils.random, "uniform", lambda a, b: 0.0)  # no jitter
    _Waits.seen = []
    calls = []

    def pull(object_id: str) -> bytes:
        calls.append(object_id)
        if len(calls) <= late:
            raise ObjectUnavailableError(object_id)
        return b"payload"

    assert module.pull_objects(["o"], pull) == {"o": b"payload"}
    return _Waits.seen


@pytest.mark.parametrize("where", [pulls.SERVERAPP, pulls.SUPERNODE])
def test_the_pulls_of_the_serverapp_and_the_supernode_back_off_at_the_poll_not_at_flowers_second(where, monkeypatch):
    module = importlib.import_module(where)
    monkeypatch.setattr(module, "pull_objects", module.pull_objects)  # restored after the test
    assert _backoffs(module, monkeypatch, late=3) == [1.0, 2.0, 4.0]  # Flower's own: a 45 MB reply waits ≥ 1 s
    assert pulls.quicken(where, 0.05)
    assert _backoffs(module, monkeypatch, late=10) == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]
    assert pulls.quicken(module, 0.2)  # again: re-bound from Flower's function, not stacked
    assert _backoffs(module, monkeypatch, late=4) == [0.2, 0.4, 0.8, 1.6]


def test_a_payload_that_never_comes_is_given_up_on_as_flower_would(monkeypatch):
    """Flower's own limits stay: a node that died mid-upload does not hold the ServerApp longer."""
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError

    module = importlib.import_module(pulls.SERVERAPP)
    monkeypatch.setattr(module, "pull_objects", module.pull_objects)
    pulls.quicken(module, 0.05)
    assert module.pull_objects.keywords == {"initial_backoff": 0.05}
    monkeypatch.setattr(inflatable_utils.threading, "Event", _Waits)
    monkeypatch.setattr(inflatable_utils.random, "uniform", lambda a, b: 0.0)
    _Waits.seen = []

    def never(object_id: str) -> bytes:
        raise ObjectUnavailableError(object_id)

    with pytest.raises(ObjectPullError):
        module.pull_objects(["o"], never)
    defaults = inflatable_utils.pull_objects.__kwdefaults__
    assert len(_Waits.seen) == defaults["max_tries_per_object"] - 1  # Flower's try limit
    assert max(_Waits.seen) == defaults["backoff_cap"]  # and its cap between tries


def test_a_flower_without_the_function_keeps_its_pulls_and_a_bad_backoff_is_refused():
    bare = types.ModuleType("flwr_like")
    assert not pulls.quicken(bare, 0.1)
    other = types.ModuleType("flwr_other")
    other.pull_objects = lambda object_ids, pull_object_fn: {}  # a release without the knob
    assert not pulls.quicken(other, 0.1)
    assert not isinstance(other.pull_objects, type(pulls.functools.partial(print)))
    assert not pulls.quicken("flwr.no_such_module", 0.1)
    odd = types.ModuleType("flwr_odd")
    odd.pull_objects = 5  # not a function at all
    assert not pulls.quicken(odd, 0.1) and odd.pull_objects == 5
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="back-off"):
            pulls.quicken(pulls.SERVERAPP, bad)


def test_a_loopback_supernode_looks_again_at_its_node_poll(monkeypatch):
    """The patch make_bin puts into a Loopback's flower-supernode script (with node_poll)."""
    from secfed.adapters.flower import launch

    module = importlib.import_module(pulls.SUPERNODE)
    monkeypatch.setattr(module, "pull_objects", module.pull_objects)
    monkeypatch.setattr(module, "time", module.time)
    exec(launch._FAST_NODE.format(poll=0.3), {})
    assert module.pull_objects.keywords == {"initial_backoff": 0.3}
    assert _backoffs(module, monkeypatch, late=2) == [0.3, 0.6]


def test_a_clientapp_pulls_its_message_at_the_node_poll_warm_or_cold(tmp_path, monkeypatch):
    """A ClientApp pulls its message from the SuperNode, which may still be pulling it: the script a
    Loopback writes (cold path) and the zygote (warm forks) make its first back-off node_poll."""
    from secfed.adapters.flower import launch, zygote

    module = importlib.import_module(pulls.CLIENTAPP)
    stock = getattr(module, pulls.CLIENTAPP_PULL)
    monkeypatch.setattr(module, pulls.CLIENTAPP_PULL, stock)
    assert stock.__kwdefaults__["initial_backoff"] == 1  # Flower's
    exec(launch._FAST_CLIENTAPP.format(poll=0.2), {})
    assert getattr(module, pulls.CLIENTAPP_PULL).keywords == {"initial_backoff": 0.2}
    launch.make_bin(tmp_path, node_poll=0.2)
    script = (tmp_path / "flwr-clientapp").read_text()
    assert script.index("_forked()") < script.index("quicken(CLIENTAPP, 0.2")  # after the warm hand-off
    launch.make_bin(tmp_path / "plain")
    assert "quicken" not in (tmp_path / "plain" / "flwr-clientapp").read_text()  # no node_poll: Flower's
    monkeypatch.setattr(module, pulls.CLIENTAPP_PULL, stock)
    served = []
    monkeypatch.setattr(zygote, "serve", lambda path, backoff=None: served.append((path, backoff)))
    monkeypatch.setattr(zygote.signal, "signal", lambda *args: None)  # main's SIGTERM handler: not this process's
    for argv, want in ((["zygote", "/s"], None), (["zygote", "/s", "0.3"], 0.3)):
        monkeypatch.setattr(zygote.sys, "argv", argv)
        zygote.main()
        assert served.pop() == (Path("/s"), want)
