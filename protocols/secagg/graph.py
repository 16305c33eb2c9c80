"""Who masks with whom: the random Harary graph of SecAgg+ (Bell et al., CCS 2020), and (k, t).

Clients sit on a ring in a random order (a keystream from the round's graph seed decides it, see
:class:`NeighbourGraph`); each is joined to the k/2 nearest clients on either side. The graph seed is not
chosen by anyone: it hashes a nonce from every client, committed to in its key advertisement
before any nonce is revealed (see the client and server state machines). Every client secret-shares its
seeds t-of-k among its k neighbours and masks its input only with them. The complete graph
(k = n − 1) is plain SecAgg (Bonawitz et al., CCS 2017).

:func:`choose_params` picks the smallest even k, and for it the largest t, that meet two targets
computed from exact binomial and hypergeometric tails plus union bounds (no asymptotics), with
dropouts independent at rate δ and c = ⌊γn⌋ corrupted clients placed anywhere (the ring order
is random and independent of who is corrupt or drops):

* security (default 2^-40): P[some honest client has ≥ t corrupt neighbours]      (S1)
                           + P[the honest surviving clients split into ≥ 2 parts] (S2)
  S1 ≤ (n − c)·P[Hypergeom(n−1, c, k) ≥ t]. On the ring, the honest survivors split only if two
  disjoint runs of ≥ k/2 consecutive positions are all corrupt-or-dropped, so
  S2 ≤ C(n, 2)·Σ_j P[Hypergeom(n, c, k) = j]·δ^(k−j)   (the 2·(k/2) positions of the two runs).
* correctness (default 2^-20): P[some client keeps fewer than t surviving neighbours]
  ≤ n·P[Binomial(k, 1−δ) < t]; in authenticated mode also P[Binomial(n, 1−δ) < q], q the
  signature quorum ⌊(n + b)/2⌋ + 1 with b = max(c, t − 1) (:attr:`GraphParams.collusion_bound`).

For the chosen k, every t from the smallest secure one to the largest correct one meets both
targets; t is the midpoint, leaving margin on both sides: more dropouts than expected, and, in
the exposure bound S1, more colluders than assumed. In authenticated mode the consistency check
has no such margin: more than b colluders can make two survivor sets reach the quorum. When no sparse graph meets both, the complete graph is used: it has
S2 = 0 and S1 = 0 for any t > c; t is the midpoint of [c + 1, largest correct t], or c + 1 if
no t meets the correctness target (the achieved figures are reported in :class:`GraphParams`,
never hidden).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from ..crypto import hkdf, transcript


@dataclass(frozen=True)
class GraphParams:
    """Neighbour-graph parameters of one cohort and the failure figures they achieve.

    ``degree`` (k): neighbours per client; ``n_clients − 1`` is the complete graph (plain SecAgg).
    ``threshold`` (t): shares needed to reconstruct a client's seed. ``corrupt_bound`` (c):
    colluding clients the figures assume. ``security_failure`` / ``correctness_failure``: the upper
    bounds above, at ``dropout_rate``.

    What is promised (authenticated mode against a lying server as well): up to
    :attr:`collusion_bound` = max(c, t − 1) clients colluding with the server learn nothing beyond
    the survivors' sum, as long as fewer than t of them neighbour any honest client (certain for
    the complete graph, where the bound is at least t − 1; the ``security_failure`` figure for a
    sparse one). The consistency check's quorum is sized for that many colluders; at most
    :attr:`tolerated_dropouts` clients may vanish before it.
    """

    n_clients: int
    degree: int
    threshold: int
    corrupt_bound: int = 0
    dropout_rate: float = 0.0
    authenticated: bool = True
    security_failure: float = 0.0
    correctness_failure: float = 0.0

    def __post_init__(self) -> None:
        n, k, t = self.n_clients, self.degree, self.threshold
        if n < 2:
            raise ValueError(f"secure aggregation needs at least 2 clients, got {n}")
        if k != n - 1 and (not 2 <= k < n - 1 or k % 2):
            raise ValueError(f"degree must be even and in [2, n−1], or n−1 (complete); got k={k}, n={n}")
        if not 1 <= t <= k:
            raise ValueError(f"threshold must be in [1, degree={k}], got {t}")
        if not 0 <= self.corrupt_bound < n:
            raise ValueError(f"corrupt_bound must be in [0, n), got {self.corrupt_bound}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")

    @property
    def complete(self) -> bool:
        return self.degree == self.n_clients - 1

    @property
    def collusion_bound(self) -> int:
        """Colluding clients the consistency check withstands: max(c, t − 1).

        t − 1 at least, because the threshold promises that t − 1 colluders learn nothing: a quorum
        sized for fewer (c = 0 by default) let 2q − n colluders sign two survivor sets — "the victim
        survived" and "the victim dropped" — and collect both of a victim's seeds from honest
        clients (the equivocation attack, tests/protocols/test_protocols_malicious_server.py).
        """
        return max(self.corrupt_bound, self.threshold - 1)

    @property
    def signature_quorum(self) -> int:
        """Consistency-check signatures required in authenticated mode: ⌊(n + b)/2⌋ + 1, b the
        :attr:`collusion_bound`.

        Honest clients sign one survivor set per round, and colluders may sign any number: two sets
        both reach q only if 2q − n ≤ (colluders) — impossible with at most b of them, since
        2q − n ≥ b + 1. So the server cannot show different clients different survivors.
        """
        return (self.n_clients + self.collusion_bound) // 2 + 1

    @property
    def tolerated_dropouts(self) -> int:
        """Clients that may vanish before the consistency check in authenticated mode (n − q; about
        (n − b)/2, b the :attr:`collusion_bound`); unauthenticated, only the threshold limits dropouts."""
        return self.n_clients - self.signature_quorum if self.authenticated else self.n_clients

    @classmethod
    def explicit(
        cls,
        n_clients: int,
        degree: int,
        threshold: int,
        *,
        corrupt_bound: int = 0,
        dropout_rate: float = 0.0,
        authenticated: bool = True,
    ) -> GraphParams:
        """Parameters chosen by hand, with their failure figures computed."""
        probe = cls(n_clients, degree, threshold, corrupt_bound, dropout_rate, authenticated)
        return cls(
            n_clients, degree, threshold, corrupt_bound, dropout_rate, authenticated,
            security_failure=_security_failure(probe),
            correctness_failure=_correctness_failure(probe),
        )


def choose_params(
    n_clients: int,
    *,
    dropout_rate: float = 0.1,
    corrupt_fraction: float = 0.2,
    security_bits: int = 40,
    correctness_bits: int = 20,
    authenticated: bool = True,
    complete: bool = False,
) -> GraphParams:
    """(k, t) for a cohort of ``n_clients`` per Bell et al.: smallest even k meeting both targets.

    ``dropout_rate``: probability each client vanishes before the round ends. ``corrupt_fraction``:
    fraction of clients that may collude with the server. ``complete=True`` forces plain SecAgg.
    Raises ValueError when no threshold can be secure (c ≥ n − 1).
    """
    n = n_clients
    if n < 2:
        raise ValueError(f"secure aggregation needs at least 2 clients, got {n}")
    if not 0.0 <= corrupt_fraction < 1.0:
        raise ValueError(f"corrupt_fraction must be in [0, 1), got {corrupt_fraction}")
    c = math.floor(corrupt_fraction * n)
    if c >= n - 1:
        raise ValueError(f"{c} corrupt clients of {n}: no threshold keeps an honest client's input secret")
    security_target = 2.0**-security_bits
    base = dict(corrupt_bound=c, dropout_rate=dropout_rate, authenticated=authenticated)
    abort_budget = _abort_budgets(n, base, 2.0**-correctness_bits)
    if not complete:
        for k in range(2, n - 1, 2):
            split = _split_bound(n, k, c, dropout_rate)
            if split >= security_target:
                continue
            exposure = _exposure_tails(n, k, c)
            aborts = _abort_tails(n, k, dropout_rate)
            secure = [t for t in range(1, k + 1) if exposure[t] <= security_target - split]
            correct = [t for t in range(1, k + 1) if aborts[t] <= abort_budget(t)]
            if secure and correct and secure[0] <= correct[-1]:
                return GraphParams.explicit(n, k, (secure[0] + correct[-1]) // 2, **base)
    k = n - 1
    aborts = _abort_tails(n, k, dropout_rate)
    correct = [t for t in range(c + 1, k + 1) if aborts[t] <= abort_budget(t)]
    return GraphParams.explicit(n, k, (c + 1 + correct[-1]) // 2 if correct else c + 1, **base)


def withstands(params: GraphParams, colluders: int, *, security_bits: int = 40, dropout_floor: float = 0.0) -> bool:
    """Whether ``params`` keep an honest client's input secret against ``colluders`` clients
    colluding with the server, by the bounds :func:`choose_params` chooses with: the consistency
    check sized for them, and — complete graph — a threshold above them, or — sparse graph — the
    chance that some honest client has ≥ t colluding neighbours, or that the survivors split at
    the declared dropout rate (at least ``dropout_floor``: a server declaring 0 would have much sparser
    graphs pass), below 2^-security_bits. A client checks the session a server wrote."""
    n, k, t = params.n_clients, params.degree, params.threshold
    if not 0 <= colluders < n - 1 or params.collusion_bound < colluders:
        return False
    if params.complete:
        return t > colluders
    dropout = max(params.dropout_rate, dropout_floor)
    return _split_bound(n, k, colluders, dropout) + _exposure_tails(n, k, colluders)[t] <= 2.0**-security_bits


def _abort_budgets(n: int, base: dict, target: float):
    """t ↦ what the quorum leaves of the correctness target for the abort bound (at least half).

    The quorum depends on t once t − 1 exceeds c (:attr:`GraphParams.collusion_bound`), so its
    miss probability is computed per collusion bound, once each (a sparse graph's t rarely exceeds
    c + 1; at n = 100,000 c is 20,000)."""
    misses: dict[int, float] = {}

    def budget(t: int) -> float:
        bound = max(base["corrupt_bound"], t - 1)
        if bound not in misses:
            misses[bound] = _quorum_failure(GraphParams(n, n - 1, t, **base))
        return max(target - misses[bound], target / 2)

    return budget


@dataclass(frozen=True)
class NeighbourGraph:
    """The neighbour lists of one round: ``of(i)`` is client i's sorted neighbours.

    ``seed``: the round's graph seed (32 bytes). The complete graph does not depend on it.
    ``focus``: a client that needs only its own neighbourhood — its list, its place in each
    neighbour's list — builds the view with ``focus=its id``: O(k) memory, where the full graph
    holds the ring order of all n clients (what the server needs).

    The ring order sorts the clients by 64-bit keys: word i of the AES-128-CTR keystream under a
    key derived (HKDF) from the seed is client i's key, ties broken by id. Public once the nonces
    are revealed, identical for every party that saw the same nonces, unpredictable to anyone
    before that — and computed for 100,000 clients in milliseconds, so every client can afford it.
    Neighbour tests and share indices are arithmetic on ring positions, never n lists.
    """

    params: GraphParams
    seed: bytes
    focus: int | None = None

    def __post_init__(self) -> None:
        if self.focus is not None and not 0 <= self.focus < self.params.n_clients:
            raise ValueError(f"focus {self.focus} is outside the cohort [0, {self.params.n_clients})")

    # ---- the ring --------------------------------------------------------------------------------

    def _compute_ring(self) -> tuple[np.ndarray, np.ndarray]:
        """(order, position): order[p] is the client at ring position p, position[i] client i's place."""
        n = self.params.n_clients
        key = hkdf(self.seed, transcript("ring-order", n), 16)
        words = np.frombuffer(
            Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(8 * n)), dtype="<u8"
        )
        order = np.argsort(words, kind="stable")
        position = np.empty(n, dtype=np.int64)
        position[order] = np.arange(n)
        return order, position

    @cached_property
    def _ring(self) -> tuple[np.ndarray, np.ndarray]:
        return self._compute_ring()

    def _window(self, client: int, ring: tuple[np.ndarray, np.ndarray]) -> tuple[int, ...]:
        """Sorted neighbours of ``client`` on the ring (k/2 either side)."""
        order, position = ring
        return tuple(sorted(order[(position[client] + self._offsets) % self.params.n_clients].tolist()))

    @cached_property
    def _offsets(self) -> np.ndarray:
        """Ring offsets of the neighbours: −k/2 … −1, 1 … k/2."""
        half = self.params.degree // 2
        return np.concatenate([np.arange(-half, 0), np.arange(1, half + 1)])

    @cached_property
    def _local(self) -> tuple[tuple[int, ...], dict[int, int]]:
        """The focus client's view: its neighbours and its 1-based place in each one's list (the
        ring itself is not kept)."""
        me = self.focus
        if self.params.complete:
            return tuple(j for j in range(self.params.n_clients) if j != me), {}
        order, position = ring = self._compute_ring()
        mine = self._window(me, ring)
        # Row r: the neighbours of mine[r]; me is among them, and its place is 1 + those below it.
        rows = order[(position[list(mine)][:, None] + self._offsets[None, :]) % self.params.n_clients]
        places = (rows < me).sum(axis=1) + 1
        return mine, dict(zip(mine, places.tolist()))

    # ---- queries ---------------------------------------------------------------------------------

    def of(self, client: int) -> tuple[int, ...]:
        if self.focus is not None:
            self._require_local(client, client)
            return self._local[0]
        if self._complete:
            return tuple(range(client)) + tuple(range(client + 1, self.params.n_clients))
        return self._lists[client]

    def share_index(self, owner: int, holder: int) -> int:
        """1-based Shamir index of ``holder``'s share of ``owner``'s seeds (its place in owner's list).
        Raises KeyError when they are not neighbours."""
        if not self.are_neighbours(owner, holder):
            raise KeyError(f"client {holder} is not a neighbour of client {owner}")
        if self._complete:
            return holder + 1 if holder < owner else holder
        if self.focus is not None:
            return self._local[1][owner] if holder == self.focus else self._local[0].index(holder) + 1
        return bisect.bisect_left(self._lists[owner], holder) + 1

    def are_neighbours(self, a: int, b: int) -> bool:
        n = self.params.n_clients
        if not (0 <= a < n and 0 <= b < n) or a == b:
            return False
        if self._complete:
            return True
        if self.focus is not None:
            self._require_local(a, b)
            return (b if a == self.focus else a) in self._local[1]
        position = self._positions
        gap = abs(position[a] - position[b])  # ring distance: the shorter way round
        return min(gap, n - gap) <= self.params.degree // 2

    @cached_property
    def _complete(self) -> bool:
        return self.params.complete

    @cached_property
    def _positions(self) -> list[int]:
        """Ring positions as a Python list: scalar lookups in the server's hot loops."""
        return self._ring[1].tolist()

    @cached_property
    def _lists(self) -> _Lists:
        return _Lists(self)

    def _require_local(self, a: int, b: int) -> None:
        if self.focus not in (a, b):
            raise ValueError(f"this view holds client {self.focus}'s neighbourhood only (asked about {a}, {b})")


