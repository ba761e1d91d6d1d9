import type { Conn } from "./conn.js";
import type { Session } from "./session.js";
import { durationOf, linkSignals, now, serverWait } from "./util.js";

/** Options of Session.enterBarrier. */
export interface BarrierOptions {
  /** Names the session's participant ("default" when unset): a session may be several participants of one barrier. */
  participant?: string;
  /** How long to wait for the barrier to open; then DEADLINE_EXCEEDED, and the participant is taken out again. Default: as long as the session lives. */
  timeoutMs?: number;
  /** Abandons the wait; the call then rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** A session's participant in an open barrier (Session.enterBarrier). */
export class Barrier {
  /** @internal Made by Session.enterBarrier. */
  constructor(
    private readonly conn: Conn,
    private readonly session: Session,
    /** The barrier's name. */
    readonly name: string,
    /** The session's participant. */
    readonly participant: string,
    /** How many were in when it was seen open. */
    readonly participants: number,
    /** The etcd revision at which it was seen open. */
    readonly revision: bigint,
  ) {}

  /**
   * Takes the participant out of the barrier and waits until every
   * participant has left (a double barrier's exit), up to `timeoutMs`; the
   * participant is out even when the wait ends first. The last one out
   * closes the barrier for the next round. Retried on UNAVAILABLE.
   */
  async leave(opts: { timeoutMs?: number } = {}): Promise<void> {
    const req = { name: this.name, sessionId: this.session.id, participant: this.participant };
    await this.conn.call(
      (s, o) =>
        opts.timeoutMs === undefined
          ? s.barriers.leaveBarrier(req, { signal: o.signal })
          : s.barriers.leaveBarrier({ ...req, wait: durationOf(opts.timeoutMs) }, { signal: o.signal, timeoutMs: opts.timeoutMs + 5000 }),
      { idempotent: true, timeoutMs: null, retryForMs: Infinity },
    );
  }
}

/** @internal Session.enterBarrier's call. */
export async function enterBarrier(conn: Conn, session: Session, sessionSignal: AbortSignal, name: string, count: number, opts: BarrierOptions): Promise<Barrier> {
  const link = linkSignals(sessionSignal, opts.signal);
  const start = now();
  const participant = opts.participant ?? "";
  const req = { name, sessionId: session.id, count, participant };
  try {
    const resp = await conn.call(
      (s, o) => {
        // The server's wait ends first, so it answers DEADLINE_EXCEEDED with the participant out.
        const { wait, opts: co } = serverWait(opts.timeoutMs, start, o.signal, `barrier "${name}" not open`);
        return s.barriers.enterBarrier({ ...req, wait }, co);
      },
      { idempotent: true, signal: link.signal, timeoutMs: null, retryForMs: Infinity },
    );
    return new Barrier(conn, session, name, participant, resp.participants, resp.revision);
  } finally {
    link.dispose();
  }
}
