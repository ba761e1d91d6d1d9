// Test support: the coordd the tests run against. With COORDD_ENDPOINT set
// (host:port of a daemon's gRPC listener) the tests use that daemon;
// otherwise each test file starts its own, /tmp/coordd-bin/coordd (or
// $COORDD_BIN), in a temporary data dir on free loopback ports, waits for
// /readyz, and stops it when done.
import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

export interface Daemon {
  endpoint: string;
  /** Stops the daemon and starts it again on the same ports and data; undefined for a daemon given by COORDD_ENDPOINT. */
  restart: (() => Promise<void>) | undefined;
  stop(): Promise<void>;
}

/** A free loopback TCP port (the kernel's pick, released at once). */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === "object" && addr ? resolve(addr.port) : reject(new Error("no port"))));
    });
  });
}

/** Polls until check() is true, failing after timeoutMs. */
export async function waitFor(what: string, check: () => boolean | Promise<boolean>, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export async function startDaemon(): Promise<Daemon> {
  const given = process.env.COORDD_ENDPOINT;
  if (given) return { endpoint: given, restart: undefined, stop: async () => {} };

  const bin = process.env.COORDD_BIN ?? "/tmp/coordd-bin/coordd";
  const dir = mkdtempSync(join(tmpdir(), "coordd-ts-"));
  const [grpc, http, peer] = [await freePort(), await freePort(), await freePort()];
  const args = [
    `--grpc-addr=127.0.0.1:${grpc}`,
    `--http-addr=127.0.0.1:${http}`,
    `--listen-peer-urls=http://127.0.0.1:${peer}`,
    `--data-dir=${join(dir, "data")}`,
    "--log-level=warn",
  ];
  const logPath = join(dir, "coordd.log");
  let child: ChildProcess | undefined;
  let exit: Promise<void> = Promise.resolve();
  let exited = true;

  const launch = async () => {
    const log = openSync(logPath, "a");
    child = spawn(bin, args, { stdio: ["ignore", log, log] });
    closeSync(log);
    exited = false;
    exit = new Promise<void>((resolve) => child!.once("exit", () => ((exited = true), resolve())));
    await waitFor(
      "coordd's /readyz",
      async () => {
        if (exited) throw new Error(`coordd exited early:\n${readFileSync(logPath, "utf8")}`);
        try {
          return (await fetch(`http://127.0.0.1:${http}/readyz`, { signal: AbortSignal.timeout(1000) })).ok;
        } catch {
          return false;
        }
      },
      20_000,
    );
  };
  const halt = async () => {
    if (exited) return;
    child!.kill("SIGTERM");
    const t = setTimeout(() => child!.kill("SIGKILL"), 5000);
    await exit;
    clearTimeout(t);
  };
  const stop = async () => {
    await halt();
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await launch();
  } catch (e) {
    await stop();
    throw e;
  }
  return {
    endpoint: `127.0.0.1:${grpc}`,
    restart: async () => {
      await halt();
      await launch();
    },
    stop,
  };
}
