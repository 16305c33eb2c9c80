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
from secfed.adapters.flower.replies import MalformedReply, hello_reply, scores_reply, train_reply
from secfed.adapters.flower.server_app import FlowerRun
from secfed.adapters.flower.wire import bytes_array
from secfed.federation import codec
from secfed.federation.messages import Upload

CENSUS = {"info": {"fingerprint": "f" * 64, "clients": [{"id": 0}, {"id": 1}]}, "global_classes": 4,
          "domains": [["campus", [0]]]}


def _train(**fields) -> RecordDict:
    record = {"step": "train", "sites": [1], "stats": "{}", "baseline": "{}", "accountants": "{}", **fields}
    return RecordDict({STEP: ConfigRecord({k: v for k, v in record.items() if v is not None}), UPLOADS: ArrayRecord()})


def test_a_well_formed_train_reply_is_read() -> None:
    content = _train(accountants=json.dumps({"1": {"fed": None, "local": None}}), shape="[[3, 1]]")
    content[UPLOADS]["site-1"] = bytes_array(codec.encode_upload(Upload(1, 0, {}, {"dfs": torch.ones(2)})))
    reply = train_reply(7, content, hosted=[1, 3])
    assert (reply.sites, reply.shape, list(reply.accountants), [u.client_id for u in reply.uploads]) == (
        [1], "[[3, 1]]", [1], [1])
    assert train_reply(7, _train(diverged=json.dumps(["campus", "loss is NaN"])), [1]).diverged == ("campus",
                                                                                                   "loss is NaN")


@pytest.mark.parametrize(("content", "message"), [
    (RecordDict(), "malformed train reply .KeyError"),
    (_train(sites=None), "malformed train reply .KeyError"),
    (_train(stats="[1, 2]"), "stats must be a JSON dict"),
    (_train(stats="[" * 50_000), "malformed train reply .RecursionError"),
    (_train(accountants=json.dumps({"x": {}})), "ValueError"),
    (_train(accountants=json.dumps({"1": 5})), "accountant state must be a JSON object"),
    (_train(diverged="nothing"), "malformed train reply"),
    (_train(sites=[0]), r"speaks for clients \[0\] it does not host \(trained sites\)"),
    (_train(accountants=json.dumps({"0": {"fed": {}}})), r"clients \[0\] it does not host \(accountants\)"),
])
def test_a_malformed_train_reply_names_its_node_and_what_is_wrong(content: RecordDict, message: str) -> None:
    with pytest.raises(MalformedReply, match=f"SuperNode 7: .*{message}"):
        train_reply(7, content, hosted=[1, 3])


def test_an_undecodable_or_foreign_upload_is_malformed() -> None:
    garbage = _train()
    garbage[UPLOADS]["site-1"] = bytes_array(b"SFED" + bytes(40))
    with pytest.raises(MalformedReply, match="CodecError"):
        train_reply(7, garbage, hosted=[1])
    foreign = _train()
    foreign[UPLOADS]["site-1"] = bytes_array(codec.encode_upload(Upload(0, 0, {}, {"dfs": torch.ones(2)})))
    with pytest.raises(MalformedReply, match=r"clients \[0\] it does not host \(uploads\)"):
        train_reply(7, foreign, hosted=[1])


def test_hello_and_scores_replies_are_checked_too() -> None:
    hello = RecordDict({STEP: ConfigRecord({"sites": [0], "census": json.dumps(CENSUS)})})
    sites, census = hello_reply(2, hello)
    assert sites == [0] and census.info["fingerprint"] == "f" * 64
    for broken in ({"sites": [0]}, {"sites": [0], "census": json.dumps({"global_classes": 1})},
                   {"sites": [0], "census": json.dumps({**CENSUS, "info": {}})}):
        with pytest.raises(MalformedReply, match="SuperNode 2: malformed hello reply"):
            hello_reply(2, RecordDict({STEP: ConfigRecord(broken)}))
    scores = RecordDict({STEP: ConfigRecord({"scores": json.dumps([[0, "global", "campus", {"rank1": 0.5}]])})})
    assert scores_reply(2, scores, hosted=[0]) == {(0, "global", "campus"): {"rank1": 0.5}}
    with pytest.raises(MalformedReply, match="does not host"):
        scores_reply(2, scores, hosted=[1])
    with pytest.raises(MalformedReply, match="malformed evaluate reply"):
        scores_reply(2, RecordDict({STEP: ConfigRecord({"scores": "[[0, 1]]"})}), hosted=[0])


def test_the_server_leaves_a_malformed_node_out_of_the_round_and_reads_the_others() -> None:
    read = FlowerRun._checked({1: [0], 2: [1]}, {1: RecordDict(), 2: _train()})
    assert list(read) == [2] and read[2].sites == [1]
