import type { Conn } from "./conn.js";
import { CoorddError } from "./errors.js";
import type { LockGrant } from "./gen/coordd/v1/lock_pb.js";
import { Held } from "./held.js";
import type { Session } from "./session.js";

/** Options of Session.lock, tryLock, rlock and runLocked. */
export interface LockOptions {
  /**
   * How long lock() waits for the grant (the server's `wait`); it then
   * fails with DEADLINE_EXCEEDED and leaves nothing queued. Default: as
   * long as the session lives (or `signal` allows). Ignored by tryLock.
   */
  timeoutMs?: number;
  /** How many sessions may hold the lock at once (a semaphore); 1 by default. Every user of a lock must give the same (LIMIT_MISMATCH). */
  limit?: number;
  /** A shared (read) grant of a read/write lock (limit 1): read grants are held together, a write grant alone. */
  read?: boolean;
  /** A note shown by DescribeLock: who holds the lock and why (at most 1024 bytes). */
  metadata?: string;
  /** Keep the lock from the next waiter this long after this holder's session expires (not after a release). At most 60 s. */
  lockDelayMs?: number;
  /** The acquisition's idempotency key; by default the client picks one and reuses it on retries. */
  requestId?: string;
  /** Abandons the wait; the call then rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** Who may act on a fenced resource: a lock's token or an election's term. */
export type Fence = { lock: string; token: bigint } | { election: string; token: bigint };

/**
 * A held lock. Act on the protected resource only while `signal` is not
 * aborted, and pass `token` with every access so that the resource can
 * refuse a holder that lost the lock.
 *
 * Guarantees: `signal` aborts no later than the session's local deadline,
 * which falls before the server can expire the session and grant the lock
 * to anyone else (as long as the client's and the server's clocks run at
 * rates that differ by less than the session's margin). It also aborts on
 * release() and, within about one round trip, when the server reports the
 * grant gone although this Lock did not release it (an admin's release;
 * reason NOT_HOLDER), through a WatchLock stream the client keeps open
 * while the lock is held (ClientOptions.watchHoldings).
 *
 * Not guaranteed: mutual exclusion by itself. A paused process can act
 * after its signal aborted; only actions fenced by the token are safe
 * (put/delete/validate here, or a resource that checks the token).
 *
 * A release from outside (an operator, coordctl) is put to this holder
 * first: `signal` aborts (NOT_HOLDER), then the client releases the grant
 * itself, and only then is the next waiter granted. If this process is
 * frozen or cut off, the grant ends at the revocation's bound (the
 * session TTL at most) without it.
 */
export class Lock extends Held {
  /** The lock's name. */
  readonly name: string;
  /** The fencing token: strictly greater than every earlier grant's token of this lock. */
  readonly token: bigint;
  /** The acquisition's request id. */
  readonly requestId: string;
  /** A shared (read) grant: fenced writes need a write grant. */
  readonly read: boolean;
  /** The etcd revision at which the grant was observed. */
  readonly revision: bigint;

  /** @internal Made by Session.lock and tryLock. */
  constructor(
    conn: Conn,
    session: Session,
    grant: LockGrant,
    private readonly onReleased: (requestId: string) => void,
  ) {
    super(conn, session);
    this.name = grant.name;
    this.token = grant.token;
    this.requestId = grant.requestId;
    this.read = grant.read;
    this.revision = grant.revision;
    this.startWatch(
      (ep, signal) => ep.services.locks.watchLock({ name: this.name }, { signal }),
      (msg) => {
        const d = msg.lock;
        if (!d || d.revision < this.revision) return undefined; // a view older than the grant
        const mine = d.holders.find(
          (h) => h.sessionId === session.id && (h.token === this.token || (h.token === 0n && h.requestId === this.requestId)),
        );
        if (mine?.revokingSince) {
          // A release from outside asks this holder to let go: the signal
          // aborts first, then the release tells the server it did.
          const err = new CoorddError(
            "NOT_HOLDER",
            `coordd: lock "${this.name}" (token ${this.token}) is being released from elsewhere (coordctl, an admin): this client let it go`,
          );
          this.revoked(err, () => this.letGo());
          return err;
        }
        return mine
          ? undefined
          : new CoorddError(
              "NOT_HOLDER",
              `coordd: the server reports lock "${this.name}" (token ${this.token}) released: by a release from elsewhere (coordctl, an admin) or because its session was closed`,
            );
      },
    );
  }

  /** This grant, for fenced calls (Client.fencedPut). */
  get fence(): Fence {
    return { lock: this.name, token: this.token };
  }

