"""The config center: snapshots, releases, and subscriptions that deliver
complete releases in order."""

from __future__ import annotations

import datetime
import logging
import random
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import grpc

from coordd import errors
from coordd._util import timestamp
from coordd.v1 import config_pb2

if TYPE_CHECKING:
    from coordd.client import Client

log = logging.getLogger("coordd")


@dataclass(frozen=True)
class KeyChange:
    """One key's change: old is None for a new key, new None for a deleted one."""

    key: str
    old: str | None
    new: str | None


@dataclass(frozen=True)
class Release:
    """One published change of a namespace (a release), as Publish, Put,
    Delete, Rollback or ListReleases return it."""

    namespace: str
    number: int
    revision: int
    author: str
    message: str
    time: datetime.datetime | None
    rollback_of: int
    changes: tuple[KeyChange, ...]

    @classmethod
    def _from(cls, r: config_pb2.ConfigRelease) -> "Release":
        return cls(r.namespace, r.number, r.revision, r.author, r.message, timestamp(r.time) if r.HasField("time") else None,
                   r.rollback_of, tuple(_change(c) for c in r.changes))


def _change(c: config_pb2.ConfigChange) -> KeyChange:
    return KeyChange(c.key, c.old_value if c.HasField("old_value") else None, c.new_value if c.HasField("new_value") else None)


@dataclass(frozen=True)
class NamespaceSnapshot:
    """A namespace's whole content at one revision.

    release: the release in effect (0: never written). revision: the etcd
    revision the content is consistent at. changed_revision: the revision
    of the namespace's last release. values: every key and its value."""

    namespace: str
    release: int
    revision: int
    changed_revision: int
    values: dict[str, str]
    gray: int = 0

    @classmethod
    def _from(cls, s: config_pb2.NamespaceSnapshot, revision: int | None = None) -> "NamespaceSnapshot":
        return cls(s.namespace, s.release, s.revision if revision is None else revision, s.changed_revision,
                   {e.key: e.value for e in s.entries if not e.secret}, s.gray)


@dataclass(frozen=True)
class ConfigUpdate:
    """What a subscription's callback receives: a namespace's new complete
    state.

    kind: "snapshot" (the first state, or a fresh one after a gap or a
    reconnect the server could not replay) or "change" (one release applied
    to the previous state). release: the namespace's release number after
    it. revision: the etcd revision of this state. values: the complete
    content (a dict of its own: keep it if you like). changes: the keys that
    changed since the state the callback saw before (for a first snapshot:
    every key, as new). info: the Release for a "change" (author, message),
    else None."""

    namespace: str
    kind: str
    release: int
    revision: int
    values: dict[str, str]
    changes: tuple[KeyChange, ...]
    gray: int = 0
    info: Release | None = None


def _diff(old: Mapping[str, str], new: Mapping[str, str]) -> tuple[KeyChange, ...]:
    keys = sorted(set(old) | set(new))
    return tuple(KeyChange(k, old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k))


@dataclass
class _NS:
    release: int = 0
    gray: int = 0
    values: dict[str, str] = field(default_factory=dict)
    known: bool = False  # a snapshot of it has been applied


# What _ConfigState.apply made of a message.
OK, GAP, BEHIND = "ok", "gap", "behind"


