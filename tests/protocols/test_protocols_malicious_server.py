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
    ModelMismatch,
    SessionConfig,
    SignatureInvalid,
    UnknownClient,
    choose_params,
    shamir,
    simulate,
)
from secfed.protocols.crypto import public_bytes, sign
from secfed.protocols.prg import MaskStream, apply_masks
from secfed.protocols.secagg import keys
from secfed.protocols.secagg.messages import SERVER, AdvertiseKeys, SealedShare, ShareKind, SurvivorList, UnmaskRequest

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
        i: r.opened(r.clients[i].unmask(UnmaskRequest(
            **envelope(r, i), survivors=survivors, dropped=dropped, signatures=signatures,
            self_mask_shares=forwarded_self_shares(masked, survivors, i))))
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


def test_a_model_digest_claimed_to_one_client_at_share_keys_is_refused_and_nothing_is_unmasked(make_round):
    """Model inconsistency, with the digest out of the advertisement. The server sends victim 2
    another model (to single its update out) and so announces it another digest at share_keys.
    Every neighbour opens 2's key-seed share, finds the other digest sealed inside and refuses
    before masking (ModelMismatch); 2 refuses theirs. No masked input exists: the round aborts
    before any sum."""
    r = make_round(5, threshold=3, authenticated=True)
    victim = 2
    r.phases.model_hashes = [b"B" * 32 if i == victim else b"A" * 32 for i in range(5)]
    deliveries = r.share_keys(r.advertise())
    for i, delivery in deliveries.items():
        with pytest.raises(ModelMismatch, match="trained on model"):
            r.clients[i].receive_shares(r.wire(delivery))
        assert r.clients[i].state is ClientState.ABORTED
        with pytest.raises(Exception):  # an aborted client masks nothing, whatever it is asked
            r.clients[i].mask(r.inputs[i])
    assert r.server._inputs == {}  # no masked input reached the server
    with pytest.raises(BelowThreshold):  # and the round aborts: no sum, no unmask request
        r.server.close_phase()


def test_hiding_the_victims_share_from_its_neighbours_does_not_make_it_mask_another_model(make_round):
    """The same server also withholds 2's share from the others, so they see one model and mask
    without 2. 2 still receives only honest shares, each sealed with the digest A its neighbours
    train on: it refuses and its input is never masked. To show 2 shares carrying its own digest B
    the server would need t of 2's neighbours colluding — the threshold, as with the digest in the
    advertisement."""
    r = make_round(5, threshold=3, authenticated=True)
    victim = 2
    r.phases.model_hashes = [b"B" * 32 if i == victim else b"A" * 32 for i in range(5)]
    deliveries = r.share_keys(r.advertise())
    with pytest.raises(ModelMismatch):
        r.clients[victim].receive_shares(r.wire(deliveries[victim]))
    assert r.clients[victim].state is ClientState.ABORTED
    for i in (0, 1, 3, 4):
        hidden = replace(deliveries[i], shares=tuple(s for s in deliveries[i].shares if s.peer != victim))
        r.clients[i].receive_shares(r.wire(hidden))
        masked = r.clients[i].mask(r.inputs[i])
        assert victim not in [s.peer for s in masked.self_mask_shares]  # they mask without 2


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
            responses[i] = r.opened(r.clients[i].unmask(request))
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
    "0 dropped" gathers 2 signatures and "0 survived" 3, fewer than the quorum
    ⌊(5 + max(c, t − 1))/2⌋ + 1 = 4, so nobody reveals anything."""
    inputs = [np.arange(4, dtype=np.uint32)] * 4
    assert simulate(inputs).config.authenticated
    assert choose_params(4).authenticated
    with pytest.raises(ValueError, match="needs one identity key per client"):
        SessionConfig(bytes(16), 0, GraphParams.explicit(4, 3, 2), dimension=4, input_bound=None, server_key=bytes(32))

    r = make_round(5, threshold=2, authenticated=True)
    _, responses, refusals = run_equivocation(r)
    assert set(refusals) == {1, 2, 3, 4} and all("needs 4" in str(e) for e in refusals.values())
    assert all(r.clients[i].state is ClientState.ABORTED for i in (1, 2, 3, 4))
    key_shares_of_0 = [s for resp in responses.values() for s in resp.shares if s.owner == 0 and s.kind is ShareKind.MASK_KEY]
    assert key_shares_of_0 == []


def test_a_session_config_run_twice_lends_neither_run_its_signatures(make_round):
    """A lying server runs one SessionConfig twice, the complete graph, no colluder. Run 1: everyone
    signs the full survivor set. Run 2 (fresh clients, fresh keys): the victim is shown the full set,
    certified by run 1's signatures, the others "the victim dropped", certified by their own. The
    complete graph's seed hashes the roster's advertised keys, fresh in every run, so run 1's
    signatures certify nothing in run 2 and the victim reveals nothing. Before, the seed hashed the
    member ids alone — the same in both runs — and the server rebuilt the victim's input (review 83)."""
    first = make_round(5, threshold=2, authenticated=True)
    everyone, without = (0, 1, 2, 3, 4), (1, 2, 3, 4)
    mask_all(first, first.share_keys(first.advertise()))
    old = tuple((i, first.clients[i].consistency_check(SurvivorList(**envelope(first, i), survivors=everyone)).signature)
                for i in everyone)
    r = first.again()
    masked = mask_all(r, r.share_keys(r.advertise()))
    assert r.server._seed != first.server._seed
    r.clients[0].consistency_check(SurvivorList(**envelope(r, 0), survivors=everyone))
    new = tuple((i, r.clients[i].consistency_check(SurvivorList(**envelope(r, i), survivors=without)).signature)
                for i in without)
    responses = {i: r.opened(r.clients[i].unmask(UnmaskRequest(
        **envelope(r, i), survivors=without, dropped=(0,), signatures=new,
        self_mask_shares=forwarded_self_shares(masked, without, i)))) for i in without}
    asked_for = r.clients[0]._self_seed  # what the request would have bought (wiped on the abort)
    replayed = UnmaskRequest(**envelope(r, 0), survivors=everyone, dropped=(), signatures=old,
                             self_mask_shares=forwarded_self_shares(masked, everyone, 0))
    with pytest.raises(SignatureInvalid, match="consistency check"):
        r.clients[0].unmask(replayed)
    assert r.clients[0].state is ClientState.ABORTED
    # The refusal is what protects it: with the self-mask seed the request asked for, the input falls.
    own = keys.mask_private_key(r.config, 0, recover_key_seed(r, 0, responses))
    streams = [MaskStream(keys.self_mask_key(r.config, 0, asked_for), -1)]
    streams += [MaskStream(keys.pairwise_mask_key(r.config, 0, v, own, r.server._adverts[v].mask_public),
                           -keys.pairwise_sign(0, v)) for v in without]
    x = masked[0].vector.copy()
    apply_masks(x, streams, bits=r.config.ring_bits)
    assert np.array_equal(x, r.inputs[0])


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


