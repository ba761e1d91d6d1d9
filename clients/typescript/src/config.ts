import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { Closable, Conn } from "./conn.js";
import { CoorddError, type ReasonName } from "./errors.js";
import {
  WatchEventType,
  type ConfigRelease as ReleaseMsg,
  type NamespaceSnapshot as SnapshotMsg,
  type WatchResponse,
} from "./gen/coordd/v1/config_pb.js";
import { jitter, linkSignals, sleep } from "./util.js";

/** A namespace's whole content at one revision. */
export interface NamespaceSnapshot {
  namespace: string;
  /** The release in effect (0n: never written). */
  release: bigint;
  /** The etcd revision the content is consistent at. */
  revision: bigint;
  /** The revision of the namespace's last release. */
  changedRevision: bigint;
  /** Every key and its value. */
  values: ReadonlyMap<string, string>;
}

/** One key's change: `old` is undefined for a new key, `new` for a deleted one. */
export interface KeyChange {
  key: string;
  old: string | undefined;
  new: string | undefined;
}

/** One published change of a namespace. */
export interface ConfigRelease {
  namespace: string;
  number: bigint;
  /** The etcd revision it was committed at (0n for a dry run). */
  revision: bigint;
  author: string;
  message: string;
  time: Date | undefined;
  rollbackOf: bigint;
  changes: KeyChange[];
}

/** One change a release asks for: set key to value, or delete it. */
export interface ConfigMutation {
  key: string;
  value?: string;
  delete?: boolean;
}

/** Qualifies a write. `expectedRevision` makes it a compare-and-set (REVISION_MISMATCH if the namespace changed after it). */
export interface PublishOptions {
  expectedRevision?: bigint;
  author?: string;
  message?: string;
  /** publish only: validate and return the changes, write nothing. */
  dryRun?: boolean;
}

/** What a subscription callback receives: one namespace at one complete release. */
export interface ConfigUpdate {
  namespace: string;
  /** The release now in effect. */
  release: bigint;
  /** The etcd revision of the namespace's last release (its changed revision). */
  revision: bigint;
  /** The namespace's complete content at that release. */
  values: ReadonlyMap<string, string>;
  /** The keys the release changed; for a snapshot, every key that differs from what was delivered before. */
  changes: KeyChange[];
  /** The update came from a snapshot (the first one, or after a gap) rather than from one release. */
  snapshot: boolean;
}

/** Options of ConfigCenter.subscribe. */
export interface SubscribeOptions {
  /** Called with problems the subscription cannot throw: a callback that threw, a stream that keeps failing. */
  onError?: (err: unknown) => void;
  /** How long subscribe() waits for the first snapshot before rejecting (default 10 s). */
  startTimeoutMs?: number;
  /** Names this watcher for gray releases, with its labels. */
  instance?: string;
  labels?: Record<string, string>;
}

function snapshotFrom(s: SnapshotMsg): NamespaceSnapshot {
  return {
    namespace: s.namespace,
    release: s.release,
    revision: s.revision,
    changedRevision: s.changedRevision,
    values: visible(s.entries),
  };
}

/**
 * The entries a reader sees: a secret's value is never sent to this client
 * (it does not ask for secrets), so secret keys are left out, as the Go
 * SDK leaves them out unless it reveals them.
 */
function visible(entries: { key: string; value: string; secret: boolean }[]): Map<string, string> {
  return new Map(entries.filter((e) => !e.secret).map((e) => [e.key, e.value]));
}

function releaseFrom(r: ReleaseMsg): ConfigRelease {
  return {
    namespace: r.namespace,
    number: r.number,
    revision: r.revision,
    author: r.author,
    message: r.message,
    time: r.time ? timestampDate(r.time) : undefined,
    rollbackOf: r.rollbackOf,
    changes: r.changes.map((c) => ({ key: c.key, old: c.oldValue, new: c.newValue })),
  };
}