class _Lists(dict):
    """Neighbour lists of the full graph, built on first use per client."""

    def __init__(self, graph: NeighbourGraph) -> None:
        super().__init__()
        self._graph = graph

    def __missing__(self, client: int) -> tuple[int, ...]:
        value = self[client] = self._graph._window(client, self._graph._ring)
        return value


# ---- exact tails -------------------------------------------------------------------------------


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _hypergeom_pmf(j: int, population: int, successes: int, draws: int) -> float:
    if j < max(0, draws - (population - successes)) or j > min(draws, successes):
        return 0.0
    return math.exp(
        _log_comb(successes, j) + _log_comb(population - successes, draws - j) - _log_comb(population, draws)
    )


def _binom_pmf(j: int, trials: int, p: float) -> float:
    if p <= 0.0:
        return 1.0 if j == 0 else 0.0
    if p >= 1.0:
        return 1.0 if j == trials else 0.0
    return math.exp(_log_comb(trials, j) + j * math.log(p) + (trials - j) * math.log1p(-p))


def _exposure_tails(n: int, k: int, c: int) -> list[float]:
    """S1 for every t (index t, 0..k+1): P[some honest client has ≥ t corrupt of its k neighbours]."""
    pmf = [_hypergeom_pmf(j, n - 1, c, k) for j in range(k + 1)]
    tails = [0.0] * (k + 2)
    for t in range(k, -1, -1):
        tails[t] = tails[t + 1] + pmf[t]
    return [min(1.0, (n - c) * tail) for tail in tails]


