/**
 * @coordd/client: the TypeScript (Node) client of coordd. It speaks
 * coordd's gRPC API (unary and server-streaming calls) over HTTP/2.
 *
 *   const client = new Client({ endpoints: ["127.0.0.1:7420"] });
 *   const session = await client.session({ ttl: 10 });
 *   await session.runLocked("reports/daily", async (lock) => {
 *     await lock.put("reports/daily/last-run", "2026-12-04"); // fenced by lock.token
 *   });
 *   await client.close();
 */
export { Client, type ClientOptions } from "./client.js";
export { type TLSOptions } from "./conn.js";
export { Session, type SessionOptions } from "./session.js";
export { Lock, LockSet, type LockOptions, type Fence } from "./lock.js";
export {
  Leadership,
  type CampaignOptions,
  type Candidate,
  type Leader,
  type ElectionEvent,
  type ElectionEventTypeName,
  type ObserveOptions,
  type RunAsLeaderOptions,
} from "./election.js";
export {
  ConfigCenter,
  Subscription,
  type ConfigMutation,
  type ConfigRelease,
  type ConfigUpdate,
  type KeyChange,
  type NamespaceSnapshot,
  type PublishOptions,
  type SubscribeOptions,
} from "./config.js";
export { KV, type KeyValue } from "./kv.js";
export { type HistoryEvent, type HistoryQuery } from "./history.js";
export { Barrier, type BarrierOptions } from "./barrier.js";
export { CoorddError, Reason, type ReasonName, type ServerReason, type LocalReason, type Problem } from "./errors.js";
export { Code } from "@connectrpc/connect";
