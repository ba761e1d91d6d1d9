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
  private readonly ac = new AbortController();
  private readonly stopSession: () => void;
  private lostError: CoorddError | undefined;
  /** Given up, but telling the server failed: the next give-up tries again. */
  private untold = false;

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
    if (this.ac.signal.aborted) {
      if (!this.untold) return false;
      this.untold = false;
      return "again";
    }
    this.stopSession();
    this.ac.abort(new CoorddError(reason, message));
    return "first";
  }

  /** Records whether telling the server of a give-up worked. */
  protected told(ok: boolean): void {
    this.untold = !ok;
  }

  /** Ends the holding because it was lost. */
  protected lose(err: CoorddError): void {
    if (this.ac.signal.aborted) return;
    this.stopSession();
    this.lostError = err;
    this.ac.abort(err);
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
      const link = linkSignals(this.ac.signal, this.conn.closed);
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
