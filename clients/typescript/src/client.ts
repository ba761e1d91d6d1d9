import { ConfigCenter } from "./config.js";
import { Conn, type TLSOptions } from "./conn.js";
import {
  candidateFrom,
  leaderFrom,
  observe,
  type Candidate,
  type ElectionEvent,
  type Leader,
  type Leadership,
  type ObserveOptions,
  type RunAsLeaderOptions,
} from "./election.js";
import { CoorddError } from "./errors.js";
import type { DescribeLockResponse } from "./gen/coordd/v1/lock_pb.js";
import { historyEvents, type HistoryEvent, type HistoryQuery } from "./history.js";
import { KV } from "./kv.js";
import { fencedDelete, fencedPut, validateFence, type Fence } from "./lock.js";
import { Session, type SessionOptions } from "./session.js";
import { linkSignals, sleep } from "./util.js";

/** Options of new Client. */
export interface ClientOptions {
  /**
   * coordd's gRPC endpoints, "host:port" (plaintext HTTP/2) or a URL
   * ("https://host:port"). The client uses one at a time and moves to the
   * next when a call fails with UNAVAILABLE (or a keep-alive goes
   * unanswered).
   */
  endpoints: string[];
  /**
   * A bearer token, sent as `authorization: Bearer <token>` with every
   * call: only over TLS or to a loopback endpoint (the constructor refuses
   * a plaintext endpoint elsewhere, as the Go and Python clients do).
   */
  token?: string;
  /**
   * TLS: "host:port" endpoints are then reached over https. `ca` is the
   * CA bundle (PEM) that signed coordd's certificate (Node's trust store
   * when unset); `cert` and `key` a client certificate for mutual TLS;
   * `serverName` the name to check the certificate against.
   */
  tls?: TLSOptions;
  /** The deadline of calls that do not wait (everything but lock, campaign and streams); 10 s by default. */
  callTimeoutMs?: number;
  /**
   * Keep one server stream open per held lock (WatchLock) and leadership
   * (Observe), so that a release or resignation from outside aborts the
   * holder's signal within a round trip. On by default.
   */
  watchHoldings?: boolean;
}

/**
 * A coordd client. One serves sessions, locks, elections and the config
 * center, and is closed once, when the program is done with it: close()
 * closes its sessions, subscriptions and observations and its HTTP/2
 * connections, after which the process can exit.
 *
 * Failover: the client uses one endpoint at a time; a call that fails with
 * UNAVAILABLE moves it to the next. Calls that are safe to repeat (lock
 * and campaign with their request id, release, resign, proclaim, reads,
 * keep-alives) are retried there; writes that are not (session creation,
 * config writes, fenced puts) fail with UNAVAILABLE, their outcome unknown.
 */
export class Client {
  private readonly conn: Conn;
  /** The config center: snapshot, get, put, delete, publish, subscribe. */
  readonly config: ConfigCenter;
  /** Reads of coordd's fenced key-value store. */
  readonly kv: KV;

  constructor(opts: ClientOptions) {
    this.conn = new Conn(opts);
    this.config = new ConfigCenter(this.conn);
    this.kv = new KV(this.conn);
  }

  /** Creates a session and starts keeping it alive; see Session. Not retried. */
  session(opts: SessionOptions = {}): Promise<Session> {
    return Session.create(this.conn, opts);
  }

  /** Who leads the named election, or undefined if nobody does. */
  async leader(name: string): Promise<Leader | undefined> {
    try {
      const resp = await this.conn.call((s, o) => s.elections.leader({ name }, o), { idempotent: true });
      return resp.leader && leaderFrom(resp.leader);
    } catch (e) {
      if (CoorddError.is(e, "NO_LEADER")) return undefined;
      throw e;
    }
  }

  /** The campaigns waiting for the seat, in the order they would take it: priority, then arrival. */
  async candidates(name: string): Promise<Candidate[]> {
    const resp = await this.conn.call((s, o) => s.elections.candidates({ name }, o), { idempotent: true });
    return resp.candidates.map(candidateFrom);
  }

  /**
   * Follows the named election as an async iterator of its events; see
   * the observe function's doc for what it guarantees. Stop it by
   * breaking out of the loop, by `opts.signal`, or with client.close().
   */
  observe(name: string, opts: ObserveOptions = {}): AsyncGenerator<ElectionEvent, void, undefined> {
    return observe(this.conn, name, opts);
  }

  /**
   * A lock's holder and waiter counts (holderCount, waiterCount) and its
   * first pageSize holders and waiters (1-1000; 1000 by default), as the
   * server sees them now; for a crowd, nextPageToken continues (as
   * pageToken).
   */
  describeLock(name: string, page: { pageSize?: number; pageToken?: string } = {}): Promise<DescribeLockResponse> {
    const pageSize = page.pageSize ?? 1000;
    const pageToken = page.pageToken ?? "";
    return this.conn.call((s, o) => s.locks.describeLock({ name, pageSize, pageToken }, o), { idempotent: true });
  }

