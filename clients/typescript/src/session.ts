import { hostname as osHostname } from "node:os";
import { basename } from "node:path";
import { enterBarrier, type Barrier, type BarrierOptions } from "./barrier.js";
import type { Conn } from "./conn.js";
import { Leadership, type CampaignOptions } from "./election.js";
import { CoorddError } from "./errors.js";
import type { LockGrant } from "./gen/coordd/v1/lock_pb.js";
import { Lock, LockSet, type LockOptions } from "./lock.js";
import { durationOf, jitter, linkSignals, msOf, now, randomId, serverWait } from "./util.js";

/** Options of Client.session. */
export interface SessionOptions {
  /**
   * Time to live in seconds: 2 to 3600, rounded up to a whole second by
   * the server (10 by default). A shorter TTL frees a crashed holder's
   * locks sooner; a longer one rides out longer pauses.
   */
  ttl?: number;
  /** Who created the session, shown wherever it is described (default: the program's name). */
  owner?: string;
  /** The client's host name (default: os.hostname()). */
  hostname?: string;
  /** Free-form labels: at most 32 pairs. */
  labels?: Record<string, string>;
}

/**
 * A coordd session kept alive in the background: the liveness unit every
 * lock and leadership hangs off. Close it (or its Client) when done: its
 * timers keep the process running while it lives.
 *
 * Keep-alive: a unary KeepAlive every TTL/3 (TTL/6 under 6 s), ±10%
 * jitter. Each waits for its answer at most until the next is due (at
 * least 1 s) or the local deadline; an unanswered or UNAVAILABLE
 * keep-alive moves the client to its next endpoint and is retried within
 * 50-250 ms.
 *
 * Guarantees: the LOCAL DEADLINE is the start of the last acknowledged
 * keep-alive request + its granted TTL - margin, margin = max(250 ms,
 * TTL/10), on the monotonic clock. The server cannot end the session
 * before that request's start + TTL, so the local deadline falls first
 * as long as the two clocks' rates differ by less than the margin over
 * one TTL. When it passes without an acknowledgement, the session is lost
 * locally: `signal` aborts (reason SESSION_EXPIRED), every lock and
 * leadership under it is reported lost, onLost callbacks run, and the
 * client asks the server in the background to close it. It is also lost
 * at once when the server answers that it no longer has it
 * (SESSION_NOT_FOUND).
 *
 * Not guaranteed: that the server ends the session at the local deadline:
 * it may keep it (and hand what it holds to nobody) for up to the rest of
 * its TTL, or longer while no member can be reached.
 */
export class Session {
  /** The session id: 16 hexadecimal digits. */
  readonly id: string;
  /** The TTL the server granted, in milliseconds. */
  readonly ttlMs: number;
  /** How long before the server's earliest expiry the local deadline falls: max(250 ms, TTL/10). */
  readonly marginMs: number;
  private readonly ac = new AbortController();
  private deadlineAt: number; // monotonic ms
  private renewTimer: NodeJS.Timeout | undefined;
  private watchdog: NodeJS.Timeout | undefined;
  private renewing = true;
  private crashed = false; // stopRenewalsForTesting: no close on the server at expiry either
  private retryMs = 50;
  private err: CoorddError | undefined;
  private readonly lostFns = new Set<(err: CoorddError) => void>();
  /** Request ids of released locks (per name and mode) and resigned campaigns, used again for the next one, as the Go SDK does. */
  private readonly freeIds = new Map<string, string>();

  private constructor(
    private readonly conn: Conn,
    id: string,
    ttlMs: number,
    sent: number,
  ) {
    this.id = id;
    this.ttlMs = ttlMs;
    this.marginMs = Math.max(250, ttlMs / 10);
    this.deadlineAt = sent + ttlMs - this.marginMs;
  }

  /** @internal Use Client.session. Creating a session is not retried: a failure may leave one on the server, which then expires after its TTL. */
  static async create(conn: Conn, opts: SessionOptions): Promise<Session> {
    const sent = now();
    const resp = await conn.call((s, o) =>
      s.sessions.createSession(
        {
          ttl: durationOf((opts.ttl ?? 10) * 1000),
          owner: opts.owner ?? basename(process.argv[1] ?? "node"),
          hostname: opts.hostname ?? osHostname(),
          labels: opts.labels ?? {},
        },
        o,
      ),
    );
    const info = resp.session!;
    const s = new Session(conn, info.id, msOf(info.ttl), sent);
    if (s.deadlineAt <= now()) {
      // The answer came too late: the server may end it before a keep-alive reaches it.
      await s.close().catch(() => {});
      throw new CoorddError("SESSION_EXPIRED", "coordd: creating the session took longer than its TTL minus the margin");
    }
    if (conn.closed.aborted) {
      await s.close().catch(() => {});
      throw new CoorddError("CLIENT_CLOSED", "coordd: the client is closed");
    }
    conn.open.add(s);
    s.armWatchdog();
    s.scheduleRenewal(jitter(s.intervalMs()));
    return s;
  }