def _abort_tails(n: int, k: int, dropout: float) -> list[float]:
    """For every t (index t, 0..k): P[some client keeps fewer than t of its k neighbours]."""
    out, below = [], 0.0
    for t in range(k + 1):
        out.append(min(1.0, n * below))
        below += _binom_pmf(t, k, 1.0 - dropout)
    return out


def _split_bound(n: int, k: int, c: int, dropout: float) -> float:
    """S2: P[honest survivors disconnected] ≤ C(n,2)·P[k given positions all corrupt or dropped]."""
    if k >= n - 1:
        return 0.0
    all_gone = sum(_hypergeom_pmf(j, n, c, k) * dropout ** (k - j) for j in range(0, min(k, c) + 1))
    return min(1.0, math.comb(n, 2) * all_gone)


def _quorum_failure(p: GraphParams) -> float:
    """Authenticated mode: P[fewer than the signature quorum survive].

    Summed downwards from q − 1: below the binomial's mode the terms shrink at least geometrically,
    so once a term is below 2^-80 of the sum the rest cannot change it (n = 100,000: a few hundred
    terms instead of 60,000)."""
    if not p.authenticated:
        return 0.0
    n, survive = p.n_clients, 1.0 - p.dropout_rate
    mode = math.floor((n + 1) * survive)
    total = 0.0
    for j in range(p.signature_quorum - 1, -1, -1):
        term = _binom_pmf(j, n, survive)
        total += term
        if j < mode and term <= total * 2.0**-80:
            break
    return total


def _security_failure(p: GraphParams) -> float:
    exposure = _exposure_tails(p.n_clients, p.degree, p.corrupt_bound)[p.threshold]
    return min(1.0, exposure + _split_bound(p.n_clients, p.degree, p.corrupt_bound, p.dropout_rate))


def _correctness_failure(p: GraphParams) -> float:
    aborts = _abort_tails(p.n_clients, p.degree, p.dropout_rate)[p.threshold]
    return min(1.0, aborts + _quorum_failure(p))
