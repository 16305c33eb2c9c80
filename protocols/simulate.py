"""Run the whole protocol in memory: n client state machines, one server, every message on the wire.

:func:`simulate` is how integrators test their embedding and how secfed's in-process federation
runs secure aggregation: each message is encoded to bytes, counted, and decoded by its receiver,
exactly as a real transport would carry it, so the byte counts are the real ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .quantize import Quantizer
from .secagg.client import NO_MODEL_HASH, SecAggClient
from .secagg.graph import GraphParams, choose_params
from .secagg.messages import Message, decode, encode
from .secagg.server import SecAggServer
from .secagg.session import Phase, ServerKey, SessionConfig, new_session_id


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
    against an honest-but-curious server. ``model_hashes[i]`` is the model digest client i reports.

    Protocol refusals propagate as their typed errors (e.g. BelowThreshold, ModelMismatch).
    """
    n = len(inputs)
    if n < 2:
        raise ValueError(f"simulate needs at least 2 clients, got {n}")
    dims = {np.shape(x) for x in inputs}
    if len(dims) != 1 or len(next(iter(dims))) != 1:
        raise ValueError(f"inputs must be 1-D vectors of one length; got shapes {sorted(dims)}")
    dimension = next(iter(dims))[0]
    if quantizer is not None:
        if rng is None:
            raise ValueError("float inputs need rng: stochastic rounding draws from it (seed it from the run seed)")
        if quantizer.n_clients < n:
            raise ValueError(f"quantizer was sized for {quantizer.n_clients} clients; the cohort has {n}")
        if ring_bits is not None and ring_bits != quantizer.bits:
            raise ValueError(f"ring_bits={ring_bits} contradicts the quantizer's {quantizer.bits} bits")
        if input_bound is not None and input_bound != quantizer.max_abs:
            raise ValueError(f"input_bound={input_bound} contradicts the quantizer's max_abs {quantizer.max_abs}")
        ring_bits, input_bound = quantizer.bits, quantizer.max_abs
    else:
        if not all(np.issubdtype(np.asarray(x).dtype, np.integer) for x in inputs):
            raise TypeError("float inputs need a quantizer; ring inputs must be unsigned integers (uint32)")
        ring_bits = 32 if ring_bits is None else ring_bits
    if params is None:
        params = choose_params(
            n, dropout_rate=dropout_rate, corrupt_fraction=corrupt_fraction, authenticated=authenticated
        )
    elif params.n_clients != n:
        raise ValueError(f"params are for {params.n_clients} clients; {n} inputs given")
    if model_hashes is not None and len(model_hashes) != n:
        raise ValueError(f"{len(model_hashes)} model hashes for {n} clients")
    vanish = _dropout_schedule(dropouts or {}, n, authenticated)

    identities = [Ed25519PrivateKey.generate() for _ in range(n)] if authenticated else []
    server_key = ServerKey.generate()  # fresh per session; unmask responses are sealed to it
    config = SessionConfig(
        session_id=session_id if session_id is not None else new_session_id(),
        round=round,
        params=params,
        dimension=dimension,
        ring_bits=ring_bits,
        input_bound=input_bound,
        server_key=server_key.public,
        authenticated=authenticated,
        identity_keys=tuple(k.public_key().public_bytes_raw() for k in identities),
    )
    clients = [
        SecAggClient(
            config, i,
            model_hash=model_hashes[i] if model_hashes is not None else NO_MODEL_HASH,
            identity_key=identities[i] if authenticated else None,
        )
        for i in range(n)
    ]
    server = SecAggServer(config, server_key)
    sent, received = [0] * n, [0] * n

    def alive(i: int, phase: Phase) -> bool:
        return i not in vanish or vanish[i] > phase

    def upload(i: int, message: Message) -> None:
        data = encode(message)
        sent[i] += len(data)
        server.receive(decode(data))

    def download(i: int, message: Message) -> Message:
        data = encode(message)
        received[i] += len(data)
        return decode(data)

    def ring_input(i: int) -> np.ndarray:
        if quantizer is not None:
            return quantizer.to_ring(np.asarray(inputs[i]), rng)
        return np.asarray(inputs[i])

    for i in range(n):
        if alive(i, Phase.ADVERTISE_KEYS):
            upload(i, clients[i].advertise_keys())
    outbox = server.close_phase()
    if server.phase is Phase.GRAPH_SEED:  # sparse graphs only: the complete graph needs no seed
        for i, commitments in outbox.items():
            if alive(i, Phase.GRAPH_SEED):
                upload(i, clients[i].reveal_graph_nonce(download(i, commitments)))
        outbox = server.close_phase()
    for i, roster in outbox.items():
        if alive(i, Phase.SHARE_KEYS):
            upload(i, clients[i].share_keys(download(i, roster)))
    for i, delivery in server.close_phase().items():
        if alive(i, Phase.MASKED_INPUT):
            clients[i].receive_shares(download(i, delivery))
            upload(i, clients[i].mask(ring_input(i)))
    outbox = server.close_phase()
    if authenticated:
        for i, survivors in outbox.items():
            if alive(i, Phase.CONSISTENCY_CHECK):
                upload(i, clients[i].consistency_check(download(i, survivors)))
        outbox = server.close_phase()
    for i, request in outbox.items():
        if alive(i, Phase.UNMASK):
            upload(i, clients[i].unmask(download(i, request)))
    server.close_phase()

    result = server.result
    total = quantizer.from_ring(result.total) if quantizer is not None else result.total
    return SimulationResult(
        total=total,
        ring_total=result.total,
        survivors=result.survivors,
        dropped=result.dropped,
        bytes_sent=tuple(sent),
        bytes_received=tuple(received),
        config=config,
    )


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