  /** Aborted when the session ends: closed, reported gone by the server, or past its local deadline. `signal.reason` (and `error`) says why. */
  get signal(): AbortSignal {
    return this.ac.signal;
  }

  /** Why the session ended: SESSION_CLOSED, SESSION_EXPIRED or SESSION_NOT_FOUND; undefined while it lives. */
  get error(): CoorddError | undefined {
    return this.err;
  }

  /** The local deadline as a wall-clock Date (an estimate: the deadline itself runs on the monotonic clock). */
  get deadline(): Date {
    return new Date(Date.now() + (this.deadlineAt - now()));
  }

  /** Milliseconds until the local deadline (negative once passed). */
  get remainingMs(): number {
    return this.deadlineAt - now();
  }

  /**
   * Calls fn once, when the session is lost (SESSION_EXPIRED or
   * SESSION_NOT_FOUND), not when it is closed; at once if it already was.
   * Returns a function that unregisters fn.
   */
  onLost(fn: (err: CoorddError) => void): () => void {
    if (this.err) {
      if (this.err.reason !== "SESSION_CLOSED") fn(this.err);
      return () => {};
    }
    this.lostFns.add(fn);
    return () => this.lostFns.delete(fn);
  }

  /**
   * Stops the keep-alives without telling anyone, as a crashed or paused
   * process would: for tests and fault drills. The session is then lost
   * locally at its local deadline, and the server ends it on its own when
   * its TTL runs out (the client does not close it there; close() still
   * does).
   */
  stopRenewalsForTesting(): void {
    this.renewing = false;
    this.crashed = true;
    clearTimeout(this.renewTimer);
  }

  /**
   * Ends the session: `signal` aborts (SESSION_CLOSED), the keep-alives
   * stop, and the server closes it, releasing everything it holds.
   * Closing a session that already ended still asks the server to drop it.
   */
  async close(): Promise<void> {
    this.end(new CoorddError("SESSION_CLOSED", "coordd: session closed"));
    await this.closeOnServer(2000);
  }

  private async closeOnServer(timeoutMs: number): Promise<void> {
    try {
      // By its owner: every holding's signal aborted with the session's.
      await this.conn.call((s, o) => s.sessions.closeSession({ sessionId: this.id, byOwner: true }, o), {
        idempotent: true,
        timeoutMs,
        retryForMs: timeoutMs,
      });
    } catch (e) {
      if (!CoorddError.is(e, "SESSION_NOT_FOUND") && !CoorddError.is(e, "CLIENT_CLOSED")) throw e;
    }
  }

  /** Records why the session ended (the first reason wins) and stops everything. */
  private end(err: CoorddError): void {
    if (this.err) return;
    this.err = err;
    this.renewing = false;
    clearTimeout(this.renewTimer);
    clearTimeout(this.watchdog);
    this.conn.open.delete(this);
    this.ac.abort(err);
    if (err.reason === "SESSION_CLOSED") return;
    for (const fn of this.lostFns) {
      try {
        fn(err);
      } catch {
        // a callback's failure is its own
      }
    }
    this.lostFns.clear();
    if (err.reason === "SESSION_EXPIRED" && !this.crashed) {
      // The server may still have it, and hand its locks to nobody until it ends.
      void this.closeOnServer(5000).catch(() => {});
    }
  }

  /** The pause between keep-alives before jitter: TTL/3, or TTL/6 under 6 s. */
  private intervalMs(): number {
    return this.ttlMs < 6000 ? this.ttlMs / 6 : this.ttlMs / 3;
  }

  private armWatchdog(): void {
    clearTimeout(this.watchdog);
    this.watchdog = setTimeout(() => {
      if (this.err) return;
      if (now() >= this.deadlineAt) {
        this.end(new CoorddError("SESSION_EXPIRED", "coordd: session expired: no keep-alive acknowledged before the local deadline"));
      } else {
        this.armWatchdog(); // a keep-alive moved the deadline meanwhile
      }
    }, Math.max(0, Math.ceil(this.deadlineAt - now())));
  }

  private scheduleRenewal(delayMs: number): void {
    if (!this.renewing) return;
    clearTimeout(this.renewTimer);
    this.renewTimer = setTimeout(() => void this.renew(), Math.max(0, delayMs));
  }

