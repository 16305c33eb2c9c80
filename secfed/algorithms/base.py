"""What every federated ReID method is made of, and the supervised method all of them start from.

A method is one class that owns four things:

    model      ``build_model(num_classes)`` and which of its tensors are shared (``shared_prefixes``)
    client     ``client_step(site, broadcast, layout, schedule, seed)`` → :class:`Contribution`: local training,
               then what to sum (named vectors with the client's own weights) and what to share
    server     ``refine`` after the weighted mean (e.g. KD fine-tuning), ``payloads`` (what the
               broadcast carries besides the weights) and ``absorb`` (what the server keeps of the
               clients' shared payloads)
    state      ``site_state`` / ``load_site_state``: tensors of a site a resume needs

and declares its rules as class attributes, read through the registry (:data:`secfed.algorithms.METHODS`)
before any data is read: the settings only it reads (``own_settings``) and its refusals
(``config_issues``), whether DP-SGD can cover its loss (``dp_sgd_unsupported``), learning rates its
paper fixes (``learning_rates``), what it shares in the clear outside the secure sum (``shared_in_clear``).

:class:`Method` answers all of them the FedPav way (cross-entropy on a local classifier, the
backbone and neck shared, weights n_k/n). Methods override what differs; options that add to any
method (KD, CDW) wrap one (:class:`MethodWrapper`), as Flower's mods wrap a message handler.

The local training loop (:func:`train_loop`) is the same for every method: batches in, a loss out,
an optimiser step. Example-level DP-SGD is the framework's, not a method's: the client runs the
method's step inside :func:`secfed.privacy.dpsgd.private_local_training`, and every ``train_loop``
there swaps three of its parts (the module, the optimiser, the batches) for Opacus' private
versions — whatever the method. A method whose loss is not a mean of per-example terms says so
(``dp_sgd_unsupported``) and ``--dp-sgd`` is refused naming it before any data is read.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from secfed.data.augment import TrainAugment, epoch_batches
from secfed.errors import ConfigIssue
from secfed.federation.messages import MODEL, Aggregate, Broadcast, Contribution, Summand, TrainStats
from secfed.models.copying import copy_model
from secfed.models.pretrain import initial_weights
from secfed.models.reid import Pretrained, ReIDModel
from secfed.models.sharing import SharedLayout, load_shared, shared_layout
from secfed.privacy import dpsgd

if TYPE_CHECKING:
    from secfed.config import RunConfig
    from secfed.privacy.dpsgd import ClientDpSgd

Loss = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
Penalty = Callable[[nn.Module], torch.Tensor]


@dataclass(frozen=True)
class Schedule:
    """Learning rates of one round (already decayed for the round) and the local budget."""

    lr_backbone: float
    lr_new: float
    epochs: int
    batch_size: int
    momentum: float = 0.9
    weight_decay: float = 5e-4


def step_lr(base: float, round_index: int, step: int, gamma: float) -> float:
    """Step decay over global rounds: base · gamma^⌊round/step⌋.

    FedReIDBench's reference code rebuilds its scheduler inside every round, so its "step size 40"
    never fires; here the schedule is a function of the global round and really decays.
    """
    return base * gamma ** (round_index // step)


@dataclass
class Site:
    """One client's private world: its images and labels, its model (shared part + local head) and
    whatever else the method keeps there (``extra``). Nothing here leaves the client except through
    the method's :class:`Contribution` and the privacy step."""

    id: int
    name: str
    images: torch.Tensor  # uint8 (N, 3, H, W) at the model's input size, on the model's device
    labels: torch.Tensor  # int64 labels for this site's classifier
    model: nn.Module
    weight_scale: float  # public normaliser from enrolment: the site's weight is n_k · weight_scale
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_examples(self) -> int:
        return len(self.images)


