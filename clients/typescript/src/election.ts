import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { Conn, Services } from "./conn.js";
import { CoorddError, type ReasonName } from "./errors.js";
import {
  ElectionEventType,
  type ElectionCandidate,
  type ElectionLeader,
  type Leadership as LeadershipMsg,
} from "./gen/coordd/v1/election_pb.js";
import { Held } from "./held.js";
import { fencedDelete, fencedPut, validateFence, type Fence } from "./lock.js";
import type { Session } from "./session.js";
import { jitter, linkSignals, randomId, sleep } from "./util.js";

/** Options of Session.campaign. */
export interface CampaignOptions {
  /** How long to wait to lead; then DEADLINE_EXCEEDED, and nothing stays queued. Default: as long as the session lives. */
  timeoutMs?: number;
  /** The campaign's idempotency key; by default the client picks one and reuses it on retries. */
  requestId?: string;
  /** Abandons the campaign; it then rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Orders the waiting candidates: the highest takes the seat first, ties in arrival order. It never unseats a leader by itself. Default 0. */
  priority?: number;
  /** Asks a leader of lower priority to step down (observers see PREEMPT_REQUESTED); the leader decides when. */
  preempt?: boolean;
}

/** Who leads an election. */
export interface Leader {
  /** The leadership's term: a fencing token. */
  term: bigint;
  value: string;
  sessionId: string;
  requestId: string;
  /** The leader's session owner (empty once the session is gone). */
  owner: string;
  hostname: string;
  since: Date | undefined;
  /** How many times the leader proclaimed. */
  proclaims: bigint;
  /** The leader's campaign priority. */
  priority: number;
}

/** A campaign waiting for the seat. */
export interface Candidate {
  value: string;
  sessionId: string;
  requestId: string;
  priority: number;
  /** The etcd revision at which it joined: among equal priorities, the earlier leads first. */
  joinedRevision: bigint;
}

export type ElectionEventTypeName = "ELECTED" | "PROCLAIMED" | "RESIGNED" | "EXPIRED" | "VACANT" | "PREEMPT_REQUESTED" | "REVOKING";

/** One change of an election. */
export interface ElectionEvent {
  type: ElectionEventTypeName;
  /** The etcd revision of the change. */
  revision: bigint;
  /** The new leader (ELECTED, PROCLAIMED), the one that left (RESIGNED, EXPIRED) or the one asked to step down (PREEMPT_REQUESTED); undefined for VACANT. */
  leader: Leader | undefined;
  /** PREEMPT_REQUESTED: the candidate that asked. */
  by: Candidate | undefined;
  /**
   * The event states the election's state (ELECTED or VACANT) rather than
   * a change: the first event of an observation, or the first after a gap
   * the server could not replay (compacted history). Events before it may
   * have been missed.
   */
  current: boolean;
}

export function leaderFrom(p: ElectionLeader): Leader {
  return {
    term: p.term,
    value: p.value,
    sessionId: p.sessionId,
    requestId: p.requestId,
    owner: p.owner,
    hostname: p.hostname,
    since: p.since ? timestampDate(p.since) : undefined,
    proclaims: p.proclaims,
    priority: p.priority,
  };
}

export function candidateFrom(c: ElectionCandidate): Candidate {
  return { value: c.value, sessionId: c.sessionId, requestId: c.requestId, priority: c.priority, joinedRevision: c.joinedRevision };
}

/**
 * A won election. Act as leader only while `signal` is not aborted, and
 * pass `term` with every access to what the leader controls.
 *
 * Guarantees: `term` is strictly greater than every earlier leader's term
 * of the election. `signal` aborts no later than the session's local
 * deadline, before the server can elect anyone else (under the clock
 * condition of Session); on resign(); when a proclaim is answered
 * NOT_LEADER; and, within about one round trip, when the server reports
 * the term over although this process did not resign it (an Observe
 * stream kept open while leading; ClientOptions.watchHoldings).
 *
 * Not guaranteed: a deposed leader that is paused can still act; fence
 * its writes by the term (put/delete/validate, or a resource that checks it).
 */
export class Leadership extends Held {
  readonly name: string;
  /** The term: this leadership's fencing token. */
  readonly term: bigint;
  readonly requestId: string;
  /** The etcd revision at which the leadership was observed. */
  readonly revision: bigint;