  private async renew(): Promise<void> {
    if (!this.renewing) return;
    const sent = now();
    const next = jitter(this.intervalMs());
    // Wait for the answer until the next keep-alive is due (at least 1 s), but not past the deadline.
    const wait = Math.min(Math.max(next, 1000), this.deadlineAt - sent);
    try {
      const resp = await this.conn.call((s, o) => s.sessions.keepAlive({ sessionId: this.id }, o), {
        timeoutMs: Math.max(1, wait),
        signal: this.ac.signal,
        failoverOnTimeout: true,
      });
      if (!this.renewing) return;
      const d = sent + msOf(resp.ttl) - this.marginMs;
      if (d > this.deadlineAt) this.deadlineAt = d;
      this.retryMs = 50;
      this.scheduleRenewal(sent + next - now());
    } catch (e) {
      if (!this.renewing) return;
      if (CoorddError.is(e, "SESSION_NOT_FOUND")) {
        this.end(new CoorddError("SESSION_NOT_FOUND", "coordd: session not found: the server no longer has it", { cause: e }));
        return;
      }
      // Keep-alives are cheap and the deadline is near: retry soon, backing off to 250 ms.
      this.scheduleRenewal(Math.min(this.retryMs, Math.max(0, this.deadlineAt - now())));
      this.retryMs = Math.min(2 * this.retryMs, 250);
    }
  }

  private takeId(key: string): string {
    const id = this.freeIds.get(key);
    if (id === undefined) return randomId();
    this.freeIds.delete(key);
    return id;
  }

  private giveBackId(key: string, id: string): void {
    if (this.freeIds.size < 1024) this.freeIds.set(key, id);
  }

  /**
   * Acquires the named lock for this session, waiting in FIFO order. It
   * rejects with DEADLINE_EXCEEDED when `timeoutMs` passes, with the
   * session's error when the session ends first, with LIMIT_MISMATCH when
   * the lock has another limit, and with the signal's reason when
   * `opts.signal` aborts. Retried on UNAVAILABLE with the same request id,
   * so a retry never takes the lock twice.
   */
  lock(name: string, opts: LockOptions = {}): Promise<Lock> {
    return this.acquire(name, true, opts);
  }

  /** Takes the named lock only if it is free now; otherwise rejects with LOCK_HELD (nothing stays queued). */
  tryLock(name: string, opts: Omit<LockOptions, "timeoutMs"> = {}): Promise<Lock> {
    return this.acquire(name, false, opts);
  }

  /** Acquires a shared (read) grant of a read/write lock: lock() with `read: true`. */
  rlock(name: string, opts: LockOptions = {}): Promise<Lock> {
    return this.acquire(name, true, { ...opts, read: true });
  }

  /**
   * Runs fn while holding the named lock and releases it after, also when
   * fn throws. fn gets the lock: its `signal` aborts when the guarantee
   * ends (release, lost session, outside release): fn must stop then, and
   * pass `lock.token` to every access of the protected resource. Resolves
   * to fn's result; rejects with fn's error, or with the release's error
   * when fn succeeded and the session still lives.
   */
  async runLocked<T>(name: string, fn: (lock: Lock) => Promise<T> | T, opts: LockOptions = {}): Promise<T> {
    const lock = await this.lock(name, opts);
    let result: T;
    try {
      result = await fn(lock);
    } catch (e) {
      await lock.release().catch(() => {});
      throw e;
    }
    try {
      await lock.release();
    } catch (e) {
      if (!this.err) throw e; // once the session ended, the lock went with it
    }
    return result;
  }

  /** runLocked with a shared (read) grant. */
  runReadLocked<T>(name: string, fn: (lock: Lock) => Promise<T> | T, opts: LockOptions = {}): Promise<T> {
    return this.runLocked(name, fn, { ...opts, read: true });
  }

