"""Reads of coordd's fenced key-value store (written by fenced puts only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordd.v1 import kv_pb2

if TYPE_CHECKING:
    from coordd.client import Client


@dataclass(frozen=True)
class KeyValue:
    """One key of coordd's KV."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int

    @classmethod
    def _from(cls, p: kv_pb2.KeyValue) -> "KeyValue":
        return cls(p.key, p.value, p.create_revision, p.mod_revision, p.version)


class KV:
    """``client.kv``: reads of what fenced writes (Lock.put,
    Leadership.put, Client.fenced_put) wrote. Non-guarantee: a value read
    is what the last fenced write left; by the time the reader acts, a newer
    holder may have written. KV watches are not implemented in this client."""

    def __init__(self, client: "Client") -> None:
        self._client = client

    def get(self, key: str, revision: int = 0) -> KeyValue:
        """Reads key: the latest value (linearizable), or at a past
        revision (Compacted if older than etcd's history). Raises
        KeyNotFound if it does not exist."""
        r = self._client._unary("kv", "GetKV", kv_pb2.GetKVRequest(key=key, revision=revision), retry=True)
        return KeyValue._from(r.kv)

    def list(self, prefix: str = "", *, keys_only: bool = False) -> tuple[list[KeyValue], int]:
        """Reads every key under prefix, in key order, as one snapshot (all
        pages at the first page's revision); returns them and that revision."""
        out: list[KeyValue] = []
        token, rev = "", 0
        while True:
            r = self._client._unary("kv", "ListKV", kv_pb2.ListKVRequest(prefix=prefix, page_size=1000, page_token=token, revision=rev, keys_only=keys_only), retry=True)
            out.extend(KeyValue._from(kv) for kv in r.kvs)
            rev = rev or r.revision
            token = r.next_page_token
            if not token:
                return out, rev
