"""The SuperNodes' replies read as untrusted input (replies.py): a missing field, a wrong type, an
undecodable upload or a node speaking for another node's sites is a MalformedReply naming the node,
and the ServerApp leaves that node out instead of stopping the run (found by review: KeyError
'census', KeyError 'info', TypeError from an upload stopped the whole run with a traceback)."""

from __future__ import annotations

import json

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from secfed.adapters.flower.client_app import STEP, UPLOADS
from secfed.adapters.flower.replies import Expected, MalformedReply, hello_reply, scores_reply, train_reply
from secfed.adapters.flower.server_app import FlowerRun
from secfed.adapters.flower.wire import bytes_array
from secfed.federation import codec
from secfed.federation.messages import Upload

NODE = Expected(hosted=(1, 3), trains=(1,), names=frozenset({"plaza"}), baselines=frozenset({"plaza", "gate"}))
SHAPE = json.dumps([["model", 1000, "float", 8.0, [[990, 10]]], ["ring", 10, "ring", None]])
SCORE = {"rank1": 0.5, "rank5": 0.7, "rank10": 0.8, "mAP": 0.4}
CENSUS = {"info": {"fingerprint": "f" * 64, "clients": [{"id": 0}, {"id": 1}]}, "global_classes": 4,
          "domains": [["campus", [0]]]}


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
    assert train_reply(7, _train(diverged=json.dumps(["campus", "loss is NaN"])), NODE).diverged == ("campus",
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


def test_hello_and_scores_replies_are_checked_too() -> None:
    hello = RecordDict({STEP: ConfigRecord({"sites": [0], "census": json.dumps(CENSUS)})})
    sites, census = hello_reply(2, hello)
    assert sites == [0] and census.info["fingerprint"] == "f" * 64
    for broken in ({"sites": [0]}, {"sites": [0], "census": json.dumps({"global_classes": 1})},
                   {"sites": [0], "census": json.dumps({**CENSUS, "info": {}})}):
        with pytest.raises(MalformedReply, match="SuperNode 2: malformed hello reply"):
            hello_reply(2, RecordDict({STEP: ConfigRecord(broken)}))
    scores = RecordDict({STEP: ConfigRecord({"scores": json.dumps([[0, "global", "campus", SCORE]])})})
    assert scores_reply(2, scores, hosted=[0]) == {(0, "global", "campus"): SCORE}
    with pytest.raises(MalformedReply, match="does not host"):
        scores_reply(2, scores, hosted=[1])
    for rows in ("[[0, 1]]", json.dumps([[0, "global", "campus", {"rank1": 0.5}]])):  # the second: no mAP
        with pytest.raises(MalformedReply, match="malformed evaluate reply"):
            scores_reply(2, RecordDict({STEP: ConfigRecord({"scores": rows})}), hosted=[0])


def test_the_server_leaves_a_malformed_node_out_of_the_round_and_reads_the_others() -> None:
    from types import SimpleNamespace

    fed = SimpleNamespace(clients=[SimpleNamespace(site=SimpleNamespace(name=n)) for n in ("campus", "plaza")],
                          baselines={})
    read = FlowerRun._checked(fed, {1: [0], 2: [1]}, {1: [0], 2: [1]}, {1: RecordDict(), 2: _train()})
    assert list(read) == [2] and read[2].sites == [1]
