import type { Conn } from "./conn.js";
import { CoorddError } from "./errors.js";
import type { KeyValue as KeyValueMsg } from "./gen/coordd/v1/kv_pb.js";

/** One key of coordd's fenced KV, as the last fenced write left it. */
export interface KeyValue {
  key: string;
  value: Uint8Array;
  createRevision: bigint;
  modRevision: bigint;
  version: bigint;
}

function kvFrom(p: KeyValueMsg): KeyValue {
  return { key: p.key, value: p.value, createRevision: p.createRevision, modRevision: p.modRevision, version: p.version };
}

/**
 * Reads coordd's fenced key-value store: the keys written by fenced puts
 * (Lock.put, Leadership.put). Reads are linearizable and retried on the
 * next endpoint. Not guaranteed: that a value read is still current when
 * the reader acts on it; fence your own action.
 */
export class KV {
  /** @internal Use Client.kv. */
  constructor(private readonly conn: Conn) {}

  /** Reads one key (now, or at a past revision); undefined if it does not exist. */
  async get(key: string, revision = 0n): Promise<KeyValue | undefined> {
    try {
      const resp = await this.conn.call((s, o) => s.kv.getKV({ key, revision }, o), { idempotent: true });
      return resp.kv && kvFrom(resp.kv);
    } catch (e) {
      if (CoorddError.is(e, "KEY_NOT_FOUND")) return undefined;
      throw e;
    }
  }

  /** Lists the keys under prefix in key order, every page read from one snapshot. */
  async list(prefix: string): Promise<{ kvs: KeyValue[]; revision: bigint }> {
    const kvs: KeyValue[] = [];
    let pageToken = "";
    let revision = 0n;
    do {
      const resp = await this.conn.call((s, o) => s.kv.listKV({ prefix, pageToken, revision, pageSize: 1000 }, o), {
        idempotent: true,
      });
      kvs.push(...resp.kvs.map(kvFrom));
      revision = resp.revision;
      pageToken = resp.nextPageToken;
    } while (pageToken !== "");
    return { kvs, revision };
  }
}