class _ConfigState:
    """The subscription's state machine, apart from the stream: it applies
    watch messages and says which updates to deliver. It never replaces a
    namespace's state with an older one of the same cluster, and takes a
    CHANGE only if it is the next release of what it has (else GAP: the
    caller re-reads a snapshot)."""

    def __init__(self, namespaces: Sequence[str]) -> None:
        self.namespaces = list(namespaces)
        self.spaces = {ns: _NS() for ns in self.namespaces}
        self.revision = 0
        self.cluster = ""
        self.started = False  # a first snapshot was applied

    def apply(self, msg: config_pb2.WatchResponse) -> tuple[str, list[ConfigUpdate]]:
        t = msg.type
        if t == config_pb2.WATCH_EVENT_TYPE_SNAPSHOT:
            same = self.cluster != "" and self.cluster == msg.cluster_id
            if same and msg.revision < self.revision:
                return BEHIND, []  # a lagging member's view
            if same and any(s.release < self.spaces[s.namespace].release for s in msg.snapshots if s.namespace in self.spaces):
                return BEHIND, []
            updates = []
            for s in msg.snapshots:
                cur = self.spaces.get(s.namespace)
                if cur is None:
                    continue
                values = {e.key: e.value for e in s.entries if not e.secret}  # secrets are never sent here
                if cur.known and same and cur.release == s.release and cur.gray == s.gray and cur.values == values:
                    continue  # nothing new (a reconnect's snapshot)
                changes = _diff(cur.values, values)
                self.spaces[s.namespace] = _NS(s.release, s.gray, values, True)
                updates.append(ConfigUpdate(s.namespace, "snapshot", s.release, msg.revision, dict(values), changes, s.gray))
            self.revision, self.cluster, self.started = msg.revision, msg.cluster_id, True
            return OK, updates
        if t == config_pb2.WATCH_EVENT_TYPE_CHANGE:
            r = msg.release
            cur = self.spaces.get(r.namespace)
            if not self.started or cur is None or r.number != cur.release + 1 or msg.gray != cur.gray:
                return GAP, []
            values = dict(cur.values)
            for c in r.changes:
                if c.HasField("new_value") and not c.secret:
                    values[c.key] = c.new_value
                else:
                    values.pop(c.key, None)
            self.spaces[r.namespace] = _NS(r.number, msg.gray, values, True)
            self.revision = max(self.revision, msg.revision)
            rel = Release._from(r)
            return OK, [ConfigUpdate(r.namespace, "change", r.number, msg.revision, dict(values), rel.changes, msg.gray, rel)]
        if t == config_pb2.WATCH_EVENT_TYPE_BOOKMARK and self.started:
            self.revision = max(self.revision, msg.revision)
        return OK, []


_PERMANENT = (errors.InvalidArgument, errors.PermissionDenied, errors.Unauthenticated, errors.ClientClosed)