  /** @internal Made by Session.campaign. */
  constructor(
    conn: Conn,
    session: Session,
    l: LeadershipMsg,
    private readonly onResigned: (requestId: string) => void,
  ) {
    super(conn, session);
    this.name = l.name;
    this.term = l.term;
    this.requestId = l.requestId;
    this.revision = l.revision;
    this.startWatch(
      (ep, signal) => observeStream(ep.services, this.name, this.revision + 1n, signal),
      (msg) => {
        for (const ev of msg.events) {
          const ours = ev.leader?.term === this.term;
          if (ev.type === ElectionEventType.REVOKING && ours) {
            // A resignation from outside asks this leader to step down:
            // the signal aborts first, then the resignation tells the
            // server it did.
            const err = new CoorddError(
              "NOT_LEADER",
              `coordd: the leadership of "${this.name}" (term ${this.term}) is being resigned from elsewhere (coordctl, an admin): this client stepped down`,
            );
            this.revoked(err, () => this.letGo());
            return err;
          }
          const ended =
            ev.type === ElectionEventType.VACANT ||
            ((ev.type === ElectionEventType.RESIGNED || ev.type === ElectionEventType.EXPIRED) && ours) ||
            ((ev.type === ElectionEventType.ELECTED || ev.type === ElectionEventType.PROCLAIMED) && !ours);
          if (ended) {
            return new CoorddError(
              "NOT_LEADER",
              `coordd: the server reports the leadership of "${this.name}" (term ${this.term}) ended: resigned from elsewhere or its session was closed`,
            );
          }
        }
        return undefined;
      },
    );
  }

  /** This term, for fenced calls. */
  get fence(): Fence {
    return { election: this.name, token: this.term };
  }

  /**
   * Replaces the value the leader proclaims, retried while coordd is
   * unavailable. If the server answers that this term no longer leads, the
   * leadership is lost (signal aborts) and this rejects with NOT_LEADER.
   * The attempts carry one proclaim id, so a retry after a lost answer is
   * observed once.
   */
  async proclaim(value: string): Promise<void> {
    if (this.signal.aborted) {
      throw new CoorddError("NOT_LEADER", `coordd: the leadership of "${this.name}" is over`, {
        cause: this.signal.reason,
      });
    }
    const proclaimId = randomId();
    try {
      await this.conn.call((s, o) => s.elections.proclaim({ name: this.name, term: this.term, value, proclaimId }, o), {
        idempotent: true,
        timeoutMs: 2000,
        signal: this.session.signal,
      });
    } catch (e) {
      if (CoorddError.is(e, "NOT_LEADER")) this.lose(e);
      throw e;
    }
  }

  /**
   * Gives the leadership up; `signal` aborts first (reason RESIGNED) and
   * the next candidate leads at once. Rejects with NOT_LEADER if the
   * server no longer had this term. If it fails otherwise, calling it
   * again tries again; after it succeeded, calling it again resolves at
   * once. `opts.signal` ends the call and its retries early.
   */
  async resign(opts: { signal?: AbortSignal } = {}): Promise<void> {
    const tell = this.giveUp("RESIGNED", `coordd: the leadership of "${this.name}" was resigned`);
    if (!tell) return;
    let attempts = 0;
    try {
      await this.conn.call(
        (s, o) => {
          attempts++;
          return s.elections.resign(
            { name: this.name, term: this.term, sessionId: this.session.id, requestId: this.requestId },
            o,
          );
        },
        { idempotent: true, timeoutMs: 2000, retryForMs: this.session.ttlMs, signal: opts.signal },
      );
    } catch (e) {
      if (!((attempts > 1 || tell === "again") && CoorddError.is(e, "NOT_LEADER"))) {
        this.told(false);
        throw e;
      }
    }
    this.onResigned(this.requestId);
  }

  /** Tells the server this leader stepped down when asked: its own resignation. */
  private async letGo(): Promise<void> {
    try {
      await this.conn.call(
        (s, o) => s.elections.resign({ name: this.name, term: this.term, sessionId: this.session.id, requestId: this.requestId, revoked: true }, o),
        { idempotent: true, timeoutMs: 2000, retryForMs: this.session.ttlMs, signal: this.session.signal },
      );
      this.onResigned(this.requestId);
    } catch {
      // NOT_LEADER: it ended meanwhile; otherwise the revocation's bound ends it
    }
  }

  /**
   * Hands the leadership to a waiting campaign of session `successorSessionId`
   * (its first in line, or `opts.requestId`) in one commit and resolves with
   * the successor's term, a new fencing token; observers see RESIGNED and
   * ELECTED at one revision, never VACANT. `signal` aborts (reason
   * RESIGNED) before the request is sent, so this leader has stopped
   * before the successor leads. Rejects with CANDIDATE_NOT_FOUND (the
   * leadership is kept, under a new `signal`: read it again) or
   * NOT_LEADER (it is lost).
   */
  async transfer(successorSessionId: string, opts: { requestId?: string } = {}): Promise<bigint> {
    if (this.signal.aborted) {
      throw new CoorddError("NOT_LEADER", `coordd: the leadership of "${this.name}" is over`, { cause: this.signal.reason });
    }
    const handedOver = `coordd: the leadership of "${this.name}" was handed over`;
    this.suspend("RESIGNED", handedOver);
    try {
      const resp = await this.conn.call(
        (s, o) => s.elections.transfer({ name: this.name, term: this.term, successorSessionId, successorRequestId: opts.requestId ?? "" }, o),
        { idempotent: true, timeoutMs: 2000, signal: this.session.signal },
      );
      this.settle(true, "RESIGNED", handedOver);
      this.onResigned(this.requestId);
      return resp.term;
    } catch (e) {
      this.settle(false, "RESIGNED", handedOver);
      if (CoorddError.is(e, "NOT_LEADER")) this.lose(e);
      throw e;
    }
  }

