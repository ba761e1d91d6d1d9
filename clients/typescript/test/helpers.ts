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

/**
 * A loopback TCP proxy to target ("host:port") whose traffic a test can
 * cut off: down() closes every connection and refuses new ones, up()
 * accepts again. close() stops it.
 */
export async function startProxy(target: string) {
  const net = await import("node:net");
  const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
  const sockets = new Set<import("node:net").Socket>();
  let down = false;
  const server = net.createServer((c) => {
    if (down) {
      c.destroy();
      return;
    }
    const u = net.connect(port, host);
    for (const s of [c, u]) {
      sockets.add(s);
      s.on("close", () => sockets.delete(s));
      s.on("error", () => {});
    }
    c.pipe(u).pipe(c);
    c.on("close", () => u.destroy());
    u.on("close", () => c.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const addr = server.address() as import("node:net").AddressInfo;
  return {
    endpoint: `127.0.0.1:${addr.port}`,
    down() {
      down = true;
      for (const s of sockets) s.destroy();
    },
    up() {
      down = false;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
