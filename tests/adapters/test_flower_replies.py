"""The SuperNodes' replies read as untrusted input (replies.py): a missing field, a wrong type, an
undecodable upload or a node speaking for another node's sites is a MalformedReply naming the node,
and the ServerApp leaves that node out instead of stopping the run (found by review: KeyError
'census', KeyError 'info', TypeError from an upload stopped the whole run with a traceback)."""

from __future__ import annotations

import json
import time

import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from secfed.adapters.flower.client_app import DIVERGED, STEP, UPLOADS
from secfed.adapters.flower.replies import Expected, MalformedReply, hello_reply, scores_reply, train_reply
from secfed.adapters.flower.server_app import FlowerRun
from secfed.adapters.flower.wire import array_bytes, bytes_array
from secfed.federation import codec
from secfed.federation.messages import Upload
from secfed.federation.runtime import SiteDiverged
from secfed.protocols import MalformedMessage

NODE = Expected(hosted=(1, 3), trains=(1,), names=frozenset({"plaza"}), baselines=frozenset({"plaza", "gate"}))
SHAPE = json.dumps([["model", 1000, "float", 8.0, [[990, 10]]], ["ring", 10, "ring", None]])
SCORE = {"rank1": 0.5, "rank5": 0.7, "rank10": 0.8, "mAP": 0.4}
CENSUS = {"info": {"fingerprint": "f" * 64, "clients": [{"id": 0, "name": "a", "images": 9, "classes": 2},
                                                        {"id": 1, "name": "b", "images": 9, "classes": 2}]},
          "global_classes": 4, "domains": [["campus", [0]]]}


def _train(**fields) -> RecordDict:
    record = {"step": "train", "sites": [1], "stats": "{}", "baseline": "{}", "accountants": "{}", **fields}
    return RecordDict({STEP: ConfigRecord({k: v for k, v in record.items() if v is not None}), UPLOADS: ArrayRecord()})


def test_a_well_formed_train_reply_is_read() -> None:
    content = _train(accountants=json.dumps({"1": {"fed": None, "local": None}}), shape=SHAPE)
    content[UPLOADS]["site-1"] = bytes_array(codec.encode_upload(Upload(1, 0, {}, {"dfs": torch.ones(2)})))
    content.config_records[STEP]["stats"] = json.dumps({"plaza": {"loss": 1.5, "accuracy": 0.2, "examples": 40}})
    reply = train_reply(7, content, NODE)
    assert (reply.sites, reply.shape, list(reply.accountants), [u.client_id for u in reply.uploads]) == (
        [1], SHAPE, [1], [1])
    for where in ("plaza", "gate (local-only baseline)"):
        assert train_reply(7, _train(diverged=json.dumps([where, "loss is NaN"])), NODE).diverged == (where,
                                                                                                     "loss is NaN")