  /**
   * Acquires every named lock for this session, all or none, with one
   * request (Go's LockAll, Python's lock_all), and resolves to the set once
   * it holds them all: one grant, one fencing token, per lock. The server
   * queues for them one at a time in the order of their names, so lockAll
   * calls for overlapping sets never deadlock each other, and each lock's
   * queue stays first come, first served. Each lock is a mutex taken for
   * writing (`limit`, `read` and `lockDelayMs` are refused). Rejects as lock
   * does, leaving none of them held or queued; retried on UNAVAILABLE with
   * the same request id. Not guaranteed: that the locks are taken at one
   * instant.
   */
  async lockAll(names: string[], opts: LockOptions = {}): Promise<LockSet> {
    if ((opts.limit ?? 1) !== 1 || opts.read || opts.lockDelayMs) {
      throw new CoorddError("INVALID_ARGUMENT", "coordd: the locks of a set are mutexes taken for writing (no limit, read or lockDelayMs)");
    }
    const link = linkSignals(this.ac.signal, opts.signal);
    const start = now();
    const req = { names, sessionId: this.id, requestId: opts.requestId ?? randomId(), metadata: opts.metadata ?? "" };
    try {
      const resp = await this.conn.call<{ grants: LockGrant[] }>(
        (s, o) => {
          const { wait, opts: co } = serverWait(opts.timeoutMs, start, o.signal, `locks ${JSON.stringify(names)} not granted`);
          return s.locks.acquireAll({ ...req, wait }, co);
        },
        { idempotent: true, signal: link.signal, timeoutMs: null, retryForMs: Infinity },
      );
      const set = new LockSet(resp.grants.map((g) => new Lock(this.conn, this, g, () => {})));
      if (this.err) {
        await set.release().catch(() => {});
        throw this.err;
      }
      return set;
    } finally {
      link.dispose();
    }
  }

  /**
   * Enters the named barrier as one of this session's participants and
   * resolves once it is open: `count` participants in it at one etcd
   * revision, or opened by an operator (Go's EnterBarrier, Python's
   * enter_barrier). Barrier.leave is a double barrier's exit. Rejects with
   * DEADLINE_EXCEEDED after `timeoutMs` (the participant is taken out
   * again), with the session's error when it ends first. Retried on
   * UNAVAILABLE (the same participant).
   */
  async enterBarrier(name: string, count: number, opts: BarrierOptions = {}): Promise<Barrier> {
    if (this.err) throw this.err;
    try {
      return await enterBarrier(this.conn, this, this.ac.signal, name, count, opts);
    } catch (e) {
      throw this.err ?? e;
    }
  }

  private async acquire(name: string, wait: boolean, opts: LockOptions): Promise<Lock> {
    const key = `lock\0${opts.read ? "r" : "w"}\0${name}`;
    const own = opts.requestId === undefined;
    const requestId = opts.requestId ?? this.takeId(key);
    const link = linkSignals(this.ac.signal, opts.signal);
    const start = now();
    const common = {
      name,
      sessionId: this.id,
      limit: opts.limit ?? 0,
      requestId,
      metadata: opts.metadata ?? "",
      read: opts.read ?? false,
      ...(opts.lockDelayMs ? { lockDelay: durationOf(opts.lockDelayMs) } : {}),
    };
    try {
      const resp = await this.conn.call<{ grant?: LockGrant }>(
        (s, o) => {
          if (!wait) return s.locks.tryAcquire(common, o);
          const bound = serverWait(opts.timeoutMs, start, o.signal, `lock "${name}" not granted`);
          return s.locks.acquire({ ...common, wait: bound.wait }, bound.opts);
        },
        { idempotent: true, signal: link.signal, timeoutMs: wait ? null : undefined, retryForMs: wait ? Infinity : undefined },
      );
      const lock = new Lock(this.conn, this, resp.grant!, (id) => {
        if (own) this.giveBackId(key, id);
      });
      if (this.err) {
        // The session ended while the grant was on its way: hand it back, briefly.
        await lock.release().catch(() => {});
        throw this.err;
      }
      return lock;
    } finally {
      link.dispose();
    }
  }

  /**
   * Runs for leader of the named election with value (an address, an id)
   * and resolves once this session leads. Rejects with DEADLINE_EXCEEDED
   * after `timeoutMs`, with the session's error when it ends first, with
   * ALREADY_LEADER when this session leads the election under another
   * request id. Retried on UNAVAILABLE with the same request id.
   */
  async campaign(name: string, value: string, opts: CampaignOptions = {}): Promise<Leadership> {
    const key = `election\0${name}`;
    const own = opts.requestId === undefined;
    const requestId = opts.requestId ?? this.takeId(key);
    const link = linkSignals(this.ac.signal, opts.signal);
    const start = now();
    const req = { name, sessionId: this.id, value, requestId, priority: opts.priority ?? 0, preempt: opts.preempt ?? false };
    try {
      const resp = await this.conn.call(
        (s, o) => {
          const { wait, opts: co } = serverWait(opts.timeoutMs, start, o.signal, `not elected in "${name}"`);
          return s.elections.campaign({ ...req, wait }, co);
        },
        { idempotent: true, signal: link.signal, timeoutMs: null, retryForMs: Infinity },
      );
      const lead = new Leadership(this.conn, this, resp.leadership!, (id) => {
        if (own) this.giveBackId(key, id);
      });
      if (this.err) {
        await lead.resign().catch(() => {});
        throw this.err;
      }
      return lead;
    } finally {
      link.dispose();
    }
  }
}
