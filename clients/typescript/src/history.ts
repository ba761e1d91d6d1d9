import type { Conn } from "./conn.js";
import { HistoryEventType, type HistoryEvent as HistoryEventMessage } from "./gen/coordd/v1/history_pb.js";
import { msOf } from "./util.js";

/** Filters of Client.lockHistory and electionHistory. */
export interface HistoryQuery {
  /** Only events of sessions of this owner. */
  owner?: string;
  /** Only events at or after this time, and before `until`. */
  since?: Date;
  until?: Date;
  /** Events per page fetched (the server's default when unset). */
  pageSize?: number;
  /** Newest first (oldest first by default). */
  newestFirst?: boolean;
  /**
   * First wait until the server has recorded every event up to this etcd
   * revision (a grant's `revision`); events are recorded within about
   * 250 ms of their commit.
   */
  minRevision?: bigint;
}

/**
 * One entry of the grant history: `type` is GRANTED, RELEASED, EXPIRED or
 * SESSION_CLOSED for locks, ELECTED, RESIGNED or REMOVED for elections,
 * GAP where events from `fromRevision` to `revision` could not be recorded.
 */
export interface HistoryEvent {
  type: string;
  name: string;
  token: bigint;
  sessionId: string;
  owner: string;
  principal: string;
  hostname: string;
  requestId: string;
  read: boolean;
  reason: string;
  revision: bigint;
  fromRevision: bigint;
  time: Date | undefined;
  /** The token this grant was handed over from (a transfer), or 0. */
  handedFrom: bigint;
  /** How long the grant waited, and (on an end) was held, in milliseconds. */
  waitedMs: number;
  heldMs: number;
}

function eventOf(e: HistoryEventMessage): HistoryEvent {
  return {
    type: HistoryEventType[e.type] ?? String(e.type),
    name: e.name,
    token: e.token,
    sessionId: e.sessionId,
    owner: e.owner,
    principal: e.principal,
    hostname: e.hostname,
    requestId: e.requestId,
    read: e.read,
    reason: e.reason,
    revision: e.revision,
    fromRevision: e.fromRevision,
    time: e.time ? new Date(Number(e.time.seconds) * 1000 + Math.floor(e.time.nanos / 1e6)) : undefined,
    handedFrom: e.handedFrom,
    waitedMs: e.waited ? msOf(e.waited) : 0,
    heldMs: e.held ? msOf(e.held) : 0,
  };
}

function stampOf(d: Date | undefined) {
  if (d === undefined) return undefined;
  const ms = d.getTime();
  return { seconds: BigInt(Math.floor(ms / 1000)), nanos: (ms % 1000) * 1e6 };
}

/** @internal Pages through ListLockHistory or ListElectionHistory, a page per call. */
export async function* historyEvents(conn: Conn, kind: "lock" | "election", name: string, q: HistoryQuery): AsyncGenerator<HistoryEvent, void, undefined> {
  let pageToken = "";
  for (;;) {
    const req = {
      name,
      owner: q.owner ?? "",
      since: stampOf(q.since),
      until: stampOf(q.until),
      pageSize: q.pageSize ?? 0,
      pageToken,
      newestFirst: q.newestFirst ?? false,
      minRevision: q.minRevision ?? 0n,
    };
    const resp = await conn.call<{ events: HistoryEventMessage[]; nextPageToken: string }>((s, o) =>
      kind === "lock" ? s.history.listLockHistory(req, o) : s.history.listElectionHistory(req, o),
    );
    for (const e of resp.events) yield eventOf(e);
    pageToken = resp.nextPageToken;
    if (!pageToken) return;
  }
}