@pytest.mark.parametrize(("content", "message"), [
    (RecordDict(), "malformed train reply .KeyError"),
    (_train(sites=None), "malformed train reply .KeyError"),
    (_train(stats="[1, 2]"), "stats must be a JSON dict"),
    (_train(stats="[" * 50_000), "malformed train reply .RecursionError"),
    (_train(accountants=json.dumps({"x": {}})), "ValueError"),
    (_train(accountants=json.dumps({"1": 5})), "accountant entry must be an object of 'fed' and 'local'"),
    (_train(diverged="nothing"), "malformed train reply"),
    (_train(sites=[0]), r"says it trained clients \[0\], the round's cohort holds \[1\]"),
    (_train(sites=[1, 3]), r"says it trained clients \[1, 3\]"),  # a hosted site outside the cohort
    (_train(accountants=json.dumps({"0": {"fed": None}})), r"clients \[0\] it does not host \(accountants\)"),
    # found by review of the first fix: each still stopped the ServerApp, or wrote another site's figures
    (_train(accountants=json.dumps({"1": {"fed": {"history": 5}}})), "ValueError"),
    (_train(stats=json.dumps({"plaza": {"accuracy": 0.5}})), "must be an object of numbers with a loss"),
    (_train(stats=json.dumps({"campus": {"loss": 1e9}})), r"speaks for sites \['campus'\] it does not train"),
    (_train(baseline=json.dumps({"campus": {"loss": 1e9}})), r"\['campus'\] it does not train \(baseline"),
    (_train(shape="not json"), "malformed train reply .JSONDecodeError"),
    (_train(shape="[1]"), r"list of \[name, length, encoding, bound, runs\]"),  # stopped the run (review)
    (_train(shape='[["model", -1, "float", 8.0, []]]'), "list of"),
    # found by review (a malicious node): each stopped the whole run, or reached the run's records
    (_train(diverged=json.dumps(["campus", "loss is NaN"])), "says 'campus' diverged, a site it does not train"),
    (_train(stats='{"plaza": {"loss": NaN}}'), "NaN is not a number"),
    (_train(stats='{"plaza": {"loss": 1e400}}'), "1e400 is not a finite number"),
    (_train(stats='{"plaza": {"loss": 1' + "0" * 400 + '}}'), "is not a 64-bit integer"),
    (_train(accountants=json.dumps({"1": {"fed": None}}).replace("null", '{"version": 1, "mechanism": "rdp", '
                                                                   '"history": [[1e400, 0.1, 3]]}')), "not a finite"),
])
def test_a_malformed_train_reply_names_its_node_and_what_is_wrong(content: RecordDict, message: str) -> None:
    with pytest.raises(MalformedReply, match=f"SuperNode 7: .*{message}"):
        train_reply(7, content, NODE)


def test_an_undecodable_or_foreign_upload_is_malformed() -> None:
    garbage = _train()
    garbage[UPLOADS]["site-1"] = bytes_array(b"SFED" + bytes(40))
    with pytest.raises(MalformedReply, match="CodecError"):
        train_reply(7, garbage, NODE)
    foreign = _train()
    foreign[UPLOADS]["site-1"] = bytes_array(codec.encode_upload(Upload(0, 0, {}, {"dfs": torch.ones(2)})))
    with pytest.raises(MalformedReply, match=r"clients \[0\] it does not host \(uploads\)"):
        train_reply(7, foreign, NODE)


def test_an_array_whose_header_declares_more_than_it_carries_is_malformed_before_anything_is_allocated() -> None:
    """(found by review: `Array.numpy()` trusts the .npy header; one declaring 2^40 entries made the
    ServerApp allocate 1 TiB and stop with MemoryError, in any Flower app over SecAggWorkflow too)"""
    carried = bytes_array(b"sixteen bytes ok")
    assert array_bytes(carried, "x") == b"sixteen bytes ok"
    for declared in ("(1099511627776,)", "(17,)", "(4, 4)"):
        bomb = Array(dtype="uint8", shape=(16,), stype="numpy.ndarray",
                     data=carried.data.replace(b"(16,)", declared.encode()))
        with pytest.raises(MalformedMessage, match="must be a 1-D uint8 array of the bytes it carries"):
            array_bytes(bomb, "x")
    with pytest.raises(MalformedMessage, match="not a numpy array"):
        array_bytes(Array(dtype="uint8", shape=(4,), stype="numpy.ndarray", data=b"\x93NUMPY junk"), "x")
    content = _train()
    content[UPLOADS]["site-1"] = Array(dtype="uint8", shape=(16,), stype="numpy.ndarray",
                                       data=carried.data.replace(b"(16,)", b"(1099511627776,)"))
    with pytest.raises(MalformedReply, match="SuperNode 7: malformed train reply .MalformedMessage"):
        train_reply(7, content, NODE)