  /**
   * The grant history of the lock name (every lock's when empty), as the Go
   * SDK's Admin.LockHistory: each grant and each end of one, oldest first,
   * fetched a page at a time as the iteration goes. Not retried.
   */
  lockHistory(name = "", q: HistoryQuery = {}): AsyncGenerator<HistoryEvent, void, undefined> {
    return historyEvents(this.conn, "lock", name, q);
  }

  /** The history of the election name (every election's when empty), as lockHistory. */
  electionHistory(name = "", q: HistoryQuery = {}): AsyncGenerator<HistoryEvent, void, undefined> {
    return historyEvents(this.conn, "election", name, q);
  }

  /** FencedPut by a raw fence (for tools and tests): writes only if the token holds the lock (or leads the election), else STALE_TOKEN. */
  fencedPut(fence: Fence, key: string, value: Uint8Array | string): Promise<bigint> {
    return fencedPut(this.conn, fence, key, value);
  }

  /** FencedDelete by a raw fence. */
  fencedDelete(fence: Fence, key: string): Promise<bigint> {
    return fencedDelete(this.conn, fence, key);
  }

  /** Resolves if the fence's token holds its lock (or leads its election) now, else STALE_TOKEN. */
  validateFence(fence: Fence): Promise<void> {
    return validateFence(this.conn, fence);
  }

  /**
   * Campaigns for the named election and runs fn while this process
   * leads, healing itself as the Go SDK's RunAsLeader does: a lost
   * leadership aborts fn's signal and, once fn returns, campaigns again; a
   * session that ended is replaced; failures are retried with backoff.
   *
   * fn gets the leadership (pass its term to every write) and a signal
   * that aborts when leadership ends (at the latest at the session's local
   * deadline, before anyone else can be elected) or `opts.signal` aborts;
   * fn must return promptly then. When fn returns, the term is resigned, so
   * the next candidate leads at once. If fn resolves while still leading,
   * runAsLeader resolves with its value; if it throws, runAsLeader
   * campaigns again after a backoff. Never two fn calls at once. When
   * `opts.signal` aborts, it resigns, closes its session and rejects with
   * the signal's reason.
   */
  async runAsLeader<T>(
    name: string,
    value: string,
    fn: (lead: Leadership, signal: AbortSignal) => Promise<T>,
    opts: RunAsLeaderOptions = {},
  ): Promise<T> {
    const first = opts.backoff?.firstMs ?? 100;
    const limit = opts.backoff?.limitMs ?? 10_000;
    let backoff = first;
    const pause = async () => {
      await sleep(backoff / 2 + (Math.random() * backoff) / 2, opts.signal);
      backoff = Math.min(2 * backoff, limit);
    };
    let session: Session | undefined;
    try {
      for (;;) {
        if (opts.signal?.aborted) throw opts.signal.reason;
        if (!session || session.signal.aborted) {
          await session?.close().catch(() => {});
          session = undefined;
          try {
            session = await this.session({
              ...(opts.ttl !== undefined ? { ttl: opts.ttl } : {}),
              ...(opts.owner !== undefined ? { owner: opts.owner } : {}),
            });
          } catch (e) {
            if (CoorddError.is(e, "CLIENT_CLOSED")) throw e;
            await pause();
            continue;
          }
        }
        let lead: Leadership;
        try {
          lead = await session.campaign(name, value, opts.signal ? { signal: opts.signal } : {});
        } catch (e) {
          if (opts.signal?.aborted || CoorddError.is(e, "CLIENT_CLOSED")) throw e;
          await pause();
          continue;
        }
        opts.onElected?.(lead.term);
        const link = linkSignals(lead.signal, opts.signal);
        let result: { ok: true; value: T } | { ok: false; error: unknown };
        try {
          result = { ok: true, value: await fn(lead, link.signal) };
        } catch (e) {
          result = { ok: false, error: e };
        } finally {
          link.dispose();
        }
        const lost = lead.lost;
        await lead.resign().catch(() => {}); // a failed resign leaves the term to its session
        const cause = lost ?? (opts.signal?.aborted ? opts.signal.reason : result.ok ? undefined : result.error);
        opts.onDemoted?.(lead.term, cause);
        if (opts.signal?.aborted) throw opts.signal.reason;
        if (lost) {
          backoff = first; // campaign again at once
          continue;
        }
        if (result.ok) return result.value;
        await pause();
      }
    } finally {
      await session?.close().catch(() => {});
    }
  }

  /**
   * Closes the client: its live sessions are closed (on the server too,
   * releasing what they hold), subscriptions and observations end, calls
   * in flight fail with CLIENT_CLOSED, and the HTTP/2 connections close.
   */
  close(): Promise<void> {
    return this.conn.close();
  }
}
