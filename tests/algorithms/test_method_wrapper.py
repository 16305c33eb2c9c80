"""Options wrap any method without hiding any of it: every public hook and every declaration of
`Method` reaches the wrapped method through `MethodWrapper`, `CosineDistanceWeight` and
`KnowledgeDistillation`, unless the option itself answers that hook.

The hooks and declarations are read off `Method` here, independently of the wrapper's own
machinery, so a hook added to `Method` is checked the moment it exists: a wrapper that does not
forward it answers with `Method`'s (FedPav's) default and fails this test.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from torch import nn

from secfed.algorithms.base import Method, MethodWrapper
from secfed.algorithms.cdw import CosineDistanceWeight
from secfed.algorithms.kd import KnowledgeDistillation
from secfed.config import RunConfig

HOOKS = sorted(name for name, value in vars(Method).items() if not name.startswith("_") and inspect.isfunction(value))
DECLARATIONS = sorted(Method.__annotations__)


def _overriding_everything() -> type[Method]:
    """A method that notes every hook it is asked in ``self.asked``, and declares a fresh object for
    every declaration, so nothing it says can be mistaken for Method's default."""
    def marker(hook: str) -> Any:
        return lambda self, *args, **kwargs: self.__dict__.setdefault("asked", []).append(hook)

    namespace: dict[str, Any] = {hook: marker(hook) for hook in HOOKS}
    namespace.update({key: object() for key in DECLARATIONS})
    return type("Everything", (Method,), namespace)


def _wrap(option: str, inner: Method) -> Method:
    if option == "plain":
        return MethodWrapper(inner)
    if option == "cdw":
        return CosineDistanceWeight(inner)
    return KnowledgeDistillation(inner, torch.zeros(2, 3, 4, 4, dtype=torch.uint8), nn.Linear(1, 1), layout=None,
                                 epochs=1, lr=0.1, seed=0)  # type: ignore[arg-type]


def _call(method: Method, hook: str) -> Any:
    """Ask ``method`` the question ``hook`` with a placeholder for every argument Method's signature names."""
    params = [p for p in inspect.signature(getattr(Method, hook)).parameters.values() if p.name != "self"]
    return getattr(method, hook)(*[object() for _ in params])


def test_method_has_hooks_and_declarations_to_check() -> None:
    """The lists are not vacuous: they hold the client and server hooks and the declared rules."""
    assert {"build_model", "receive", "local_train", "client_step", "payloads", "absorb", "refine"} <= set(HOOKS)
    assert {"name", "shared_prefixes", "dp_sgd_unsupported", "own_settings", "public_weights"} <= set(DECLARATIONS)


@pytest.mark.parametrize("option", ["plain", "cdw", "kd"])
def test_every_hook_of_method_reaches_the_wrapped_method(option: str) -> None:
    """Each hook the option does not answer itself is asked of the wrapped method, not answered by Method."""
    inner = _overriding_everything()(RunConfig())
    wrapper = _wrap(option, inner)
    own = {hook for hook in HOOKS if hook in vars(type(wrapper)) and type(wrapper) is not MethodWrapper}
    assert own <= {"client_step", "refine", "describe"}  # what KD and CDW add to a method
    missed = []
    for hook in sorted(set(HOOKS) - own):
        asked = len(inner.__dict__.get("asked", []))
        try:
            _call(wrapper, hook)
        except Exception:  # noqa: BLE001 - Method's own answer choking on placeholders is a miss too
            pass
        if inner.__dict__.get("asked", [])[asked:] != [hook]:
            missed.append(hook)
    assert not missed, f"{option} answers {missed} itself instead of asking the wrapped method"


@pytest.mark.parametrize("option", ["plain", "cdw", "kd"])
def test_every_declaration_of_method_is_the_wrapped_methods(option: str) -> None:
    """What a method declares (its rules) reads the same through an option; CDW alone changes one:
    its weights are secret, so not public."""
    inner = _overriding_everything()(RunConfig())
    wrapper = _wrap(option, inner)
    changed = {"public_weights"} if option == "cdw" else set()
    differ = [key for key in DECLARATIONS if key not in changed and getattr(wrapper, key) is not getattr(inner, key)]
    assert not differ, f"{option} hides the wrapped method's {differ}"
    assert option != "cdw" or wrapper.public_weights is False