def equivocate(r, count: int, victim: int = 0):
    """The equivocation with ``count`` colluders, through the real state machines. The server shows
    some honest clients A "the victim dropped" (they reveal its key-seed shares) and the rest B, and
    the victim, "the victim survived" (the victim reveals its self-mask seed); the colluders — the
    victim's neighbours, holding a share of each of its seeds — sign both sets and hand over their
    shares. A gets just enough members for its set to reach the quorum with the colluders, the
    victim's honest neighbours first. Returns (the victim's input if the server recovers it, else
    None; the honest clients that refused)."""
    cfg, t, q = r.config, r.config.params.threshold, r.config.params.signature_quorum
    masked = mask_all(r, r.share_keys(r.advertise()))
    colluders = r.graph.of(victim)[len(r.graph.of(victim)) - count:]
    everyone = tuple(range(cfg.n_clients))
    without = tuple(i for i in everyone if i != victim)
    honest = sorted((i for i in without if i not in colluders), key=lambda i: not r.graph.are_neighbours(victim, i))
    told_dropped = honest[: max(q - count, 0)]
    views = {i: without if i in told_dropped else everyone for i in (*honest, victim)}
    signatures: dict[tuple, list] = {without: [], everyone: []}
    for i, view in views.items():
        signatures[view].append((i, r.clients[i].consistency_check(SurvivorList(**envelope(r, i), survivors=view)).signature))
    for i in colluders:  # a colluder signs whatever the server asks
        for view in (without, everyone):
            signatures[view].append((i, sign(r.identities[i], keys.consistency_payload(cfg, r.server._seed, view))))
    responses, refused = {}, []
    for i, view in views.items():
        request = UnmaskRequest(**envelope(r, i), survivors=view, dropped=() if view is everyone else (victim,),
                                signatures=tuple(sorted(signatures[view])),
                                self_mask_shares=forwarded_self_shares(masked, view, i))
        try:
            responses[i] = r.opened(r.clients[i].unmask(request))
        except BelowThreshold:
            refused.append(i)
    key_shares = [shamir.Share(r.graph.share_index(victim, h), s.value) for h, resp in sorted(responses.items())
                  for s in resp.shares if s.owner == victim and s.kind is ShareKind.MASK_KEY]
    key_shares += [r.clients[i]._held[victim] for i in colluders]
    if victim not in responses or len(key_shares) < t:
        return None, refused
    own = keys.mask_private_key(cfg, victim, shamir.combine(key_shares[:t]))
    assert public_bytes(own) == r.server._adverts[victim].mask_public
    streams = [MaskStream(keys.self_mask_key(cfg, victim, responses[victim].self_mask_seed), -1)]
    for v in (s.peer for s in masked[victim].self_mask_shares):  # the partners it masked with
        key = keys.pairwise_mask_key(cfg, victim, v, own, r.server._adverts[v].mask_public)
        streams.append(MaskStream(key, -keys.pairwise_sign(victim, v)))
    x = masked[victim].vector.copy()
    apply_masks(x, streams, bits=cfg.ring_bits)
    return x, refused