  /** Writes key in coordd's fenced KV only if this term still leads (else STALE_TOKEN). Not retried. */
  put(key: string, value: Uint8Array | string): Promise<bigint> {
    return fencedPut(this.conn, this.fence, key, value);
  }

  /** Deletes key from coordd's fenced KV only if this term still leads. */
  delete(key: string): Promise<bigint> {
    return fencedDelete(this.conn, this.fence, key);
  }

  /** Resolves if this term leads now, rejects with STALE_TOKEN if not. */
  validate(): Promise<void> {
    return validateFence(this.conn, this.fence);
  }
}

function observeStream(s: Services, name: string, from: bigint, signal: AbortSignal) {
  return s.elections.observe({ name, fromRevision: from }, { signal });
}

const eventTypes: Record<number, ElectionEventTypeName> = {
  [ElectionEventType.ELECTED]: "ELECTED",
  [ElectionEventType.PROCLAIMED]: "PROCLAIMED",
  [ElectionEventType.RESIGNED]: "RESIGNED",
  [ElectionEventType.EXPIRED]: "EXPIRED",
  [ElectionEventType.VACANT]: "VACANT",
  [ElectionEventType.PREEMPT_REQUESTED]: "PREEMPT_REQUESTED",
  [ElectionEventType.REVOKING]: "REVOKING",
};

/** Options of Client.observe. */
export interface ObserveOptions {
  /** Resume at this revision (the last one seen + 1) instead of starting with the current state. */
  fromRevision?: bigint;
  /** Ends the observation: the iterator then finishes. */
  signal?: AbortSignal;
}

/**
 * Follows an election: the first event states who leads now (or VACANT);
 * then every change arrives in order, each proclamation included. When the
 * stream breaks, it reconnects (on the next endpoint after UNAVAILABLE) and
 * resumes after the last revision it delivered, so nothing is skipped or
 * repeated; on COMPACTED it starts again from the current state (an event
 * marked `current`). Events wait for the reader. It ends when the reader
 * stops iterating, `signal` aborts or the client closes; it throws only
 * for errors retrying cannot fix (INVALID_ARGUMENT, PERMISSION_DENIED,
 * UNAUTHENTICATED, UNIMPLEMENTED).
 */
export async function* observe(conn: Conn, name: string, opts: ObserveOptions = {}): AsyncGenerator<ElectionEvent, void, undefined> {
  const done = new AbortController(); // the reader stopped iterating
  const link = linkSignals(conn.closed, opts.signal, done.signal);
  const signal = link.signal;
  let from = opts.fromRevision ?? 0n;
  let backoff = 50;
  try {
    while (!signal.aborted) {
      const ep = conn.pick();
      try {
        for await (const msg of observeStream(ep.services, name, from, signal)) {
          for (const ev of msg.events) {
            yield {
              type: eventTypes[ev.type] ?? "VACANT",
              revision: ev.revision,
              leader: ev.leader ? leaderFrom(ev.leader) : undefined,
              by: ev.by ? candidateFrom(ev.by) : undefined,
              current: ev.current,
            };
          }
          from = msg.revision + 1n;
          backoff = 50;
        }
      } catch (e) {
        if (signal.aborted) return;
        const err = conn.convert(e) as CoorddError;
        const permanent: ReasonName[] = ["INVALID_ARGUMENT", "PERMISSION_DENIED", "UNAUTHENTICATED", "UNIMPLEMENTED"];
        if (permanent.includes(err.reason)) throw err;
        if (err.reason === "COMPACTED") from = 0n; // read the current state again
        conn.noteFailure(ep, err);
      }
      try {
        await sleep(jitter(backoff), signal);
      } catch {
        return;
      }
      backoff = Math.min(2 * backoff, 2000);
    }
  } finally {
    done.abort(); // ends a stream still open
    link.dispose();
  }
}

/** Options of Client.runAsLeader. */
export interface RunAsLeaderOptions {
  /** The TTL (seconds) and owner of the sessions it creates. */
  ttl?: number;
  owner?: string;
  /** Stops: the callback's signal aborts, the term is resigned, the session closed, and runAsLeader rejects with this signal's reason. */
  signal?: AbortSignal;
  /** Called when a term begins, before fn. */
  onElected?: (term: bigint) => void;
  /** Called when a term ends, after fn returned and the term was resigned; cause is why (undefined when fn finished while leading). */
  onDemoted?: (term: bigint, cause: unknown) => void;
  /** Wait before campaigning again after a failure: from firstMs, doubling up to limitMs (defaults 100 ms and 10 s). */
  backoff?: { firstMs: number; limitMs: number };
}
