import { randomBytes } from "node:crypto";
import { performance } from "node:perf_hooks";
import { create } from "@bufbuild/protobuf";
import { DurationSchema, type Duration } from "@bufbuild/protobuf/wkt";
import { CoorddError } from "./errors.js";

/** Monotonic milliseconds (never jumps with the wall clock). */
export const now = (): number => performance.now();

/** A random request id (16 hex digits), within the server's alphabet [A-Za-z0-9._:@-]. */
export const randomId = (): string => randomBytes(8).toString("hex");

/** A protobuf Duration of ms milliseconds. */
export function durationOf(ms: number): Duration {
  const whole = Math.floor(ms / 1000);
  return create(DurationSchema, {
    seconds: BigInt(whole),
    nanos: Math.round((ms - whole * 1000) * 1e6),
  });
}

/** Milliseconds of a protobuf Duration (0 when unset). */
export function msOf(d: Duration | undefined): number {
  return d ? Number(d.seconds) * 1000 + d.nanos / 1e6 : 0;
}

/**
 * Resolves after ms, or rejects with signal's reason when it aborts first.
 * The timer is cleared either way, so it never holds the process open.
 */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, ms));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * A signal that aborts when any of signals does (with its reason);
 * undefined entries are skipped. Call dispose() when done with it: it
 * removes the listeners from the long-lived source signals (a session's, the
 * client's).
 */
export function linkSignals(...signals: (AbortSignal | undefined)[]): {
  signal: AbortSignal;
  dispose: () => void;
} {
  const ac = new AbortController();
  const undo: (() => void)[] = [];
  for (const s of signals) {
    if (!s) continue;
    if (s.aborted) {
      ac.abort(s.reason);
      break;
    }
    const f = () => ac.abort(s.reason);
    s.addEventListener("abort", f, { once: true });
    undo.push(() => s.removeEventListener("abort", f));
  }
  return { signal: ac.signal, dispose: () => undo.forEach((f) => f()) };
}

/** ms with ±10% jitter. */
export const jitter = (ms: number): number => ms * (0.9 + Math.random() * 0.2);

/**
 * The server-side wait of a call that may wait at most `timeoutMs` since
 * `start` (unbounded when undefined), and the attempt's options: the
 * server's wait ends first, so it answers DEADLINE_EXCEEDED with nothing
 * left waiting, and the attempt's own deadline (5 s later) only backs it
 * up. Throws DEADLINE_EXCEEDED ("coordd: <what> within <timeoutMs> ms")
 * when no time is left for another attempt.
 */
export function serverWait(
  timeoutMs: number | undefined,
  start: number,
  signal: AbortSignal,
  what: string,
): { wait?: Duration; opts: { signal: AbortSignal; timeoutMs?: number } } {
  if (timeoutMs === undefined) return { opts: { signal } };
  const left = timeoutMs - (now() - start);
  if (left <= 0) throw new CoorddError("DEADLINE_EXCEEDED", `coordd: ${what} within ${timeoutMs} ms`);
  return { wait: durationOf(left), opts: { signal, timeoutMs: Math.ceil(left) + 5000 } };
}