/**
 * The config center: namespaces of keys, changed by atomic, numbered
 * releases. Writes (put, delete, publish) each make one release and are
 * not retried: after UNAVAILABLE a write may or may not have happened.
 * Reads are retried on the next endpoint.
 */
export class ConfigCenter {
  /** @internal Use Client.config. */
  constructor(private readonly conn: Conn) {}

  /** Reads a whole namespace at one revision (0n: now, linearizable; a past one may be COMPACTED). */
  async snapshot(namespace: string, revision = 0n): Promise<NamespaceSnapshot> {
    const resp = await this.conn.call((s, o) => s.config.snapshot({ namespace, revision }, o), { idempotent: true });
    return snapshotFrom(resp.snapshot!);
  }

  /**
   * Reads one key: its value and the revision of the release that last set
   * it. A key that does not exist fails with KEY_NOT_FOUND, as in the Go
   * and Python clients and REST's 404.
   */
  async get(namespace: string, key: string): Promise<{ value: string; modRevision: bigint }> {
    const resp = await this.conn.call((s, o) => s.config.get({ namespace, key }, o), { idempotent: true });
    if (resp.secret) {
      throw new CoorddError("INVALID_ARGUMENT", `coordd: ${key} in ${namespace} is a secret, which this client does not read (use the Go SDK's RevealSecrets or REST revealSecrets)`);
    }
    return { value: resp.value, modRevision: resp.modRevision };
  }

  /** Sets one key: a release of one change. */
  async put(namespace: string, key: string, value: string, o: PublishOptions = {}): Promise<ConfigRelease> {
    const resp = await this.conn.call((s, co) =>
      s.config.put(
        { namespace, key, value, expectedRevision: o.expectedRevision ?? 0n, author: o.author ?? "", message: o.message ?? "" },
        co,
      ),
    );
    return releaseFrom(resp.release!);
  }

  /** Removes one key (KEY_NOT_FOUND if missing): a release of one change. */
  async delete(namespace: string, key: string, o: PublishOptions = {}): Promise<ConfigRelease> {
    const resp = await this.conn.call((s, co) =>
      s.config.delete(
        { namespace, key, expectedRevision: o.expectedRevision ?? 0n, author: o.author ?? "", message: o.message ?? "" },
        co,
      ),
    );
    return releaseFrom(resp.release!);
  }

  /**
   * Makes one release of many changes, atomically. A release that breaks
   * the namespace's JSON Schema fails with VALIDATION_FAILED, listing
   * every problem in `err.problems`.
   */
  async publish(namespace: string, mutations: ConfigMutation[], o: PublishOptions = {}): Promise<ConfigRelease> {
    const resp = await this.conn.call((s, co) =>
      s.config.publish(
        {
          namespace,
          mutations: mutations.map((m) => ({ key: m.key, value: m.value ?? "", delete: m.delete ?? false })),
          expectedRevision: o.expectedRevision ?? 0n,
          author: o.author ?? "",
          message: o.message ?? "",
          dryRun: o.dryRun ?? false,
        },
        co,
      ),
    );
    return releaseFrom(resp.release!);
  }

  /**
   * Follows namespaces and calls `callback` with each namespace's complete
   * content whenever it changes. Resolves once the first snapshot has been
   * delivered to the callback (one update per namespace).
   *
   * Guarantees: per namespace, updates come in release order, each a
   * complete release (never half of a publish), never an older release
   * after a newer one. Callbacks run one at a time, in order, and are
   * awaited: the next message is read only after the callback settled. A
   * broken stream is reopened (on the next endpoint after UNAVAILABLE) from
   * the last revision received; whenever a release cannot follow the one
   * delivered (a gap) or the server answers COMPACTED, the subscription
   * reads a fresh snapshot (a watch from revision 0) and delivers each
   * namespace whose release moved on.
   *
   * Not guaranteed: that every release is delivered. After a gap or a
   * reconnect that the server answers with a snapshot, the releases in
   * between are skipped and the newer content arrives as one update
   * (`snapshot: true`). Nor that the content is current: a disconnected
   * subscription serves the last one it had.
   */
  async subscribe(
    namespaces: string[],
    callback: (update: ConfigUpdate) => void | Promise<void>,
    opts: SubscribeOptions = {},
  ): Promise<Subscription> {
    if (namespaces.length === 0) {
      throw new CoorddError("INVALID_ARGUMENT", "coordd: subscribe to at least one namespace");
    }
    const sub = new Subscription(this.conn, namespaces, callback, opts);
    this.conn.open.add(sub);
    try {
      await sub.started(opts.startTimeoutMs ?? 10_000);
    } catch (e) {
      await sub.close();
      throw e;
    }
    return sub;
  }
}