class Subscription:
    """Follows config namespaces on a background thread that this object
    owns (close(), or the client's close(), stops it), and calls
    ``callback(update)`` on that thread with each namespace's new complete
    state (:class:`ConfigUpdate`).

    Guarantees (per namespace): the first update is a complete snapshot;
    then each release arrives as one update, complete (never half of a
    publish), in order of release number, never an older state after a
    newer one. After a disconnect the thread reconnects (the next endpoint
    after UNAVAILABLE; jittered backoff) and resumes after the last revision
    it had, so no release is skipped; when that is impossible (the server
    says COMPACTED, or sends a release that does not follow the one it
    has) it re-reads a snapshot, which is delivered as a "snapshot" update
    with the keys that changed meanwhile.

    Non-guarantees: updates are per namespace: releases of different
    namespaces are not ordered with each other across a reconnect. A
    callback that raises is reported to on_error (or logged) and the
    subscription goes on. No gray-release instance is named unless given.
    A dead connection is noticed by gRPC keep-alive pings (about 15 s);
    the Go SDK's stall timeout, cache file and apply-status reports are
    not implemented.
    """

    def __init__(self, client: "Client", namespaces: Sequence[str], callback: Callable[[ConfigUpdate], object] | None, *,
                 on_error: Callable[[BaseException], object] | None = None, start_timeout: float = 10.0,
                 instance: str = "", labels: dict[str, str] | None = None) -> None:
        if not namespaces:
            raise errors.InvalidArgument("subscribe to at least one namespace")
        self._client = client
        self.namespaces = list(namespaces)
        self._callback = callback
        self._on_error = on_error
        self._instance, self._labels = instance, dict(labels or {})
        self._state = _ConfigState(self.namespaces)
        self._mu = threading.Lock()  # guards _state reads from other threads, _call, _closed
        self._closed = False
        self._call = None
        self._wake = threading.Event()
        self._started = threading.Event()
        self._refused: errors.CoorddError | None = None
        #: Streams reopened, and fresh snapshots taken after the first.
        self.reconnects = 0
        self.relists = 0
        client._own(self)
        self._thread = threading.Thread(target=self._run, name=f"coordd-config-{','.join(self.namespaces)}"[:60], daemon=True)
        self._thread.start()
        if not self._started.wait(start_timeout):
            self.close()
            raise errors.Unavailable(f"no configuration from coordd within {start_timeout}s")
        if self._refused is not None:
            self.close()
            raise self._refused

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stops following and waits for the thread (do not call it from the
        callback: it returns without waiting then)."""
        with self._mu:
            self._closed = True
            call = self._call
        if call is not None:
            call.cancel()
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        self._client._disown(self)

    @property
    def revision(self) -> int:
        """The etcd revision the subscription's state is consistent at."""
        with self._mu:
            return self._state.revision

    def snapshot(self, namespace: str) -> NamespaceSnapshot:
        """The namespace's current state as the subscription has it
        (changed_revision is not tracked: 0)."""
        with self._mu:
            ns = self._state.spaces[namespace]
            return NamespaceSnapshot(namespace, ns.release, self._state.revision, 0, dict(ns.values), ns.gray)

    def _report(self, err: BaseException) -> None:
        if self._on_error is None:
            log.warning("coordd: config subscription %s: %s", self.namespaces, err)
            return
        try:
            self._on_error(err)
        except Exception:  # noqa: BLE001
            log.exception("coordd: config subscription on_error failed")

    def _deliver(self, updates: list[ConfigUpdate]) -> None:
        for u in updates:
            if self._callback is None:
                continue
            try:
                self._callback(u)
            except Exception as e:  # noqa: BLE001 - the callback's failure is reported
                self._report(e)

    def _run(self) -> None:
        backoff = 0.1
        from_rev = 0
        try:
            while True:
                with self._mu:
                    if self._closed:
                        return
                req = config_pb2.WatchRequest(namespaces=self.namespaces, from_revision=from_rev, instance=self._instance, labels=self._labels)
                try:
                    idx, call = self._client._stream("config", "Watch", req)
                except errors.ClientClosed:
                    return
                with self._mu:
                    if self._closed:
                        call.cancel()
                        return
                    self._call = call
                err: errors.CoorddError | None = None
                try:
                    for msg in call:
                        with self._mu:
                            was_started = self._state.started
                            result, updates = self._state.apply(msg)
                            rev = self._state.revision
                        if msg.type == config_pb2.WATCH_EVENT_TYPE_SNAPSHOT and was_started and result == OK:
                            self.relists += 1
                        if result == GAP:
                            from_rev = 0  # re-read a snapshot
                            break
                        if result == BEHIND:
                            from_rev = rev + 1
                            self._client._advance(idx)
                            break
                        from_rev = rev + 1
                        backoff = 0.1
                        self._deliver(updates)
                        if not self._started.is_set() and self._state.started:
                            self._started.set()
                except grpc.RpcError as e:
                    err = errors.from_rpc_error(e)
                finally:
                    call.cancel()
                    with self._mu:
                        self._call = None
                with self._mu:
                    if self._closed:
                        return
                if isinstance(err, _PERMANENT):
                    if not self._started.is_set():
                        self._refused = err
                        self._started.set()
                    else:
                        self._report(err)
                    return
                if isinstance(err, errors.Compacted):
                    from_rev = 0
                elif isinstance(err, errors.Unavailable):
                    self._client._advance(idx)
                log.info("coordd: config watch %s broke (%s); resuming from revision %d", self.namespaces, err, from_rev)
                self.reconnects += 1
                if self._wake.wait(backoff * random.uniform(0.5, 1.0)):
                    return
                backoff = min(2 * backoff, 5.0)
        finally:
            self._started.set()  # never leave the constructor waiting


