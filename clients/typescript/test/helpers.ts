import { after, before } from "node:test";
import { randomBytes } from "node:crypto";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { Client } from "../src/index.js";
import { ElectionService } from "../src/gen/coordd/v1/election_pb.js";
import { LockService } from "../src/gen/coordd/v1/lock_pb.js";
import { SessionService } from "../src/gen/coordd/v1/session_pb.js";
import { startDaemon, type Daemon } from "./daemon.js";

export { waitFor } from "./daemon.js";

/** A name unique to this run, so tests never share locks, elections or namespaces. */
export const unique = (prefix: string): string => `ts-test/${prefix}/${randomBytes(4).toString("hex")}`;

/**
 * Starts (or finds, with COORDD_ENDPOINT) the daemon before the file's
 * tests and gives them a client; closes both after.
 */
export function useDaemon(): { client: () => Client; endpoint: () => string; daemon: () => Daemon } {
  let daemon: Daemon | undefined;
  let client: Client | undefined;
  before(async () => {
    daemon = await startDaemon();
    client = new Client({ endpoints: [daemon.endpoint] });
  });
  after(async () => {
    await client?.close();
    await daemon?.stop();
  });
  return { client: () => client!, endpoint: () => daemon!.endpoint, daemon: () => daemon! };
}

/**
 * Raw gRPC clients, for acting "from outside" as an admin or coordctl
 * would (releasing someone else's lock by its token). Call close() after.
 */
export function rawClients(endpoint: string) {
  const manager = new Http2SessionManager(`http://${endpoint}`);
  const transport = createGrpcTransport({ baseUrl: `http://${endpoint}`, sessionManager: manager });
  return {
    sessions: createClient(SessionService, transport),
    locks: createClient(LockService, transport),
    elections: createClient(ElectionService, transport),
    close: () => manager.abort(),
  };
}

/** Resolves with performance.now() when signal aborts. */
export function abortedAt(signal: AbortSignal): Promise<number> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve(performance.now());
    else signal.addEventListener("abort", () => resolve(performance.now()), { once: true });
  });
}

/** Rejects if p does not settle within ms. */
export async function within<T>(ms: number, what: string, p: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, rej) => {
        timer = setTimeout(() => rej(new Error(`${what}: not within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
