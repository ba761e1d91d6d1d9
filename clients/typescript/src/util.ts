import { randomBytes } from "node:crypto";
import { performance } from "node:perf_hooks";
import { create } from "@bufbuild/protobuf";
import { DurationSchema, type Duration } from "@bufbuild/protobuf/wkt";

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
