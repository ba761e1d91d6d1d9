import type * as http2 from "node:http2";
import { Code, ConnectError, createClient, type Client as RpcClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { BarrierService } from "./gen/coordd/v1/barrier_pb.js";
import { ConfigService } from "./gen/coordd/v1/config_pb.js";
import { ElectionService } from "./gen/coordd/v1/election_pb.js";
import { HistoryService } from "./gen/coordd/v1/history_pb.js";
import { KVService } from "./gen/coordd/v1/kv_pb.js";
import { LockService } from "./gen/coordd/v1/lock_pb.js";
import { SessionService } from "./gen/coordd/v1/session_pb.js";
import { CoorddError, toCoorddError, type ReasonName } from "./errors.js";
import { linkSignals, now, sleep } from "./util.js";

/** The generated gRPC clients of one endpoint. */
export interface Services {
  sessions: RpcClient<typeof SessionService>;
  locks: RpcClient<typeof LockService>;
  elections: RpcClient<typeof ElectionService>;
  config: RpcClient<typeof ConfigService>;
  kv: RpcClient<typeof KVService>;
  history: RpcClient<typeof HistoryService>;
  barriers: RpcClient<typeof BarrierService>;
}

/** Per-attempt call options, as Connect takes them. */
export interface CallOptions {
  signal: AbortSignal;
  timeoutMs?: number;
}

/** One endpoint: its HTTP/2 connection and its clients. */
export interface Endpoint {
  address: string;
  manager: Http2SessionManager;
  services: Services;
}

export interface CallPolicy {
  /** Retry on UNAVAILABLE (on the next endpoint): only for calls that are safe to repeat. */
  idempotent?: boolean;
  /** Ends the call (and its retries) with the signal's reason. */
  signal?: AbortSignal;
  /** Deadline of one attempt; null for none; undefined for the client's callTimeoutMs. */
  timeoutMs?: number | null;
  /** How long retries may go on (default: the client's callTimeoutMs); Infinity: until signal aborts. */
  retryForMs?: number;
  /** Also move to the next endpoint when an attempt runs out of time (a silent member). */
  failoverOnTimeout?: boolean;
}

/** Anything that can be closed when the client closes. */
export interface Closable {
  close(): Promise<void>;
}

/**
 * Conn owns the endpoints and runs every call: it converts errors to
 * CoorddError, moves to the next endpoint on UNAVAILABLE, and retries
 * idempotent calls there. Internal: the public surface is Client.
 */
/**
 * TLS to coordd: the CA bundle that signed its certificate (PEM; Node's
 * own trust store when unset), a client certificate and key for mutual
 * TLS, and the name to check the certificate against when it is not the
 * endpoint's host.
 */
export interface TLSOptions {
  ca?: string | Buffer;
  cert?: string | Buffer;
  key?: string | Buffer;
  serverName?: string;
}

/** An endpoint's URL: as given when it is one, else https:// with TLS, http:// without. */
export function baseUrlOf(address: string, tls: boolean): string {
  if (/^https?:\/\//.test(address)) return address;
  return `${tls ? "https" : "http"}://${address}`;
}

/** Whether host (a URL's hostname) is this machine's loopback. */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "");
  return h === "localhost" || h === "::1" || /^127\./.test(h);
}

/** The header with which every answer of a member names its cluster. */
const clusterHeader = "coordd-cluster";

export class Conn {
  readonly endpoints: Endpoint[];
  readonly callTimeoutMs: number;
  readonly watchHoldings: boolean;
  private current = 0;
  /** The cluster the endpoints answered for, and the endpoint that named it first. */
  private cluster?: { id: string; from: string };
  /**
   * Set once an endpoint answered for another cluster: every call is
   * refused from then on (a ConnectError, which the call's error
   * conversion turns into INVALID_ARGUMENT).
   */
  private mixed?: ConnectError;
  private readonly closing = new AbortController();
  /** Live sessions and subscriptions, closed by close(). */
  readonly open = new Set<Closable>();

  constructor(opts: {
    endpoints: string[];
    token?: string;
    tls?: TLSOptions;
    callTimeoutMs?: number;
    watchHoldings?: boolean;
  }) {
    if (opts.endpoints.length === 0) {
      throw new CoorddError("INVALID_ARGUMENT", "coordd: at least one endpoint is required");
    }
    const baseUrls = opts.endpoints.map((address) => baseUrlOf(address, opts.tls !== undefined));
    if (opts.token) {
      for (const [i, url] of baseUrls.entries()) {
        if (url.startsWith("http://") && !isLoopback(new URL(url).hostname)) {
          throw new CoorddError(
            "INVALID_ARGUMENT",
            `coordd: a bearer token is sent only over TLS or to a loopback endpoint, not in plaintext to ${opts.endpoints[i]}: give tls (or an https:// endpoint)`,
          );
        }
      }
    }
    const secure: http2.SecureClientSessionOptions | undefined = opts.tls && {
      ca: opts.tls.ca,
      cert: opts.tls.cert,
      key: opts.tls.key,
      servername: opts.tls.serverName,
    };
    this.callTimeoutMs = opts.callTimeoutMs ?? 10_000;
    this.watchHoldings = opts.watchHoldings ?? true;
    const interceptors: Interceptor[] = [];
    if (opts.token) {
      const header = `Bearer ${opts.token}`;
      interceptors.push((next) => (req) => {
        req.header.set("authorization", header);
        return next(req);
      });
    }
    this.endpoints = opts.endpoints.map((address, i) => {
      const baseUrl = baseUrls[i]!;
      const manager = new Http2SessionManager(baseUrl, undefined, baseUrl.startsWith("https://") ? secure : undefined);
      const checkCluster: Interceptor = (next) => async (req) => {
        if (this.mixed) throw this.mixed;
        const res = await next(req);
        this.noteCluster(address, res.header.get(clusterHeader));
        return res;
      };
      const transport = createGrpcTransport({ baseUrl, sessionManager: manager, interceptors: [...interceptors, checkCluster] });
      return {
        address,
        manager,
        services: {
          sessions: createClient(SessionService, transport),
          locks: createClient(LockService, transport),
          elections: createClient(ElectionService, transport),
          config: createClient(ConfigService, transport),
          kv: createClient(KVService, transport),
          history: createClient(HistoryService, transport),
          barriers: createClient(BarrierService, transport),
        },
      };
    });
  }