def test_a_node_leaving_a_masked_round_stops_the_run_only_for_a_site_it_trains() -> None:
    from types import SimpleNamespace

    fed = SimpleNamespace(clients=[SimpleNamespace(site=SimpleNamespace(name=n)) for n in ("campus", "plaza")],
                          baselines={})
    hosts = drawn = {1: [0], 2: [1]}

    def left(node: int, where: str) -> SimpleNamespace:
        return SimpleNamespace(flow=SimpleNamespace(errors={node: f"ClientApp raised: {DIVERGED}"
                                                            + json.dumps([where, "loss is NaN"])}))

    FlowerRun._stop_if_diverged(left(2, "campus"), fed, hosts, drawn)  # node 2 does not train campus: left out
    deep = SimpleNamespace(flow=SimpleNamespace(errors={2: DIVERGED + "[" * 100_000}))  # recursed (review)
    FlowerRun._stop_if_diverged(deep, fed, hosts, drawn)
    with pytest.raises(SiteDiverged, match="plaza: loss is NaN"):
        FlowerRun._stop_if_diverged(left(2, "plaza"), fed, hosts, drawn)


def test_hello_and_scores_replies_are_checked_too() -> None:
    hello = RecordDict({STEP: ConfigRecord({"sites": [0], "census": json.dumps(CENSUS)})})
    sites, census = hello_reply(2, hello)
    assert sites == [0] and census.info["fingerprint"] == "f" * 64
    # (review: counts the server sizes its heads by were read unchecked — a list for a client, no classes,
    # a negative or a 10^12 identity count: TypeError, KeyError, RuntimeError or 128 TB asked of the SuperLink)
    def counts(**changed) -> str:
        clients = [{**CENSUS["info"]["clients"][0], **changed}, CENSUS["info"]["clients"][1]]
        return json.dumps({**CENSUS, "info": {**CENSUS["info"], "clients": clients}})

    for broken in ({"sites": [0]}, {"sites": [0], "census": json.dumps({"global_classes": 1})},
                   {"sites": [0], "census": json.dumps({**CENSUS, "info": {}})},
                   {"sites": [0], "census": json.dumps({**CENSUS, "info": {**CENSUS["info"], "clients": [[1, 2]]}})},
                   {"sites": [0], "census": counts(classes=None)}, {"sites": [0], "census": counts(classes=10)},
                   {"sites": [0], "census": counts(images=10**12, classes=10**12)},
                   {"sites": [0], "census": json.dumps({**CENSUS, "global_classes": -5})}):
        with pytest.raises(MalformedReply, match="SuperNode 2: malformed hello reply"):
            hello_reply(2, RecordDict({STEP: ConfigRecord(broken)}))
    scores = RecordDict({STEP: ConfigRecord({"scores": json.dumps([[0, "global", "campus", SCORE]])})})
    assert scores_reply(2, scores, hosted=[0]) == {(0, "global", "campus"): SCORE}
    with pytest.raises(MalformedReply, match="does not host"):
        scores_reply(2, scores, hosted=[1])
    for rows in ("[[0, 1]]", json.dumps([[0, "global", "campus", {"rank1": 0.5}]])):  # the second: no mAP
        with pytest.raises(MalformedReply, match="malformed evaluate reply"):
            scores_reply(2, RecordDict({STEP: ConfigRecord({"scores": rows})}), hosted=[0])
    diverged = RecordDict({STEP: ConfigRecord({"diverged": json.dumps(["campus", "features are not finite"])})})
    assert scores_reply(2, diverged, hosted=[0], names=["campus"]) == ("campus", "features are not finite")
    with pytest.raises(MalformedReply, match="'plaza' diverged, a site it does not host"):  # one node's word
        scores_reply(2, RecordDict({STEP: ConfigRecord({"diverged": json.dumps(["plaza", "x"])})}), [0], ["campus"])


def test_the_server_leaves_a_malformed_node_out_of_the_round_and_reads_the_others() -> None:
    from types import SimpleNamespace

    fed = SimpleNamespace(clients=[SimpleNamespace(site=SimpleNamespace(name=n)) for n in ("campus", "plaza")],
                          baselines={})
    read = FlowerRun._checked(fed, {1: [0], 2: [1]}, {1: [0], 2: [1]}, {1: RecordDict(), 2: _train()})
    assert list(read) == [2] and read[2].sites == [1]


