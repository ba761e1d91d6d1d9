import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorReason } from "./gen/coordd/v1/errors_pb.js";
import {
  BadRequestSchema,
  ErrorInfoSchema,
  RetryInfoSchema,
} from "./gen/google/rpc/error_details_pb.js";

/** The server's reasons: the names of coordd.v1.ErrorReason without the ERROR_REASON_ prefix. */
export type ServerReason = Exclude<keyof typeof ErrorReason, "UNSPECIFIED">;

/**
 * Reasons the client raises itself, never sent by the server:
 * - SESSION_EXPIRED: the session's local deadline passed before a
 *   keep-alive was acknowledged (the server may still hold it for the rest
 *   of its TTL);
 * - SESSION_CLOSED: the session (or its client) was closed;
 * - LOCK_RELEASED: the lock was released through this Lock;
 * - RESIGNED: the leadership was resigned through this Leadership;
 * - CLIENT_CLOSED: the client was closed while the call was in flight;
 * - UNKNOWN: an error without a reason that no code maps to.
 */
export type LocalReason =
  | "SESSION_EXPIRED"
  | "SESSION_CLOSED"
  | "LOCK_RELEASED"
  | "RESIGNED"
  | "CLIENT_CLOSED"
  | "UNKNOWN";

export type ReasonName = ServerReason | LocalReason;

const localReasons: LocalReason[] = [
  "SESSION_EXPIRED",
  "SESSION_CLOSED",
  "LOCK_RELEASED",
  "RESIGNED",
  "CLIENT_CLOSED",
  "UNKNOWN",
];

/**
 * Every reason by name, for comparisons: `err.reason === Reason.STALE_TOKEN`.
 * The server's reasons are taken from the generated ErrorReason enum, so the
 * list follows errors.proto without being typed twice.
 */
export const Reason: { readonly [K in ReasonName]: K } = Object.freeze(
  Object.fromEntries(
    [
      ...Object.keys(ErrorReason).filter(
        (k) => Number.isNaN(Number(k)) && k !== "UNSPECIFIED",
      ),
      ...localReasons,
    ].map((k) => [k, k]),
  ),
) as { readonly [K in ReasonName]: K };

/** One problem of a refused write (VALIDATION_FAILED): the key ("" for the write as a whole) and what is wrong. */
export interface Problem {
  key: string;
  description: string;
}

/**
 * The one error class of this client. Branch on `reason` (never on the
 * message): the server's google.rpc.ErrorInfo reason (domain "coordd"), or,
 * for errors without one, a reason derived from the gRPC code, or one of
 * the client's own reasons (LocalReason).
 */
export class CoorddError extends Error {
  /** Why the call failed, e.g. "STALE_TOKEN". */
  readonly reason: ReasonName;
  /** The gRPC status code (Connect's Code enum has the same numbers); undefined for local errors. */
  readonly code: Code | undefined;
  /** Every problem of a refused config write (VALIDATION_FAILED). */
  readonly problems: Problem[];
  /** When the server said to retry (RATE_LIMITED), in milliseconds. */
  readonly retryAfterMs: number | undefined;

  constructor(
    reason: ReasonName,
    message: string,
    opts: { code?: Code; problems?: Problem[]; retryAfterMs?: number; cause?: unknown } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = "CoorddError";
    this.reason = reason;
    this.code = opts.code;
    this.problems = opts.problems ?? [];
    this.retryAfterMs = opts.retryAfterMs;
  }

  /** Whether err is a CoorddError with this reason. */
  static is(err: unknown, reason: ReasonName): err is CoorddError {
    return err instanceof CoorddError && err.reason === reason;
  }
}

/** A reason for an error that carries none, from its gRPC code (as the Go SDK matches them). */
function reasonOfCode(code: Code): ReasonName {
  switch (code) {
    case Code.InvalidArgument:
      return "INVALID_ARGUMENT";
    case Code.Unavailable:
      return "UNAVAILABLE";
    case Code.DeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case Code.Canceled:
      return "CANCELLED";
    case Code.ResourceExhausted:
      return "REQUEST_TOO_LARGE";
    case Code.Unimplemented:
      return "UNIMPLEMENTED";
    case Code.Unauthenticated:
      return "UNAUTHENTICATED";
    case Code.PermissionDenied:
      return "PERMISSION_DENIED";
    case Code.Internal:
      return "INTERNAL";
    default:
      return "UNKNOWN";
  }
}

/**
 * Converts whatever a call threw into a CoorddError (a CoorddError passes
 * through). The reason comes from the ErrorInfo detail with domain "coordd".
 */
export function toCoorddError(err: unknown): CoorddError {
  if (err instanceof CoorddError) return err;
  const ce = ConnectError.from(err);
  let reason: ReasonName | undefined;
  for (const info of ce.findDetails(ErrorInfoSchema)) {
    if (info.domain === "coordd" && info.reason in Reason) {
      reason = info.reason as ReasonName;
    }
  }
  const problems: Problem[] = [];
  for (const br of ce.findDetails(BadRequestSchema)) {
    for (const v of br.fieldViolations) problems.push({ key: v.field, description: v.description });
  }
  let retryAfterMs: number | undefined;
  for (const ri of ce.findDetails(RetryInfoSchema)) {
    if (ri.retryDelay) {
      retryAfterMs = Number(ri.retryDelay.seconds) * 1000 + Math.floor(ri.retryDelay.nanos / 1e6);
    }
  }
  return new CoorddError(reason ?? reasonOfCode(ce.code), ce.rawMessage || ce.message, {
    code: ce.code,
    problems,
    retryAfterMs,
    cause: err,
  });
}