class ConfigCenter:
    """The config center's calls; ``client.config``. Writes (put, delete,
    publish, rollback) each make one release, atomically; with
    expected_revision they are compare-and-set (RevisionMismatch). They are
    not retried: after Unavailable a write may or may not have happened
    (releases() tells)."""

    def __init__(self, client: "Client") -> None:
        self._client = client

    def snapshot(self, namespace: str, revision: int = 0) -> NamespaceSnapshot:
        """Reads a whole namespace, now (linearizable) or at a past revision
        (Compacted if it is older than etcd's history)."""
        r = self._client._unary("config", "Snapshot", config_pb2.SnapshotRequest(namespace=namespace, revision=revision), retry=True)
        return NamespaceSnapshot._from(r.snapshot)

    def get(self, namespace: str, key: str, revision: int = 0) -> tuple[str, int]:
        """Reads one key; returns its value and the revision that last set
        it. Raises KeyNotFound if it does not exist."""
        r = self._client._unary("config", "Get", config_pb2.GetRequest(namespace=namespace, key=key, revision=revision), retry=True)
        if r.secret:
            raise errors.InvalidArgument(f"coordd: {key} in {namespace} is a secret, which this client does not read")
        return r.value, r.mod_revision

    def publish(self, namespace: str, changes: Mapping[str, str | None], *, expected_revision: int = 0,
                author: str = "", message: str = "", dry_run: bool = False) -> Release:
        """Makes one release of many changes, atomically: each key is set to
        its value, or deleted when the value is None. Raises
        ValidationFailed (with every problem) when the namespace's schema
        refuses it, RevisionMismatch when expected_revision is stale."""
        muts = [config_pb2.ConfigMutation(key=k, delete=True) if v is None else config_pb2.ConfigMutation(key=k, value=v)
                for k, v in changes.items()]
        req = config_pb2.PublishRequest(namespace=namespace, mutations=muts, expected_revision=expected_revision,
                                        author=author, message=message, dry_run=dry_run)
        return Release._from(self._client._unary("config", "Publish", req).release)

    def put(self, namespace: str, key: str, value: str, *, expected_revision: int = 0, author: str = "", message: str = "") -> Release:
        """Sets one key: a release of one change."""
        req = config_pb2.PutRequest(namespace=namespace, key=key, value=value, expected_revision=expected_revision, author=author, message=message)
        return Release._from(self._client._unary("config", "Put", req).release)

    def delete(self, namespace: str, key: str, *, expected_revision: int = 0, author: str = "", message: str = "") -> Release:
        """Removes one key: a release of one change (KeyNotFound if missing)."""
        req = config_pb2.DeleteRequest(namespace=namespace, key=key, expected_revision=expected_revision, author=author, message=message)
        return Release._from(self._client._unary("config", "Delete", req).release)

    def releases(self, namespace: str, before: int = 0, limit: int = 20) -> list[Release]:
        """Up to limit kept releases, newest first, older than release
        number before (0: from the newest)."""
        r = self._client._unary("config", "ListReleases", config_pb2.ListReleasesRequest(namespace=namespace, before=before, page_size=limit), retry=True)
        return [Release._from(x) for x in r.releases]

    def rollback(self, namespace: str, to_release: int, *, expected_revision: int = 0, author: str = "", message: str = "") -> Release:
        """Makes a new release whose content is release to_release's."""
        req = config_pb2.RollbackRequest(namespace=namespace, to_release=to_release, expected_revision=expected_revision, author=author, message=message)
        return Release._from(self._client._unary("config", "Rollback", req).release)

    def schema(self, namespace: str) -> str:
        """The namespace's JSON Schema ("" when none is set)."""
        return self._client._unary("config", "GetSchema", config_pb2.GetSchemaRequest(namespace=namespace), retry=True).schema

    def set_schema(self, namespace: str, schema: str) -> int:
        """Sets (or with "" removes) the namespace's JSON Schema; the current
        content must match it. Returns the write's revision."""
        return self._client._unary("config", "SetSchema", config_pb2.SetSchemaRequest(namespace=namespace, schema=schema)).revision

    def subscribe(self, namespaces: str | Sequence[str], callback: Callable[[ConfigUpdate], object] | None = None, *,
                  on_error: Callable[[BaseException], object] | None = None, start_timeout: float = 10.0,
                  instance: str = "", labels: dict[str, str] | None = None) -> Subscription:
        """Follows namespaces and calls callback with every new state; see
        :class:`Subscription`. Returns once the first snapshot was delivered
        (raising InvalidArgument or PermissionDenied if the server refuses
        the watch, Unavailable if nothing came within start_timeout)."""
        if isinstance(namespaces, str):
            namespaces = [namespaces]
        return Subscription(self._client, namespaces, callback, on_error=on_error, start_timeout=start_timeout, instance=instance, labels=labels)