# The review's parameters: two chosen by choose_params (the second a sparse graph), one by hand
# with c left at its default 0.
REVIEWED = {"choose_params(21)": choose_params(21), "choose_params(26)": choose_params(26),
            "GraphParams(11, 10, 5)": GraphParams.explicit(11, 10, 5)}


def reviewed_round(make_round, params: GraphParams):
    return make_round(params.n_clients, degree=params.degree, threshold=params.threshold,
                      corrupt_bound=params.corrupt_bound, authenticated=True)


@pytest.mark.parametrize("name,count", [(name, m) for name, p in REVIEWED.items() for m in range(p.collusion_bound + 1)])
def test_equivocation_fails_with_every_colluder_count_the_parameters_allow(make_round, name, count):
    """Up to max(c, t − 1) colluders (GraphParams.collusion_bound: what the threshold and c promise)
    cannot make both survivor sets reach the quorum, so the honest clients shown the short one
    refuse and the victim's input stays hidden. Before the quorum counted max(c, t − 1) instead
    of c, the server recovered it with 5 colluders (choose_params(21): t = 6, c = 4), 6
    (choose_params(26), sparse: t = 7, c = 5) and 1 (GraphParams(11, 10, 5), c = 0)."""
    params = REVIEWED[name]
    r = reviewed_round(make_round, params)
    recovered, refused = equivocate(r, count)
    assert recovered is None and refused
    assert params.signature_quorum * 2 - params.n_clients > params.collusion_bound >= params.threshold - 1