  /** Aborted when the client closes. */
  get closed(): AbortSignal {
    return this.closing.signal;
  }

  /**
   * Notes the cluster an answer of address named; throws (and refuses
   * every call from then on) once the endpoints answered for two clusters:
   * a lock taken on one would not exclude a holder on the other. An answer
   * without the header (an older server) says nothing.
   */
  private noteCluster(address: string, id: string | null): void {
    if (!this.mixed && id) {
      if (!this.cluster) {
        this.cluster = { id, from: address };
      } else if (this.cluster.id !== id) {
        this.mixed = new ConnectError(
          `coordd: the endpoints name members of two clusters: ${this.cluster.from} answers for cluster ${this.cluster.id}, ${address} for cluster ${id}; give a client the endpoints of one cluster`,
          Code.InvalidArgument,
        );
      }
    }
    if (this.mixed) throw this.mixed;
  }

  /** The endpoint in use. */
  pick(): Endpoint {
    return this.endpoints[this.current]!;
  }

  /** Moves to the next endpoint, unless another caller already moved away from ep. */
  failover(ep: Endpoint): void {
    if (this.endpoints[this.current] === ep && this.endpoints.length > 1) {
      this.current = (this.current + 1) % this.endpoints.length;
    }
  }

  /**
   * Converts an error of a call made under signal: a call ended by its
   * caller's signal fails with that signal's reason (a session's loss, the
   * caller's AbortError), one ended by close() with CLIENT_CLOSED.
   */
  convert(err: unknown, signal?: AbortSignal): unknown {
    if (signal?.aborted) return signal.reason;
    if (this.closing.signal.aborted) {
      return new CoorddError("CLIENT_CLOSED", "coordd: the client is closed", { cause: err });
    }
    return toCoorddError(err);
  }

  /** Records a failed call on ep: an unreachable endpoint is left for the next one. */
  noteFailure(ep: Endpoint, err: unknown, timeoutMeansDown = false): void {
    const reason = (err as CoorddError).reason as ReasonName | undefined;
    if (reason === "UNAVAILABLE" || (timeoutMeansDown && reason === "DEADLINE_EXCEEDED")) {
      this.failover(ep);
    }
  }

  /**
   * Runs one unary call, on the endpoint in use; see CallPolicy for
   * retries. fn is called once per attempt.
   */
  async call<T>(fn: (s: Services, o: CallOptions) => Promise<T>, p: CallPolicy = {}): Promise<T> {
    if (this.closing.signal.aborted) {
      throw new CoorddError("CLIENT_CLOSED", "coordd: the client is closed");
    }
    const start = now();
    const retryFor = p.retryForMs ?? this.callTimeoutMs;
    let backoff = 50;
    for (;;) {
      const ep = this.pick();
      const link = linkSignals(this.closing.signal, p.signal);
      const o: CallOptions = { signal: link.signal };
      const timeout = p.timeoutMs === undefined ? this.callTimeoutMs : p.timeoutMs;
      if (timeout !== null) o.timeoutMs = Math.max(1, Math.ceil(timeout));
      let err: unknown;
      try {
        return await fn(ep.services, o);
      } catch (e) {
        err = this.convert(e, p.signal);
      } finally {
        link.dispose();
      }
      if (!(err instanceof CoorddError)) throw err; // the caller's own abort reason
      this.noteFailure(ep, err, p.failoverOnTimeout);
      if (!p.idempotent || err.reason !== "UNAVAILABLE" || now() - start + backoff > retryFor) {
        throw err;
      }
      const wait = linkSignals(this.closing.signal, p.signal);
      try {
        await sleep(backoff, wait.signal);
      } catch {
        throw this.convert(err, p.signal);
      } finally {
        wait.dispose();
      }
      backoff = Math.min(2 * backoff, 1000);
    }
  }

  /**
   * Closes what is open (sessions, subscriptions, observers), then the
   * HTTP/2 connections. Calls in flight end with CLIENT_CLOSED.
   */
  async close(): Promise<void> {
    if (this.closing.signal.aborted) return;
    await Promise.allSettled([...this.open].map((c) => c.close()));
    this.closing.abort(new CoorddError("CLIENT_CLOSED", "coordd: the client is closed"));
    for (const ep of this.endpoints) ep.manager.abort();
  }
}
