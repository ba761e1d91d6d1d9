import { CoorddError, type ReasonName } from "./errors.js";
import type { Conn, Endpoint } from "./conn.js";
import type { Session } from "./session.js";
import { jitter, linkSignals, sleep } from "./util.js";

/**
 * What a held lock and a leadership share: a signal that aborts when the
 * holding ends (given up, the session lost or closed, or reported gone by
 * the server), and a background watch that tells when the server no
 * longer has it although this process did not give it up.
 */
export abstract class Held {
  private ac = new AbortController();
  private readonly stopSession: () => void;
  private lostError: CoorddError | undefined;
  /** Given up, but telling the server failed: the next give-up tries again. */
  private untold = false;
  /** Given up or lost: over for good (the signal may also abort during a hand-over, see suspend). */
  private ended = false;
  /** Aborts once the holding is over for good: ends the watch. */
  private readonly over = new AbortController();
  /** A hand-over is under way: a report of a loss waits for its outcome (see settle). */
  private suspended = false;
  private pendingLoss: CoorddError | undefined;
  private pendingRevoke: (() => Promise<void>) | undefined;

  protected constructor(
    protected readonly conn: Conn,
    readonly session: Session,
  ) {
    const onSession = () => this.lose(session.error!);
    session.signal.addEventListener("abort", onSession, { once: true });
    this.stopSession = () => session.signal.removeEventListener("abort", onSession);
    if (session.signal.aborted) onSession();
  }

  /**
   * Aborted when the holding ends: given up (release, resign), its
   * session's local deadline passed or the session was closed or reported
   * gone, or the server reported the holding gone (NOT_HOLDER /
   * NOT_LEADER). `signal.reason` is a CoorddError saying which. Stop
   * acting on the holder's behalf when it aborts.
   */
  get signal(): AbortSignal {
    return this.ac.signal;
  }

  /** Why the holding was lost (not given up): undefined while held or after a release/resign. */
  get lost(): CoorddError | undefined {
    return this.lostError;
  }

  /**
   * Ends the holding because its holder gives it up. Says whether to tell
   * the server: "first" when this call ended it, "again" when an earlier
   * give-up failed to tell it (see told), false otherwise.
   */
  protected giveUp(reason: ReasonName, message: string): "first" | "again" | false {
    if (this.ended) {
      if (!this.untold) return false;
      this.untold = false;
      return "again";
    }
    this.ended = true;
    this.stopSession();
    if (!this.ac.signal.aborted) this.ac.abort(new CoorddError(reason, message));
    this.over.abort();
    return "first";
  }

  /**
   * Starts a hand-over the holder brings about (a transfer): the signal
   * aborts now, before the request leaves, so that this holder has
   * stopped before the next one holds. settle says how it went.
   */
  protected suspend(reason: ReasonName, message: string): void {
    this.suspended = true;
    this.pendingLoss = undefined;
    this.pendingRevoke = undefined;
    if (!this.ac.signal.aborted) this.ac.abort(new CoorddError(reason, message));
  }

  /**
   * Ends a hand-over: done, the holding is given up; refused, a loss
   * reported meanwhile is applied now, or else the holding goes on under
   * a new signal (read `signal` again).
   */
  protected settle(done: boolean, reason: ReasonName, message: string): void {
    this.suspended = false;
    const loss = this.pendingLoss;
    const revoke = this.pendingRevoke;
    this.pendingLoss = undefined;
    this.pendingRevoke = undefined;
    if (done) {
      this.giveUp(reason, message);
      return;
    }
    if (loss) {
      this.lose(loss);
      if (revoke) void revoke();
      return;
    }
    if (!this.ended && !this.session.signal.aborted) this.ac = new AbortController();
  }

  /** Records whether telling the server of a give-up worked. */
  protected told(ok: boolean): void {
    this.untold = !ok;
  }

  /** Ends the holding because it was lost; reports whether this call ended it. */
  protected lose(err: CoorddError): boolean {
    if (this.ended) return false;
    if (this.suspended) {
      this.pendingLoss ??= err;
      return false;
    }
    this.ended = true;
    this.stopSession();
    this.lostError = err;
    if (!this.ac.signal.aborted) this.ac.abort(err);
    this.over.abort();
    return true;
  }

  /**
   * The server asks that the holding be given up (a release or
   * resignation from outside): it ends as lost, and only then is the
   * server told that this holder let go (letGo), which lets the next
   * holder in.
   */
  protected revoked(err: CoorddError, letGo: () => Promise<void>): void {
    if (this.suspended) {
      this.pendingLoss ??= err;
      this.pendingRevoke = letGo;
      return;
    }
    if (this.lose(err)) void letGo();
  }

  /**
   * Follows the holding on a server stream until it ends: open opens the
   * stream on an endpoint, check looks at each message and returns an
   * error once the holding is gone. Broken streams are reopened with
   * backoff; a stream the server refuses for good (an old server, a
   * policy) is given up silently: the holding then ends only with its
   * session or through this process.
   */
  protected startWatch<M>(
    open: (ep: Endpoint, signal: AbortSignal) => AsyncIterable<M>,
    check: (msg: M) => CoorddError | undefined,
  ): void {
    if (!this.conn.watchHoldings) return;
    void (async () => {
      const link = linkSignals(this.over.signal, this.conn.closed);
      const signal = link.signal;
      let backoff = 100;
      try {
        while (!signal.aborted) {
          const ep = this.conn.pick();
          try {
            for await (const msg of open(ep, signal)) {
              const gone = check(msg);
              if (gone) {
                this.lose(gone);
                return;
              }
              backoff = 100;
            }
          } catch (e) {
            if (signal.aborted) return;
            const err = this.conn.convert(e) as CoorddError;
            const permanent: ReasonName[] = ["UNIMPLEMENTED", "PERMISSION_DENIED", "UNAUTHENTICATED", "INVALID_ARGUMENT"];
            if (permanent.includes(err.reason)) return;
            this.conn.noteFailure(ep, err);
          }
          await sleep(jitter(backoff), signal);
          backoff = Math.min(2 * backoff, 2000);
        }
      } catch {
        // the signal aborted during a pause: the holding is over
      } finally {
        link.dispose();
      }
    })();
  }
}
