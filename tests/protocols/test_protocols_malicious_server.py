"""A lying server (with a colluding client) tries to unmask one honest client's input.

Each test plays the server by hand: it forwards, withholds and rewrites messages as it likes and
then computes what it can from everything it received. Where an attack needs one more secret,
the test checks that the attack would be complete with that secret (so the refusal is what
protects the victim, not a mistake in the attack).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from secfed.protocols import (
    BelowThreshold,
    ClientState,
    GraphParams,
    InconsistentView,
    SessionConfig,
    UnknownClient,
    choose_params,
    shamir,
    simulate,
)
from secfed.protocols.crypto import public_bytes
from secfed.protocols.prg import MaskStream, apply_masks
from secfed.protocols.secagg import keys
from secfed.protocols.secagg.messages import SERVER, SealedShare, ShareKind, SurvivorList, UnmaskRequest

replace = dataclasses.replace


def envelope(r, recipient: int) -> dict:
    return dict(session_id=r.config.session_id, round=r.config.round, sender=SERVER, recipient=recipient)


def forwarded_self_shares(masked: dict, survivors, holder: int) -> tuple[SealedShare, ...]:
    """The self-mask shares a server forwards to ``holder``: every survivor's share sealed for it."""
    return tuple(SealedShare(v, s.ciphertext) for v in sorted(survivors) for s in masked[v].self_mask_shares
                 if s.peer == holder)


def mask_all(r, deliveries: dict) -> dict:
    masked = {}
    for i, delivery in deliveries.items():
        r.clients[i].receive_shares(r.wire(delivery))
        masked[i] = r.clients[i].mask(r.inputs[i])
    return masked


def recover_key_seed(r, owner: int, responses: dict) -> bytes:
    shares = [shamir.Share(r.graph.share_index(owner, holder), s.value)
              for holder, resp in sorted(responses.items()) for s in resp.shares
              if s.owner == owner and s.kind is ShareKind.MASK_KEY]
    return shamir.combine(shares[: r.config.params.threshold])


def unmask_alone(r, victim: int, masked_vector: np.ndarray, self_seed: bytes, partner_keys: dict) -> np.ndarray:
    """What the server computes for ``victim`` alone: y − PRG(b) − Σ ±PRG(s_uv) over its partners,
    given each partner's key-agreement private key."""
    cfg, acc = r.config, masked_vector.copy()
    mask_public = r.server._adverts[victim].mask_public
    streams = [MaskStream(keys.self_mask_key(cfg, victim, self_seed), -1)]
    for v, private in partner_keys.items():
        key = keys.pairwise_mask_key(cfg, victim, v, private, mask_public)
        streams.append(MaskStream(key, -keys.pairwise_sign(victim, v)))
    apply_masks(acc, streams, bits=cfg.ring_bits)
    return acc


def test_withholding_honest_shares_from_a_victim_does_not_expose_it(make_round):
    """Selective share delivery. The server delivers to victim 0 only the key shares of clients 1, 2
    and the colluder 8, so 0 masks with those three alone; it then declares 1 and 2 dropped (their
    key seeds are rebuilt) and asks the other honest clients 3–7 for 0's self-mask shares. Before
    the fix every neighbour held a share of b_0 and revealed it: the server got x_0 exactly
    (authenticated mode, complete graph, n = 9, t = 3, one colluder). Now b_0 is shared only with
    the clients 0 masks with, so 3–7 hold nothing to reveal."""
    r = make_round(9, threshold=3, authenticated=True, corrupt_bound=1)
    victim, partners, colluder = 0, (1, 2), 8
    deliveries = r.share_keys(r.advertise())
    shown = deliveries[victim]
    deliveries[victim] = replace(shown, shares=tuple(s for s in shown.shares if s.peer in (*partners, colluder)))
    masked = mask_all(r, deliveries)
    b0 = r.clients[victim]._self_seed  # the omniscient check below needs it; the server never gets it
    assert [s.peer for s in masked[victim].self_mask_shares] == [*partners, colluder]

    survivors, dropped = (0, 3, 4, 5, 6, 7, 8), partners
    with pytest.raises(UnknownClient, match="never shared keys"):  # the victim signs nothing
        r.clients[victim].consistency_check(SurvivorList(**envelope(r, victim), survivors=survivors))
    signatures = tuple(
        (i, r.clients[i].consistency_check(SurvivorList(**envelope(r, i), survivors=survivors)).signature)
        for i in (3, 4, 5, 6, 7, colluder)
    )  # 6 ≥ quorum ⌊(9 + 1)/2⌋ + 1 = 6
    responses = {
        i: r.clients[i].unmask(UnmaskRequest(
            **envelope(r, i), survivors=survivors, dropped=dropped, signatures=signatures,
            self_mask_shares=forwarded_self_shares(masked, survivors, i)))
        for i in (3, 4, 5, 6, 7)
    }
    revealed_b0 = [s for resp in responses.values() for s in resp.shares if s.owner == victim]
    assert revealed_b0 == []  # the honest survivors hold no share of b_0
    held_by_colluder = [s.peer for s in masked[victim].self_mask_shares if s.peer == colluder]
    assert len(held_by_colluder) < r.config.params.threshold

    # The rest of the attack works: the dropped partners' key seeds are rebuilt from 3–7, the
    # colluder knows its own key. With b_0 the server would have x_0 — b_0 is what it lacks.
    partner_keys = {v: keys.mask_private_key(r.config, v, recover_key_seed(r, v, responses)) for v in partners}
    partner_keys[colluder] = r.clients[colluder]._mask_private
    assert np.array_equal(unmask_alone(r, victim, masked[victim].vector, b0, partner_keys), r.inputs[victim])