def test_hello_counts_only_enrolled_nodes_and_one_description_of_the_data(tmp_path) -> None:
    """(found by review, a malicious node: one that never enrolled claimed every site and the run went
    on without the honest nodes; and the last node's census became the server's, whatever the others
    said, as long as the fingerprint matched)"""
    from flwr.app import Message

    from fakegrid import FakeGrid
    from secfed.adapters.flower import Cohort
    from secfed.adapters.flower import node as node_files
    from secfed.adapters.flower.server_app import Settings
    from secfed.config import ConfigError, RunConfig

    (tmp_path / "cohort.toml").write_text(Cohort({"site-a": node_files.public_identity(
        node_files.identity_key(tmp_path / "honest"))}).dumps())
    from flwr.clientapp import ClientApp

    from secfed.adapters.flower import SecAggMod

    def census(classes: int) -> dict:
        return {**CENSUS, "global_classes": classes}

    def claims(sites: list[int], described: dict):  # answers hello; never proves an identity
        return lambda msg, ctx: Message(RecordDict({STEP: ConfigRecord({
            "step": "hello", "sites": sites, "census": json.dumps(described)})}), reply_to=msg)

    def hello(cfg: RunConfig, apps: dict):
        grid = FakeGrid({n: (app, {}) for n, app in apps.items()})
        return FlowerRun(grid, Settings(cfg, tmp_path / "run", "token", tmp_path / "cohort.toml", start_timeout=0,
                                        phase_timeout=1, poll=0.01)).hello()

    authenticated = RunConfig()
    authenticated.secagg.enabled = True
    with pytest.raises(RuntimeError, match="no SuperNode hosts any client yet"):  # not "clients [0]" (review 85)
        hello(authenticated, {2001: claims([0, 1], census(4))})
    # an enrolled node of the cohort claiming every site before the others answered (review of the fix):
    # the run starts only once every identity of the cohort has enrolled, so the claim meets the others'
    evil = ClientApp(mods=[SecAggMod()])
    evil.train()(claims([0, 1], census(4)))
    (tmp_path / "cohort.toml").write_text(Cohort({
        "site-a": node_files.public_identity(node_files.identity_key(tmp_path / "honest")),
        "site-b": node_files.public_identity(node_files.identity_key(tmp_path / "evil"))}).dumps())
    grid = FakeGrid({2002: (evil, {node_files.STATE_DIR_KEY: str(tmp_path / "evil"),
                                   node_files.COHORT_KEY: str(tmp_path / "cohort.toml")})})
    with pytest.raises(RuntimeError, match="site-a of the cohort did not enrol after 0 s"):
        FlowerRun(grid, Settings(authenticated, tmp_path / "run", "token", tmp_path / "cohort.toml", start_timeout=0,
                                 phase_timeout=1, poll=0.01)).hello()

    # ... and a SuperNode restarting under a new node id while another site starts leaves its old claims
    # behind (review of the fix: the new claim met the old one, "claimed by more than one SuperNode")
    def enrolled(sites: list[int]) -> ClientApp:
        app = ClientApp(mods=[SecAggMod()])
        app.train()(claims(sites, census(4)))
        return app

    def node(folder: str) -> dict:
        return {node_files.STATE_DIR_KEY: str(tmp_path / folder), node_files.COHORT_KEY: str(tmp_path / "cohort.toml")}

    class Restarting(FakeGrid):
        calls = 0

        def get_node_ids(self) -> list[int]:  # site-b (node "evil") up, site-a at 2000, then back as 2002
            self.calls += 1
            return [2000] if self.calls == 1 else [2002] if self.calls == 2 else [2001, 2002]

    grid = Restarting({2000: (enrolled([0]), node("honest")), 2002: (enrolled([0]), node("honest")),
                       2001: (enrolled([1]), node("evil"))})
    hosts, _ = FlowerRun(grid, Settings(authenticated, tmp_path / "run", "token", tmp_path / "cohort.toml",
                                        start_timeout=30, phase_timeout=1, poll=0.01)).hello()
    assert hosts == {2001: [1], 2002: [0]}
    plain = RunConfig()
    plain.secagg.enabled = False  # no identities: nodes are the SuperLink's registered ones
    assert hello(plain, {2000: claims([0], census(4)), 2001: claims([1], census(4))})[0] == {2000: [0], 2001: [1]}

    def skipping(files: int) -> dict:  # a Thumbs.db in one node's copy: not a difference in the data (review)
        return {**census(4), "info": {**CENSUS["info"], "datasets": [{"name": "campus", "skipped": {"not_image": files}}]}}

    assert hello(plain, {2000: claims([0], skipping(0)), 2001: claims([1], skipping(1))})[0] == {2000: [0], 2001: [1]}
    with pytest.raises(ConfigError, match=r"describe the same data differently \(SuperNodes \[2000\]; SuperNodes "
                                          r"\[2001\]"):
        hello(plain, {2000: claims([0], census(4)), 2001: claims([1], census(999))})

    def backbone(digest: str) -> dict:  # nodes whose `secfed pretrain` wrote other weights (found by review)
        return {**census(4), "info": {**CENSUS["info"], "pretrained_sha256": digest}}

    with pytest.raises(ConfigError, match=r"start from different synthetic backbones \(SuperNodes \[2000\]"):
        hello(plain, {2000: claims([0], backbone("a" * 64)), 2001: claims([1], backbone("b" * 64))})


