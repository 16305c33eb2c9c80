"""An in-process Flower grid whose nodes behave like SuperNodes: every message runs the ClientApp
on a Context rebuilt from its serialised bytes (a fresh process keeps nothing else), and every
message crosses Flower's own object serialisation both ways."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.common.serde import context_from_proto, context_to_proto
from flwr.proto.message_pb2 import Context as ProtoContext
from flwr.serverapp import Grid
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents
from flwr.supercore.task_identity import TaskIdentity

RUN_ID = 7


def roundtrip(message: Message) -> Message:
    """``message`` as the receiver gets it: deflated to bytes object by object, inflated again."""
    objects = get_all_nested_objects(message)
    contents = {oid: obj.deflate() for oid, obj in objects.items()}
    out = inflate_object_from_contents(message.object_id, contents)
    out.metadata.__dict__["_message_id"] = message.metadata.message_id
    return out


def _label(message: Message) -> str:
    """secfed's step and the secure-aggregation stage a message carries, e.g. "train+masked_input",
    then the next session's stage riding on it ("unmask+advertise_keys")."""
    records = message.content.config_records
    parts = [str(records["secfed.train"]["step"])] if "secfed.train" in records else []
    parts += [str(records["secfed.secagg"]["stage"])] if "secfed.secagg" in records else []
    parts += [str(records["secfed.secagg.next"]["stage"])] if "secfed.secagg.next" in records else []
    return "+".join(parts) or "?"


class FakeGrid(Grid):
    """Nodes ``node_id → (ClientApp, node_config)``; ``dead`` nodes never answer."""

    def __init__(self, nodes: dict[int, tuple[ClientApp, dict]]) -> None:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = RUN_ID, 0, 1
        self.apps = {n: app for n, (app, _) in nodes.items()}
        self.contexts = {n: context_to_proto(Context(RUN_ID, n, cfg, RecordDict(), {})).SerializeToString()
                         for n, (_, cfg) in nodes.items()}
        self.dead: set[int] = set()
        self.replies: dict[str, Message] = {}
        self.errors: dict[int, list[str]] = {n: [] for n in nodes}
        self.tamper: Callable[[Message], None] | None = None  # a hostile server's hook, before delivery
        self._ids = itertools.count()
        self.trips: list[str] = []  # one entry per push: the secure-aggregation stage, else secfed's step

    def context(self, node: int) -> Context:
        return context_from_proto(ProtoContext.FromString(self.contexts[node]))

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        messages = list(messages)
        if messages:
            self.trips.append(_label(messages[0]))
        for m in messages:
            mid = f"m{next(self._ids)}"
            m.metadata.__dict__["_message_id"] = mid
            ids.append(mid)
            n = m.metadata.dst_node_id
            if n in self.dead:
                continue
            delivered = roundtrip(m)
            if self.tamper is not None:
                self.tamper(delivered)
            ctx = self.context(n)
            try:
                reply = self.apps[n](delivered, ctx)
            except Exception as exc:  # a ClientApp that raises: Flower answers with an error
                reply = Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, repr(exc)), reply_to=delivered)
            if reply.has_error():
                self.errors[n].append(reply.error.reason)
            self.contexts[n] = context_to_proto(ctx).SerializeToString()
            reply.metadata.__dict__["_message_id"] = f"r{mid}"
            self.replies[mid] = roundtrip(reply)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]

    def get_node_ids(self) -> list[int]:
        return [n for n in self.apps if n not in self.dead]

    def send_and_receive(self, messages, *, timeout=None):
        ids = self.push_messages(list(messages))
        return self.pull_messages(ids)

    # unused by the workflow
    def set_run(self, run):  # pragma: no cover
        pass

    @property
    def run(self):  # pragma: no cover
        raise NotImplementedError

    def create_message(self, *args, **kwargs):  # pragma: no cover
        raise NotImplementedError