interface NsState {
  release: bigint;
  changed: bigint;
  gray: bigint; // the gray release whose overrides values include (0n: none)
  values: ReadonlyMap<string, string>;
}

/** A stream that must be reopened from a fresh snapshot. */
class Gap extends Error {}

/** A running config subscription; see ConfigCenter.subscribe. */
export class Subscription implements Closable {
  private readonly ac = new AbortController();
  private readonly state = new Map<string, NsState>();
  private rev = 0n; // everything up to it has been applied
  private cluster = "";
  private readonly firstSnapshot: Promise<void>;
  private resolveFirst!: () => void;
  private rejectFirst!: (e: unknown) => void;
  private readonly loop: Promise<void>;

  /** @internal Use ConfigCenter.subscribe. */
  constructor(
    private readonly conn: Conn,
    readonly namespaces: string[],
    private readonly callback: (update: ConfigUpdate) => void | Promise<void>,
    private readonly opts: SubscribeOptions,
  ) {
    this.firstSnapshot = new Promise((res, rej) => {
      this.resolveFirst = res;
      this.rejectFirst = rej;
    });
    this.firstSnapshot.catch(() => {});
    this.loop = this.run();
  }

  /** The etcd revision up to which the subscription has applied everything. */
  get revision(): bigint {
    return this.rev;
  }

  /** A namespace's last delivered content, or undefined before its first update. */
  current(namespace: string): { release: bigint; values: ReadonlyMap<string, string> } | undefined {
    const st = this.state.get(namespace);
    return st && { release: st.release, values: st.values };
  }