def make_optimizer(model: nn.Module, schedule: Schedule) -> torch.optim.SGD:
    """SGD with Nesterov momentum and two learning rates: backbone vs. layers trained from scratch
    (both reference codes, FedReIDBench and FedReID, use Nesterov)."""
    def in_backbone(name: str) -> bool:  # also inside wrappers: "model.backbone.…", "_module.backbone.…"
        return name.startswith("backbone.") or ".backbone." in name

    backbone = [p for n, p in model.named_parameters() if in_backbone(n) and p.requires_grad]
    new = [p for n, p in model.named_parameters() if not in_backbone(n) and p.requires_grad]
    return torch.optim.SGD(
        [{"params": backbone, "lr": schedule.lr_backbone}, {"params": new, "lr": schedule.lr_new}],
        momentum=schedule.momentum,
        weight_decay=schedule.weight_decay,
        nesterov=schedule.momentum > 0,
    )


def shuffled_batches(n: int, schedule: Schedule, generator: torch.Generator) -> Iterator[torch.Tensor]:
    for _ in range(schedule.epochs):
        yield from epoch_batches(n, schedule.batch_size, generator)


AUGMENT = TrainAugment()  # FedReIDBench's default: pad + random crop + horizontal flip


def cross_entropy_loss(model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
                       generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, logits) of identity classification on a uint8 batch, augmented here."""
    logits = model(AUGMENT(images, generator))
    return F.cross_entropy(logits, targets), logits


def train_loop(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[torch.Tensor],
    images: torch.Tensor,
    labels: torch.Tensor,
    loss_fn: Loss,
    generator: torch.Generator,
    *,
    penalty: Penalty | None = None,
) -> TrainStats:
    """The local loop every method runs: for each index batch, the loss, backward, a step.

    ``loss_fn(model, uint8 batch, targets, generator)`` augments as it needs (``generator`` drives
    it). ``penalty(model)`` is a term of the loss that depends on the weights alone, never on the
    data (FedProx's proximal term). Under the framework's DP-SGD (:func:`secfed.privacy.dpsgd.active`)
    the loop trains privately: ``loss_fn`` gets Opacus' per-example module, the batches are Poisson
    (the method's ``batches`` are not used), an empty one takes a noise-only step, and the penalty's
    gradient joins the clipped, noised one unclipped (post-processing). Loss and accuracy are
    accumulated on the device (no host synchronisation per step).
    """
    plain, private = model, None
    if (session := dpsgd.active()) is not None:
        private = session.privatise(model, optimizer, generator)
        model, optimizer, batches = private.module, private.optimizer, private.batches
    model.train()
    total_loss = torch.zeros((), dtype=torch.float64, device=labels.device)
    correct = torch.zeros((), dtype=torch.int64, device=labels.device)
    examples = steps = 0
    for index in batches:
        optimizer.zero_grad(set_to_none=True)  # before the forward: DP-SGD's per-example grads must be clear
        if len(index) == 0:
            assert private is not None, "only a Poisson batch (DP-SGD) is ever empty"
            private.empty_batch()
        else:
            targets = labels[index]
            loss, logits = loss_fn(model, images[index], targets, generator)
            if not torch.isfinite(loss):
                raise TrainingDiverged(steps + 1, float(loss.detach()))
            loss.backward()
            total_loss += loss.detach() * len(index)
            correct += (logits.detach().argmax(1) == targets).sum()
            examples += len(index)
        if private is not None:
            private.check_per_example()
        if penalty is not None:
            penalty(plain).backward()
        optimizer.step()
        steps += 1
    optimizer.zero_grad(set_to_none=True)  # also drops DP-SGD's per-example gradients
    return TrainStats(float(total_loss) / max(examples, 1), int(correct) / max(examples, 1), examples, steps)


class TrainingDiverged(ArithmeticError):
    """A local loss or update became NaN or infinite; ``step`` is the local step (1-based)."""

    def __init__(self, step: int, value: float) -> None:
        self.step = step
        super().__init__(f"the training loss became {value} at local step {step}")


def flat_state(model: nn.Module, layout: SharedLayout) -> torch.Tensor:
    return layout.flatten(model.state_dict()).cpu()


def update_weight(site: Site, aggregation: str) -> float:
    """A client's aggregation weight of its model update: n_k / Σ n (FedPav, MM'20 Alg. 1), or 1 for
    a plain mean (`method.aggregation` unweighted)."""
    return 1.0 if aggregation == "unweighted" else site.num_examples * site.weight_scale


class Method:
    """The FedPav way of answering every question (see the module docstring)."""

    name: ClassVar[str] = "supervised"
    shared_prefixes: ClassVar[tuple[str, ...]] = ("backbone.", "neck.")
    uses_global_labels: ClassVar[bool] = False  # one classifier over every client's identities (FedAvg)
    # Why the method's local training cannot run under the framework's example-level DP-SGD (its
    # loss couples examples, or it trains outside train_loop); None: it can. --dp-sgd is refused
    # naming the method and this reason before any data is read.
    dp_sgd_unsupported: ClassVar[str | None] = None
    # `method.*` settings only this method reads: any other method refuses a value other than the default
    own_settings: ClassVar[tuple[str, ...]] = ()
    # (new layers, backbone) learning rates when the method's paper fixes them (FedReID); None: the
    # schedule's defaults. `schedule.lr` / `schedule.lr_backbone` given by the user override either.
    learning_rates: ClassVar[tuple[float, float] | None] = None
    # Names of the per-client payloads this method shares in the clear, outside the secure sum (DFH:
    # its DFS); the privacy plan covers and states each, and the audit attacks them.
    shared_in_clear: ClassVar[tuple[str, ...]] = ()
    # A client's aggregation weight is a public function of its enrolled size (CDW's is not).
    public_weights: bool = True

    @classmethod
    def config_issues(cls, cfg: RunConfig) -> list[ConfigIssue]:
        """This method's own refusals of a configuration, checked before any data is read."""
        return []

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    # ---- model ----------------------------------------------------------------------------------

    def build_model(self, num_classes: int) -> nn.Module:
        """The initial model: backbone, neck and a classifier over ``num_classes`` identities."""
        m = self.cfg.model
        return ReIDModel(m.backbone, num_classes, pretrained=self.pretrained_weights(), neck_dim=m.neck_dim,
                         dropout=m.neck_dropout)

    def pretrained_weights(self) -> Pretrained:
        """The initial backbone `model.pretrained` names (the synthetic one verified from its file)."""
        return initial_weights(self.cfg.model, self.cfg.data.height, self.cfg.data.width)

    def layout(self, model: nn.Module) -> SharedLayout:
        """Which of ``model``'s tensors are shared (``shared_prefixes``, `model.bn_stats`), flattened how."""
        return shared_layout(model, self.shared_prefixes, self.cfg.model.bn_stats)

    # ---- client ---------------------------------------------------------------------------------

    def receive(self, site: Site, broadcast: Broadcast, layout: SharedLayout) -> None:
        """Load the global shared weights into the site's model (its local tensors stay)."""
        load_shared(site.model, layout, broadcast.weights)

    def local_train(self, site: Site, schedule: Schedule, seed: int, model: nn.Module | None = None) -> TrainStats:
        """E local epochs of identity classification; ``model`` defaults to the site's (the local-only
        baseline passes its own). Every random draw comes from ``seed``."""
        model = site.model if model is None else model
        torch.manual_seed(seed)  # dropout draws from torch's global generator
        generator = torch.Generator().manual_seed(seed)
        return train_loop(model, make_optimizer(model, schedule), shuffled_batches(site.num_examples, schedule, generator),
                          site.images, site.labels, cross_entropy_loss, generator)

    def client_step(self, site: Site, broadcast: Broadcast, layout: SharedLayout, schedule: Schedule,
                    seed: int) -> Contribution:
        """Receive, train locally, and contribute the update of the shared weights with the client's weight.
        (The client runs this inside the framework's DP-SGD when the run asks for it.)"""
        self.receive(site, broadcast, layout)
        stats = self.local_train(site, schedule, seed)
        update = flat_state(site.model, layout).sub_(broadcast.weights)  # in place: one 4·d-byte buffer, not two
        weight = update_weight(site, self.cfg.method.aggregation)
        return Contribution({MODEL: Summand(update, weight, statistics=layout.statistics_runs())}, stats=stats)

    # ---- server ---------------------------------------------------------------------------------

    def payloads(self, server_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What the broadcast carries besides the weights."""
        return {}

    def absorb(self, server_state: dict[str, torch.Tensor], aggregate: Aggregate) -> None:
        """Keep what the server needs of the clients' shared (not summed) payloads."""

    def refine(self, weights: torch.Tensor, aggregate: Aggregate) -> torch.Tensor:
        """After the weighted mean (and the privacy plan's noise): server-side training (KD); none by default."""
        return weights

    # ---- state ----------------------------------------------------------------------------------

    def site_state(self, site: Site) -> dict[str, torch.Tensor]:
        """Tensors a site keeps besides its model that a resume needs (FedReID: its latest local model)."""
        return {}

    def load_site_state(self, site: Site, state: Mapping[str, torch.Tensor]) -> None:
        """Restore what :meth:`site_state` saved."""

    def describe(self) -> str:
        """The method and its options, as the run's log names them."""
        return self.name


# The questions a method answers (its public instance methods) and what it declares (its annotated
# attributes), both read off Method itself: a hook or declaration added there is forwarded by
# MethodWrapper without a line of its own.
HOOKS: tuple[str, ...] = tuple(name for name, value in vars(Method).items()
                               if not name.startswith("_") and inspect.isfunction(value))
DECLARATIONS: tuple[str, ...] = tuple(Method.__annotations__)


class MethodWrapper(Method):
    """An option that adds to any method (KD, CDW): every hook in :data:`HOOKS` and every declaration
    in :data:`DECLARATIONS` is the wrapped method's (``inner``) unless the option overrides it, as
    Flower's mods wrap a message handler. The forwarding is generated, never hand-written, so a hook
    added to :class:`Method` cannot silently fall back to FedPav's answer under an option."""

    def __init__(self, inner: Method) -> None:
        super().__init__(inner.cfg)
        self.inner = inner
        for key in DECLARATIONS:
            setattr(self, key, getattr(inner, key))


def _forward(hook: str) -> Callable[..., Any]:
    """A method of MethodWrapper that asks ``self.inner`` the question ``hook`` names."""
    def forward(self: MethodWrapper, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, hook)(*args, **kwargs)

    forward.__name__, forward.__qualname__ = hook, f"MethodWrapper.{hook}"
    forward.__doc__ = f"``inner.{hook}``: {getattr(Method, hook).__doc__ or ''}"
    return forward


for _hook in HOOKS:
    setattr(MethodWrapper, _hook, _forward(_hook))


def eval_copy(model: nn.Module) -> nn.Module:
    """A frozen evaluation-mode copy (teachers and "before" models must not touch the live one)."""
    clone = copy_model(model)
    clone.eval()
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone


def with_summand(contribution: Contribution, name: str, summand: Summand) -> Contribution:
    return replace(contribution, summed={**contribution.summed, name: summand})


def train_alone(method: Method, site: Site, schedule: Schedule, seed: int, dp: ClientDpSgd | None) -> TrainStats:
    """The local-only baseline's round: ``method.local_train`` on ``site`` under the run's DP-SGD (as a
    federated client's step is), refused unless every step it took was private and accounted."""
    trainable = [p for p in site.model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in trainable] if dp is not None else []
    with dpsgd.private_local_training(dp, site.num_examples, schedule, method.name) as session:
        stats = method.local_train(site, schedule, seed)
    if session is not None:
        session.check(stats.steps, any(not torch.equal(a, p.detach()) for a, p in zip(before, trainable, strict=True)))
    return stats