def test_hello_stops_at_a_refusal_when_the_nodes_are_the_users_own(tmp_path) -> None:
    """`secfed flower local` starts its nodes itself: a refusal (their policy, their data) will not change,
    so the run stops at once, naming it (before: 300 s of waiting for the start timeout)."""
    from flwr.app import Message

    from fakegrid import FakeGrid
    from secfed.adapters.flower.server_app import Settings
    from secfed.config import RunConfig

    def refusing(msg, ctx):
        raise RuntimeError("data.datasets: no dataset folder under /srv/empty")

    def answering(msg, ctx):
        return Message(RecordDict({STEP: ConfigRecord({"step": "hello", "sites": [1], "census": json.dumps(CENSUS)})}),
                       reply_to=msg)

    plain = RunConfig()
    plain.secagg.enabled = False
    grid = FakeGrid({2000: (refusing, {}), 2001: (answering, {})})
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="no SuperNode hosts clients \\[0\\]; SuperNode 2000 refused: .*no dataset "
                                           "folder under /srv/empty"):
        FlowerRun(grid, Settings(plain, tmp_path / "run", "token", None, start_timeout=300, phase_timeout=1, poll=0.01,
                                 stop_on_refusal=True)).hello()
    assert time.monotonic() - started < 30
    # Flower's own errors (a node unavailable for a heartbeat) are not the node's word: the run waits on
    # (found by review: one NODE_UNAVAILABLE stopped a healthy run)
    from flwr.app import Error
    from flwr.common.constant import ErrorCode

    calls = []

    def flaky(msg, ctx):
        calls.append(1)
        if len(calls) == 1:
            return Message(Error(ErrorCode.NODE_UNAVAILABLE, "Node Unavailable"), reply_to=msg)
        return Message(RecordDict({STEP: ConfigRecord({"step": "hello", "sites": [0], "census": json.dumps(CENSUS)})}),
                       reply_to=msg)

    grid = FakeGrid({2000: (flaky, {}), 2001: (answering, {})})
    hosts, _ = FlowerRun(grid, Settings(plain, tmp_path / "run", "token", None, start_timeout=60, phase_timeout=1,
                                        poll=0.01, stop_on_refusal=True)).hello()
    assert hosts == {2000: [0], 2001: [1]} and len(calls) == 2