  /** @internal */
  async started(timeoutMs: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, rej) => {
      timer = setTimeout(
        () => rej(new CoorddError("UNAVAILABLE", `coordd: no configuration from coordd within ${timeoutMs} ms`)),
        timeoutMs,
      );
    });
    try {
      await Promise.race([this.firstSnapshot, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Stops following and waits for a running callback to finish. Do not await it from the callback. */
  async close(): Promise<void> {
    this.conn.open.delete(this);
    this.ac.abort(new CoorddError("CLIENT_CLOSED", "coordd: subscription closed"));
    await this.loop;
  }

  private report(err: unknown): void {
    try {
      this.opts.onError?.(err);
    } catch {
      // the reporter's own failure
    }
  }

  private async deliver(u: ConfigUpdate): Promise<void> {
    try {
      await this.callback(u);
    } catch (e) {
      this.report(e);
    }
  }

  private async run(): Promise<void> {
    const link = linkSignals(this.ac.signal, this.conn.closed);
    const signal = link.signal;
    let backoff = 100;
    let failures = 0;
    try {
      while (!signal.aborted) {
        const ep = this.conn.pick();
        const attempt = new AbortController(); // ends this stream when it is given up
        const stop = () => attempt.abort();
        signal.addEventListener("abort", stop, { once: true });
        try {
          const stream = ep.services.config.watch(
            {
              namespaces: this.namespaces,
              fromRevision: this.rev === 0n ? 0n : this.rev + 1n,
              instance: this.opts.instance ?? "",
              labels: this.opts.labels ?? {},
            },
            { signal: attempt.signal },
          );
          for await (const msg of stream) {
            await this.apply(msg);
            backoff = 100;
            failures = 0;
          }
        } catch (e) {
          if (signal.aborted) return;
          if (e instanceof Gap) {
            this.rev = 0n; // reopen from a fresh snapshot (after the pause below)
            this.report(e);
          } else {
            const err = this.conn.convert(e) as CoorddError;
            const permanent: ReasonName[] = ["INVALID_ARGUMENT", "PERMISSION_DENIED", "UNAUTHENTICATED", "UNIMPLEMENTED"];
            if (permanent.includes(err.reason)) {
              this.rejectFirst(err);
              this.report(err);
              return;
            }
            if (err.reason === "COMPACTED") this.rev = 0n; // read a snapshot again
            this.conn.noteFailure(ep, err);
            if (++failures % 5 === 0) this.report(err);
          }
        } finally {
          signal.removeEventListener("abort", stop);
          attempt.abort();
        }
        await sleep(jitter(backoff), signal);
        backoff = Math.min(2 * backoff, 10_000);
      }
    } catch {
      // aborted during a pause
    } finally {
      link.dispose();
      // subscribe() stops waiting for a first snapshot that will not come.
      this.rejectFirst(new CoorddError("CLIENT_CLOSED", "coordd: subscription closed before its first snapshot"));
    }
  }

  private async apply(msg: WatchResponse): Promise<void> {
    switch (msg.type) {
      case WatchEventType.SNAPSHOT: {
        const sameCluster = this.cluster !== "" && this.cluster === msg.clusterId;
        if (sameCluster && msg.revision < this.rev) return; // a lagging member's older state
        this.cluster = msg.clusterId;
        for (const snap of msg.snapshots) {
          const old = this.state.get(snap.namespace);
          if (old && sameCluster && snap.release === old.release && snap.changedRevision === old.changed && snap.gray === old.gray) continue;
          if (old && sameCluster && snap.release < old.release) continue; // never older after newer
          const values = visible(snap.entries);
          this.state.set(snap.namespace, { release: snap.release, changed: snap.changedRevision, gray: snap.gray, values });
          await this.deliver({
            namespace: snap.namespace,
            release: snap.release,
            revision: snap.changedRevision,
            values,
            changes: diff(old?.values ?? new Map(), values),
            snapshot: true,
          });
        }
        this.rev = msg.revision;
        this.resolveFirst();
        return;
      }
      case WatchEventType.CHANGE: {
        const r = msg.release;
        const old = r && this.state.get(r.namespace);
        if (!r || !old || r.number !== old.release + 1n || msg.gray !== old.gray) {
          throw new Gap("coordd: a release that does not follow the last one"); // a gray's start or end comes as a snapshot
        }
        const values = new Map(old.values);
        for (const c of r.changes) {
          if (c.newValue === undefined || c.secret) values.delete(c.key);
          else values.set(c.key, c.newValue);
        }
        this.state.set(r.namespace, { release: r.number, changed: msg.revision, gray: msg.gray, values });
        this.rev = msg.revision;
        await this.deliver({
          namespace: r.namespace,
          release: r.number,
          revision: msg.revision,
          values,
          changes: r.changes.map((c) => ({ key: c.key, old: c.oldValue, new: c.newValue })),
          snapshot: false,
        });
        return;
      }
      case WatchEventType.BOOKMARK:
        if (msg.revision > this.rev) this.rev = msg.revision;
        return;
    }
  }
}

function diff(a: ReadonlyMap<string, string>, b: ReadonlyMap<string, string>): KeyChange[] {
  const out: KeyChange[] = [];
  for (const [k, v] of b) if (a.get(k) !== v) out.push({ key: k, old: a.get(k), new: v });
  for (const [k, v] of a) if (!b.has(k)) out.push({ key: k, old: v, new: undefined });
  return out.sort((x, y) => (x.key < y.key ? -1 : x.key > y.key ? 1 : 0));
}
