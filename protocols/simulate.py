"""Run the whole protocol in memory: n client state machines, one server, every message on the wire.

:func:`simulate` is how integrators test their embedding and how secfed's in-process federation
runs secure aggregation: each message is encoded to bytes, counted, and decoded by its receiver,
exactly as a real transport would carry it, so the byte counts are the real ones. The phases are
:func:`.driver.drive`'s, the one driver the benches and tests share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .driver import Session, StepHook, WireTransport, drive
from .quantize import Quantizer
from .secagg.graph import GraphParams, choose_params
from .secagg.session import Phase, SessionConfig


@dataclass(frozen=True, eq=False)
class SimulationResult:
    """Outcome of one simulated round.

    ``total``: the unmasked sum of the survivors' inputs — float64 when a quantizer was given,
    else the uint32 ring sum (then identical to ``ring_total``). ``survivors``: clients whose
    inputs are in the sum; ``dropped``: the others. ``bytes_sent[i]`` / ``bytes_received[i]``:
    wire bytes client i uploaded / downloaded.
    """

    total: np.ndarray
    ring_total: np.ndarray
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    bytes_sent: tuple[int, ...]
    bytes_received: tuple[int, ...]
    config: SessionConfig

    @property
    def params(self) -> GraphParams:
        return self.config.params


def simulate(
    inputs: Sequence[np.ndarray],
    *,
    dropouts: Mapping[int, Phase | str | int] | None = None,
    quantizer: Quantizer | None = None,
    rng: np.random.Generator | None = None,
    ring_bits: int | None = None,
    input_bound: int | None = None,
    params: GraphParams | None = None,
    dropout_rate: float = 0.1,
    corrupt_fraction: float = 0.2,
    authenticated: bool = True,
    model_hashes: Sequence[bytes] | None = None,
    session_id: bytes | None = None,
    round: int = 0,
    on_step: StepHook | None = None,
) -> SimulationResult:
    """Securely aggregate ``inputs`` (one 1-D vector per client): a :class:`SimulationResult` holding the
    unmasked sum of the survivors, who they are, and the bytes each party sent and received.

    Inputs are real vectors with a ``quantizer`` (and the ``rng`` its stochastic rounding draws
    from), or ring vectors (unsigned integers below 2^``ring_bits``, default 32). For ring vectors,
    ``input_bound`` is the largest magnitude of one client's value read as a signed ring integer:
    the session then refuses a ring too small for the sum and each client an input beyond it.
    Left at None, ring inputs are summed mod 2^ring_bits with no overflow guarantee (what modular
    schemes such as distributed DP with modular clipping want). With a quantizer it is
    ``quantizer.max_abs``.
    ``dropouts`` maps a client index to the phase whose message it never sends (it vanishes
    then): ``"advertise_keys"``, ``"graph_seed"`` (with a sparse graph the round then aborts:
    :class:`SeedWithheld`), ``"share_keys"``, ``"masked_input"``, ``"consistency_check"``
    (authenticated mode only) or ``"unmask"``. ``params`` fixes (k, t); by default
    :func:`choose_params` picks them from ``dropout_rate`` and ``corrupt_fraction``.
    ``authenticated`` (default) runs Bonawitz's malicious-server variant with fresh Ed25519
    identities standing in for a PKI; ``authenticated=False`` is the weaker variant, private only
    against an honest-but-curious server. ``model_hashes[i]`` is the digest of the model client i
    trains on (sealed into its key-seed shares).
    ``on_step`` receives the seconds of every step — each client's, the server's, the wire's — as a
    :class:`~.driver.StepTime` (how the benches time a round).

    Protocol refusals propagate as their typed errors (e.g. BelowThreshold, ModelMismatch).
    """
    n, dimension = _cohort_shape(inputs)
    ring_bits, input_bound = _ring_of(inputs, quantizer, rng, ring_bits, input_bound)
    if params is None:
        params = choose_params(
            n, dropout_rate=dropout_rate, corrupt_fraction=corrupt_fraction, authenticated=authenticated
        )
    elif params.n_clients != n:
        raise ValueError(f"params are for {params.n_clients} clients; {n} inputs given")
    if model_hashes is not None and len(model_hashes) != n:
        raise ValueError(f"{len(model_hashes)} model hashes for {n} clients")
    vanish = _dropout_schedule(dropouts or {}, n, authenticated)
    session = Session.new(params, dimension=dimension, ring_bits=ring_bits, input_bound=input_bound,
                          authenticated=authenticated, model_hashes=model_hashes, session_id=session_id,
                          round=round)
    transport = WireTransport(session.server, n, on_step)

    def ring_input(i: int) -> np.ndarray:
        if quantizer is not None:
            return quantizer.to_ring(np.asarray(inputs[i]), rng)
        return np.asarray(inputs[i])

    drive(session.clients, transport, ring_input, on_step=on_step, model_hashes=session.model_hashes,
          alive=lambda i, phase: i not in vanish or vanish[i] > phase)
    result = session.server.result
    total = quantizer.from_ring(result.total) if quantizer is not None else result.total
    return SimulationResult(
        total=total,
        ring_total=result.total,
        survivors=result.survivors,
        dropped=result.dropped,
        bytes_sent=tuple(transport.sent),
        bytes_received=tuple(transport.received),
        config=session.config,
    )


def _cohort_shape(inputs: Sequence[np.ndarray]) -> tuple[int, int]:
    """(clients, dimension) of ``inputs``: at least two 1-D vectors of one length."""
    n = len(inputs)
    if n < 2:
        raise ValueError(f"simulate needs at least 2 clients, got {n}")
    dims = {np.shape(x) for x in inputs}
    if len(dims) != 1 or len(next(iter(dims))) != 1:
        raise ValueError(f"inputs must be 1-D vectors of one length; got shapes {sorted(dims)}")
    return n, next(iter(dims))[0]


def _ring_of(inputs: Sequence[np.ndarray], quantizer: Quantizer | None, rng: np.random.Generator | None,
             ring_bits: int | None, input_bound: int | None) -> tuple[int, int | None]:
    """The session's (ring bits, input bound): the quantizer's, which the arguments must not
    contradict, or for ring inputs the arguments' (32 bits by default)."""
    if quantizer is None:
        if not all(np.issubdtype(np.asarray(x).dtype, np.integer) for x in inputs):
            raise TypeError("float inputs need a quantizer; ring inputs must be unsigned integers (uint32)")
        return (32 if ring_bits is None else ring_bits), input_bound
    if rng is None:
        raise ValueError("float inputs need rng: stochastic rounding draws from it (seed it from the run seed)")
    if quantizer.n_clients < len(inputs):
        raise ValueError(f"quantizer was sized for {quantizer.n_clients} clients; the cohort has {len(inputs)}")
    if ring_bits is not None and ring_bits != quantizer.bits:
        raise ValueError(f"ring_bits={ring_bits} contradicts the quantizer's {quantizer.bits} bits")
    if input_bound is not None and input_bound != quantizer.max_abs:
        raise ValueError(f"input_bound={input_bound} contradicts the quantizer's max_abs {quantizer.max_abs}")
    return quantizer.bits, quantizer.max_abs


def random_dropouts(
    n_clients: int, rate: float, rng: np.random.Generator, *, authenticated: bool = True
) -> dict[int, Phase]:
    """Each client vanishes with probability ``rate``, at a phase drawn uniformly (benches and tests;
    the runtime's ``--dropout-rate`` draws its own schedule per round from the run seed)."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"dropout rate must be in [0, 1], got {rate}")
    phases = [p for p in Phase if authenticated or p is not Phase.CONSISTENCY_CHECK]
    drops = rng.random(n_clients) < rate
    picks = rng.integers(0, len(phases), size=n_clients)
    return {i: phases[int(picks[i])] for i in range(n_clients) if drops[i]}


def _dropout_schedule(dropouts: Mapping[int, Phase | str | int], n: int, authenticated: bool) -> dict[int, Phase]:
    schedule = {}
    for client, phase in dropouts.items():
        if not 0 <= client < n:
            raise ValueError(f"dropout schedule names client {client}; the cohort is 0..{n - 1}")
        phase = Phase.parse(phase)
        if phase is Phase.CONSISTENCY_CHECK and not authenticated:
            raise ValueError(
                f"client {client} is scheduled to drop at the consistency check, "
                "which only authenticated mode has"
            )
        schedule[client] = phase
    return schedule