  /**
   * Gives the lock up; `signal` aborts first (reason LOCK_RELEASED).
   * Retried while coordd is unavailable, with the grant's token, so it
   * never removes a newer holder. Rejects with NOT_HOLDER if the server no
   * longer had the grant (its session ended first). If it fails
   * otherwise, the server holds the lock for the session until the session
   * ends or a release succeeds: calling it again tries again. Calling it
   * again after it succeeded, or after the lock was lost, resolves at once
   * without a call: a lost grant goes with its session on the server.
   * `opts.signal` ends the call and its retries early (it then rejects with
   * the signal's reason, and may be called again).
   */
  async release(opts: { signal?: AbortSignal } = {}): Promise<void> {
    const tell = this.giveUp("LOCK_RELEASED", `coordd: lock "${this.name}" released`);
    if (!tell) return;
    let attempts = 0;
    try {
      await this.conn.call(
        (s, o) => {
          attempts++;
          return s.locks.release(
            { name: this.name, token: this.token, sessionId: this.session.id, requestId: this.requestId },
            o,
          );
        },
        { idempotent: true, timeoutMs: 2000, retryForMs: this.session.ttlMs, signal: opts.signal },
      );
    } catch (e) {
      // An earlier attempt (or call) released it and its answer was lost.
      if (!((attempts > 1 || tell === "again") && CoorddError.is(e, "NOT_HOLDER"))) {
        this.told(false);
        throw e;
      }
    }
    this.onReleased(this.requestId);
  }

  /** Tells the server this holder let the lock go when asked: its own release. */
  private async letGo(): Promise<void> {
    try {
      await this.conn.call(
        (s, o) => s.locks.release({ name: this.name, token: this.token, sessionId: this.session.id, requestId: this.requestId, revoked: true }, o),
        { idempotent: true, timeoutMs: 2000, retryForMs: this.session.ttlMs, signal: this.session.signal },
      );
      this.onReleased(this.requestId);
    } catch {
      // NOT_HOLDER: it ended meanwhile; otherwise the revocation's bound ends it
    }
  }

  /**
   * Writes key in coordd's fenced KV only if this grant still holds the
   * lock, checked and written in one etcd transaction; otherwise rejects
   * with STALE_TOKEN and writes nothing. Resolves to the write's revision.
   * Not retried: after UNAVAILABLE the write may or may not have happened.
   */
  put(key: string, value: Uint8Array | string): Promise<bigint> {
    return fencedPut(this.conn, this.fence, key, value);
  }

  /** Deletes key from coordd's fenced KV only if this grant still holds the lock (as put). */
  delete(key: string): Promise<bigint> {
    return fencedDelete(this.conn, this.fence, key);
  }

  /** Resolves if this grant holds the lock now, rejects with STALE_TOKEN if not (the answer may be stale by the time it is used). */
  validate(): Promise<void> {
    return validateFence(this.conn, this.fence);
  }
}

function fenceFields(f: Fence) {
  return "lock" in f ? { lock: f.lock, token: f.token } : { election: f.election, token: f.token };
}

/** FencedPut: writes only if the fence's token holds its lock (or leads its election). */
export async function fencedPut(conn: Conn, f: Fence, key: string, value: Uint8Array | string): Promise<bigint> {
  const bytes = typeof value === "string" ? new TextEncoder().encode(value) : value;
  const resp = await conn.call((s, o) => s.locks.fencedPut({ ...fenceFields(f), key, value: bytes }, o));
  return resp.revision;
}

/** FencedDelete: deletes only if the fence's token holds its lock (or leads its election). */
export async function fencedDelete(conn: Conn, f: Fence, key: string): Promise<bigint> {
  const resp = await conn.call((s, o) => s.locks.fencedDelete({ ...fenceFields(f), key }, o));
  return resp.revision;
}

/** ValidateFence: resolves if the token holds the lock (or leads the election) now, else STALE_TOKEN. */
export async function validateFence(conn: Conn, f: Fence): Promise<void> {
  const req = "lock" in f ? { name: f.lock, token: f.token } : { election: f.election, token: f.token };
  await conn.call((s, o) => s.locks.validateFence(req, o), { idempotent: true });
}

/**
 * Several locks held together by one session (Session.lockAll), sorted by
 * name. Each is a Lock with its own token and its own loss: pass each
 * lock's token to what it protects.
 */
export class LockSet {
  /** The locks, sorted by name. */
  readonly locks: readonly Lock[];

  /** @internal Made by Session.lockAll. */
  constructor(locks: Lock[]) {
    this.locks = [...locks].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }

  /** The lock of the set with this name; undefined if the set has none. */
  get(name: string): Lock | undefined {
    return this.locks.find((l) => l.name === name);
  }

  /**
   * Releases every lock of the set (each as Lock.release), all of them also
   * when one fails; then rejects with the first failure, if any.
   */
  async release(): Promise<void> {
    const results = await Promise.allSettled(this.locks.map((l) => l.release()));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === "rejected");
    if (failed) throw failed.reason;
  }
}