def run_equivocation(r, victim: int = 0):
    """The issue's attack: tell the victim's neighbours 1, 2 that it dropped (they reveal its key
    shares) and 3, 4 that it survived (they reveal its self-mask shares)."""
    deliveries = r.share_keys(r.advertise())
    masked = mask_all(r, deliveries)
    everyone, without = (0, 1, 2, 3, 4), (1, 2, 3, 4)
    views = {1: without, 2: without, 3: everyone, 4: everyone}
    signatures = {}
    if r.config.authenticated:
        for i, view in {**views, victim: everyone}.items():
            sig = r.clients[i].consistency_check(SurvivorList(**envelope(r, i), survivors=view)).signature
            signatures.setdefault(view, []).append((i, sig))
    responses, refusals = {}, {}
    for i, view in views.items():
        request = UnmaskRequest(
            **envelope(r, i), survivors=view, dropped=(victim,) if view is without else (),
            signatures=tuple(sorted(signatures.get(view, []))), self_mask_shares=forwarded_self_shares(masked, view, i))
        try:
            responses[i] = r.clients[i].unmask(request)
        except BelowThreshold as exc:
            refusals[i] = exc
    return masked, responses, refusals


def test_unauthenticated_mode_falls_to_the_dropped_and_survived_equivocation(make_round):
    """What `authenticated=False` does not protect against (SECURITY.md says so): x_0 is recovered."""
    r = make_round(5, threshold=2)  # honest-but-curious variant, complete graph
    masked, responses, refusals = run_equivocation(r)
    assert refusals == {}
    t = r.config.params.threshold
    b0_shares = [shamir.Share(r.graph.share_index(0, h), s.value) for h, resp in sorted(responses.items())
                 for s in resp.shares if s.owner == 0 and s.kind is ShareKind.SELF_MASK]
    b0 = shamir.combine(b0_shares[:t])
    s0 = recover_key_seed(r, 0, responses)
    own = keys.mask_private_key(r.config, 0, s0)
    assert public_bytes(own) == r.server._adverts[0].mask_public
    cfg, acc = r.config, masked[0].vector.copy()
    streams = [MaskStream(keys.self_mask_key(cfg, 0, b0), -1)]
    for v in (1, 2, 3, 4):
        key = keys.pairwise_mask_key(cfg, 0, v, own, r.server._adverts[v].mask_public)
        streams.append(MaskStream(key, -keys.pairwise_sign(0, v)))
    apply_masks(acc, streams, bits=cfg.ring_bits)
    assert np.array_equal(acc, r.inputs[0])


def test_the_default_mode_is_authenticated_and_refuses_the_equivocation(make_round):
    """Defaults: simulate, SessionConfig and choose_params are authenticated (a config without
    identity keys is refused rather than silently weaker). The same attack then fails: the view
    "0 dropped" gathers 2 signatures, fewer than the quorum 3, so 1 and 2 reveal nothing."""
    inputs = [np.arange(4, dtype=np.uint32)] * 4
    assert simulate(inputs).config.authenticated
    assert choose_params(4).authenticated
    with pytest.raises(ValueError, match="needs one identity key per client"):
        SessionConfig(bytes(16), 0, GraphParams.explicit(4, 3, 2), dimension=4, input_bound=None)

    r = make_round(5, threshold=2, authenticated=True)
    _, responses, refusals = run_equivocation(r)
    assert set(refusals) == {1, 2} and all("needs 3" in str(e) for e in refusals.values())
    assert all(r.clients[i].state is ClientState.ABORTED for i in (1, 2))
    key_shares_of_0 = [s for resp in responses.values() for s in resp.shares if s.owner == 0 and s.kind is ShareKind.MASK_KEY]
    assert key_shares_of_0 == []


def test_self_mask_share_of_a_client_listed_as_dropped_is_refused(make_round):
    """A forwarded self-mask share proves its owner sent a masked input: a request that lists the
    owner as dropped at the same time is the server lying, and the holder reveals nothing."""
    r = make_round(5, threshold=2)
    deliveries = r.share_keys(r.advertise())
    masked = mask_all(r, deliveries)
    request = UnmaskRequest(**envelope(r, 1), survivors=(1, 2, 3, 4), dropped=(0,), signatures=(),
                            self_mask_shares=forwarded_self_shares(masked, (0, 1, 2, 3, 4), 1))
    with pytest.raises(InconsistentView, match="lists as dropped"):
        r.clients[1].unmask(request)
    assert r.clients[1].state is ClientState.ABORTED