@pytest.mark.parametrize("name", REVIEWED)
def test_the_equivocation_recovers_the_input_when_the_quorum_counts_only_c(make_round, monkeypatch, name):
    """The attack above is real: with the quorum these parameters used to have, ⌊(n + c)/2⌋ + 1,
    2q − n colluders (5, 6 and 1 — fewer than t, so no threshold is crossed) recover the victim's
    input exactly."""
    monkeypatch.setattr(GraphParams, "signature_quorum", property(lambda p: (p.n_clients + p.corrupt_bound) // 2 + 1))
    params = REVIEWED[name]
    count = 2 * params.signature_quorum - params.n_clients
    assert count < params.threshold
    r = reviewed_round(make_round, params)
    recovered, refused = equivocate(r, count)
    assert refused == [] and np.array_equal(recovered, r.inputs[0])


@pytest.mark.parametrize("authenticated", [False, True])
def test_a_network_attacker_racing_advertisements_needs_client_authentication(make_round, authenticated):
    """An active network attacker — no server key, no help from the server — sends key
    advertisements in clients 1 and 2's names before theirs arrive, then plays them.

    Unauthenticated, nothing ties an advertisement to its sender but the transport: the server takes
    the attacker's, refuses the genuine ones as replays, and client 0 seals its key-seed and
    self-mask-seed shares to the attacker's keys, which then rebuilds x_0 from the wire bytes alone
    (t = 2). This is why the mode needs a transport that authenticates every client to the server
    (SECURITY.md, "Unauthenticated"). Authenticated, the forged advertisements carry no valid
    signature of 1 and 2: refused on arrival, the genuine ones count and the sum is exact."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from secfed.protocols import ReplayedMessage, SecAggClient, SignatureInvalid

    r = make_round(5, threshold=2, authenticated=authenticated)
    cfg, server = r.config, r.server
    if authenticated:  # keys of the attacker's own, signed with an identity key of its own
        attacker = Ed25519PrivateKey.generate()
        for i in (1, 2):
            fields = dict(enc_public=bytes([i]) * 32, mask_public=bytes([i + 2]) * 32, self_mask_commitment=bytes(32),
                          graph_commitment=bytes(32))
            payload = keys.advertise_payload(cfg, i, *fields.values())
            forged = AdvertiseKeys(**envelope(r, SERVER), **fields, config_digest=cfg.digest,
                                   signature=sign(attacker, payload))
            with pytest.raises(SignatureInvalid, match=f"client {i}'s keys"):
                server.receive(r.wire(replace(forged, sender=i)))
        r.unmask(r.consistency(r.masked_input(r.share_keys(r.advertise()))))
        assert np.array_equal(server.result.total, r.expected_sum(range(5)))
        return
    impostors = {i: SecAggClient(cfg, i) for i in (1, 2)}  # the attacker's own keys
    for impostor in impostors.values():
        server.receive(r.wire(impostor.advertise_keys()))
    players = {**dict(enumerate(r.clients)), **impostors}
    for i in range(5):
        advert = r.wire(r.clients[i].advertise_keys())
        if i in impostors:
            with pytest.raises(ReplayedMessage):
                server.receive(advert)
        else:
            server.receive(advert)
    for i, roster in server.close_phase().items():
        server.receive(r.wire(players[i].share_keys(r.wire(roster))))
    masked = mask_all(type("Played", (), {"clients": players, "inputs": r.inputs, "wire": r.wire}), server.close_phase())
    victim = masked[0]
    key_seed = shamir.combine([impostors[i]._held[0] for i in (1, 2)])
    self_seed = shamir.combine([impostors[i]._open_share(0, ShareKind.SELF_MASK, s.ciphertext)
                                for s in victim.self_mask_shares for i in (1, 2) if s.peer == i])
    private = keys.mask_private_key(cfg, 0, key_seed)
    acc = victim.vector.copy()
    streams = [MaskStream(keys.self_mask_key(cfg, 0, self_seed), -1)] + [
        MaskStream(keys.pairwise_mask_key(cfg, 0, s.peer, private, server._adverts[s.peer].mask_public),
                   -keys.pairwise_sign(0, s.peer)) for s in victim.self_mask_shares]
    apply_masks(acc, streams, bits=cfg.ring_bits)
    assert np.array_equal(acc, r.inputs[0])


def _one_identity_in_four_slots() -> tuple[bool, tuple[int, ...]]:
    """A server's friend holds slots 1–4 of a complete 5-client session under one identity key: the
    round runs, then the friend opens client 0's key seed and self-mask seed from the shares its slots
    hold and unmasks client 0's captured input. (Whether it equals the input, the survivors.)"""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from secfed.protocols.driver import Phases, Session, WireTransport
    from secfed.protocols.secagg.messages import MaskedInput

    victim, friend = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    n, params = 5, choose_params(5)
    s = Session.new(params, dimension=8, ring_bits=32, input_bound=None, identities=[victim] + [friend] * (n - 1))
    inputs = [np.arange(8, dtype=np.uint32) * 1000 + 7 * i for i in range(n)]
    transport, captured = WireTransport(s.server, n, None), {}
    upload = transport.upload
    transport.upload = lambda i, m: (captured.__setitem__(i, m) if isinstance(m, MaskedInput) else None, upload(i, m))[1]
    phases = Phases(s.clients, transport, model_hashes=s.model_hashes)
    out = phases.masked_input(phases.share_keys(phases.reveal(phases.advertise())), lambda i: inputs[i])
    cfg, advert = s.config, s.server._adverts[0]
    key_shares = [s.clients[j]._held[0] for j in range(1, n)]
    self_shares = [s.clients[j]._open_share(0, ShareKind.SELF_MASK, sh.ciphertext)
                   for j in range(1, n) for sh in captured[0].self_mask_shares if sh.peer == j]
    key_seed = shamir.recover(key_shares, params.threshold,
                              lambda z: public_bytes(keys.mask_private_key(cfg, 0, z)) == advert.mask_public, what="s0")
    self_seed = shamir.recover(self_shares, params.threshold,
                               lambda z: keys.self_mask_commitment(cfg, 0, z) == advert.self_mask_commitment, what="b0")
    private = keys.mask_private_key(cfg, 0, key_seed)
    vector = captured[0].vector.copy()
    apply_masks(vector, [MaskStream(keys.self_mask_key(cfg, 0, self_seed), -1)] + [
        MaskStream(keys.pairwise_mask_key(cfg, 0, v, private, s.server._adverts[v].mask_public), -keys.pairwise_sign(0, v))
        for v in range(1, n)], bits=32)
    phases.unmask(phases.consistency(out))
    return bool(np.array_equal(vector, inputs[0])), tuple(s.server.result.survivors)


def test_one_identity_in_several_slots_is_refused_before_a_key_is_exchanged(monkeypatch):
    """(review: SessionConfig checked the identity keys' count and length, not that they differ — a server
    listing its friend's key in four of five slots, each node's cohort check passing, read client 0's input
    exactly while the round completed normally)"""
    from secfed.protocols.secagg import session

    with pytest.raises(ValueError, match="identity key of client 2 repeats client 1's"):
        _one_identity_in_four_slots()
    # (a config a lying server sends a Flower node is refused on arrival: tests/adapters/test_flower_secagg.py)
    # The refusal is what protects the victim: without it the attack is complete
    monkeypatch.setattr(session, "check_distinct", lambda keys: None)
    assert _one_identity_in_four_slots() == (True, (0, 1, 2, 3, 4))
