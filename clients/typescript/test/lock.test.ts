import { test } from "node:test";
import assert from "node:assert/strict";
import { CoorddError, Reason } from "../src/index.js";
import { Client } from "../src/index.js";
import { abortedAt, rawClients, startProxy, unique, useDaemon, within } from "./helpers.js";

const d = useDaemon();

const reasonOf = (reason: string) => (e: unknown) => {
  assert.ok(e instanceof CoorddError, `expected a CoorddError, got ${String(e)}`);
  assert.equal(e.reason, reason, e.message);
  return true;
};

test("a lock is exclusive, and a later grant has a strictly larger token", async () => {
  const name = unique("exclusive");
  const a = await d.client().session({ ttl: 10 });
  const b = await d.client().session({ ttl: 10 });
  const la = await a.lock(name);
  assert.equal(typeof la.token, "bigint");
  await assert.rejects(b.tryLock(name), reasonOf(Reason.LOCK_HELD));
  await la.release();
  assert.equal(la.signal.aborted, true);
  assert.equal((la.signal.reason as CoorddError).reason, Reason.LOCK_RELEASED);
  const lb = await b.tryLock(name);
  assert.ok(lb.token > la.token, `token ${lb.token} after ${la.token}`);
  await lb.release();
  await a.close();
  await b.close();
});

test("a waiter is granted in turn when the holder releases", async () => {
  const name = unique("fifo");
  const a = await d.client().session();
  const b = await d.client().session();
  const la = await a.lock(name);
  let granted = false;
  const waiting = b.lock(name, { timeoutMs: 5000 }).then((l) => ((granted = true), l));
  // The waiter is queued on the server, not granted.
  for (let i = 0; i < 50 && (await d.client().describeLock(name)).waiters.length === 0; i++) {
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal((await d.client().describeLock(name)).waiters.length, 1);
  assert.equal(granted, false);
  await la.release();
  const lb = await within(5000, "grant after release", waiting);
  assert.ok(lb.token > la.token);
  await a.close();
  await b.close();
});

test("the fenced KV refuses a stale token with STALE_TOKEN", async () => {
  const name = unique("fenced");
  const key = `${name}/value`;
  const a = await d.client().session();
  const b = await d.client().session();
  const la = await a.lock(name);
  await la.put(key, "from a");
  await la.validate();
  await la.release();
  const lb = await b.lock(name);
  await assert.rejects(d.client().fencedPut(la.fence, key, "late write of a"), reasonOf(Reason.STALE_TOKEN));
  await assert.rejects(la.put(key, "late write of a"), reasonOf(Reason.STALE_TOKEN));
  await assert.rejects(la.validate(), reasonOf(Reason.STALE_TOKEN));
  assert.equal(new TextDecoder().decode((await d.client().kv.get(key))!.value), "from a");
  const rev = await lb.put(key, "from b");
  const kv = await d.client().kv.get(key);
  assert.equal(new TextDecoder().decode(kv!.value), "from b");
  assert.equal(kv!.modRevision, rev);
  await lb.release();
  await a.close();
  await b.close();
});

test("a lost session aborts the lock's signal before another session is granted the lock", async (t) => {
  const name = unique("expiry");
  const a = await d.client().session({ ttl: 2 });
  const b = await d.client().session({ ttl: 10 });
  const la = await a.lock(name);
  const lostAt = abortedAt(la.signal);
  let onLost: CoorddError | undefined;
  a.onLost((e) => (onLost = e));
  const waiting = b.lock(name, { timeoutMs: 10_000 }).then((l) => ({ l, at: performance.now() }));
  const stoppedAt = performance.now();
  a.stopRenewalsForTesting(); // as a crashed or paused holder
  const { l: lb, at: grantedAt } = await within(10_000, "grant after expiry", waiting);
  const abortAt = await within(100, "lock signal", lostAt);
  t.diagnostic(
    `renewals stopped; lock signal aborted after ${(abortAt - stoppedAt).toFixed(0)} ms, ` +
      `granted to the next session ${(grantedAt - abortAt).toFixed(0)} ms later (TTL ${a.ttlMs} ms, margin ${a.marginMs} ms)`,
  );
  assert.ok(abortAt < grantedAt, `lock lost at ${abortAt.toFixed(1)}, granted elsewhere at ${grantedAt.toFixed(1)}`);
  // The local deadline falls at least the margin before the server's expiry (less scheduling slop).
  assert.ok(grantedAt - abortAt > a.marginMs / 4, `only ${(grantedAt - abortAt).toFixed(1)} ms between loss and grant`);
  assert.ok(abortAt - stoppedAt < a.ttlMs, "lost within one TTL of the last renewal");
  assert.equal((la.signal.reason as CoorddError).reason, Reason.SESSION_EXPIRED);
  assert.equal(la.lost?.reason, Reason.SESSION_EXPIRED);
  assert.equal(a.signal.aborted, true);
  assert.equal(a.error?.reason, Reason.SESSION_EXPIRED);
  assert.equal(onLost?.reason, Reason.SESSION_EXPIRED);
  assert.ok(lb.token > la.token);
  await assert.rejects(la.put(`${name}/k`, "late"), reasonOf(Reason.STALE_TOKEN));
  await a.close(); // already gone on the server: still resolves
  await lb.release();
  await b.close();
});

test("runLocked releases after the callback and hands it a live lock", async () => {
  const name = unique("with");
  const a = await d.client().session();
  const b = await d.client().session();
  let seen: AbortSignal | undefined;
  const out = await a.runLocked(name, async (lock) => {
    seen = lock.signal;
    assert.equal(lock.signal.aborted, false);
    await assert.rejects(b.tryLock(name), reasonOf(Reason.LOCK_HELD));
    return lock.token;
  });
  assert.equal(typeof out, "bigint");
  assert.equal(seen?.aborted, true);
  const lb = await b.tryLock(name); // released
  await lb.release();
  // Released also when the callback throws.
  await assert.rejects(a.runLocked(name, () => Promise.reject(new Error("boom"))), /boom/);
  await (await b.tryLock(name)).release();
  await a.close();
  await b.close();
});

test("lockAll holds every lock of the set or none", async () => {
  const [x, y, z] = [unique("set-a"), unique("set-b"), unique("set-c")];
  const a = await d.client().session();
  const b = await d.client().session();
  const set = await a.lockAll([y, x]);
  assert.deepEqual(set.locks.map((l) => l.name), [x, y]); // sorted by name
  assert.equal(typeof set.get(x)?.token, "bigint");
  for (const name of [x, y]) await assert.rejects(b.tryLock(name), reasonOf(Reason.LOCK_HELD));
  // A set that overlaps a held one waits, holding nothing meanwhile.
  await assert.rejects(b.lockAll([x, z], { timeoutMs: 200 }), reasonOf(Reason.DEADLINE_EXCEEDED));
  await (await a.tryLock(z)).release();
  await set.release();
  const again = await b.lockAll([x, y]);
  assert.ok(again.get(x)!.token > set.get(x)!.token);
  await again.release();
  await assert.rejects(a.lockAll([x], { limit: 2 }), reasonOf(Reason.INVALID_ARGUMENT));
  await a.close();
  await b.close();
});

test("lockHistory records the grant and its release, a page at a time", async () => {
  const name = unique("history");
  const c = d.client();
  const a = await c.session();
  const lock = await a.lock(name);
  await lock.release();
  const collect = async (q = {}) => {
    const out = [];
    for await (const e of c.lockHistory(name, q)) out.push(e);
    return out;
  };
  const granted = await collect({ minRevision: lock.revision });
  assert.deepEqual([granted[0]?.type, granted[0]?.token, granted[0]?.sessionId], ["GRANTED", lock.token, a.id]);
  // The release is recorded shortly after its commit: wait for it.
  const both = await within(10_000, "the release in the history", (async () => {
    for (;;) {
      const evs = await collect({ pageSize: 1 }); // a page per event: paging is followed
      if (evs.length === 2) return evs;
      await new Promise((r) => setTimeout(r, 20)); // polling interval, not synchronisation
    }
  })());
  assert.deepEqual(both.map((e) => [e.type, e.token]), [["GRANTED", lock.token], ["RELEASED", lock.token]]);
  assert.deepEqual((await collect({ newestFirst: true })).map((e) => e.type), ["RELEASED", "GRANTED"]);
  const elections = [];
  for await (const e of c.electionHistory(name)) elections.push(e);
  assert.equal(elections.length, 0);
  await a.close();
});

test("a release from outside aborts the holder's signal with NOT_HOLDER", async () => {
  const name = unique("outside");
  const a = await d.client().session();
  const la = await a.lock(name);
  const raw = rawClients(d.endpoint());
  try {
    await raw.locks.release({ name, token: la.token }); // as an admin with coordctl would
  } finally {
    raw.close();
  }
  await within(3000, "the holder's signal", abortedAt(la.signal));
  assert.equal(la.lost?.reason, Reason.NOT_HOLDER);
  assert.equal(a.signal.aborted, false, "the session lives on");
  await a.close();
});

test("read/write locks: readers share, a writer waits", async () => {
  const name = unique("rw");
  const a = await d.client().session();
  const b = await d.client().session();
  const ra = await a.rlock(name);
  const rb = await b.tryLock(name, { read: true });
  assert.equal(ra.read && rb.read, true);
  await assert.rejects(b.tryLock(name), reasonOf(Reason.LOCK_HELD));
  await ra.release();
  await rb.release();
  const w = await b.tryLock(name);
  assert.equal(w.read, false);
  await assert.rejects(a.tryLock(name, { read: true }), reasonOf(Reason.LOCK_HELD));
  await w.release();
  await a.close();
  await b.close();
});

test("semaphores: limit holders at once, LIMIT_MISMATCH for another limit", async () => {
  const name = unique("sem");
  const ss = await Promise.all([1, 2, 3].map(() => d.client().session()));
  const l1 = await ss[0]!.tryLock(name, { limit: 2 });
  const l2 = await ss[1]!.tryLock(name, { limit: 2 });
  await assert.rejects(ss[2]!.tryLock(name, { limit: 2 }), reasonOf(Reason.LOCK_HELD));
  await assert.rejects(ss[2]!.tryLock(name, { limit: 3 }), reasonOf(Reason.LIMIT_MISMATCH));
  await l1.release();
  await l2.release();
  await Promise.all(ss.map((s) => s.close()));
});

test("a wait that runs out fails with DEADLINE_EXCEEDED and leaves nothing queued", async () => {
  const name = unique("timeout");
  const a = await d.client().session();
  const b = await d.client().session();
  const la = await a.lock(name);
  const t0 = performance.now();
  await assert.rejects(b.lock(name, { timeoutMs: 300 }), reasonOf(Reason.DEADLINE_EXCEEDED));
  const took = performance.now() - t0;
  assert.ok(took >= 250 && took < 3000, `waited ${took.toFixed(0)} ms`);
  assert.equal((await d.client().describeLock(name)).waiters.length, 0);
  await la.release();
  await a.close();
  await b.close();
});

test("closing a session aborts its signal and its locks, and frees them on the server", async () => {
  const name = unique("close");
  const a = await d.client().session();
  const b = await d.client().session();
  const la = await a.lock(name);
  let lostCalled = false;
  a.onLost(() => (lostCalled = true));
  await a.close();
  assert.equal(a.error?.reason, Reason.SESSION_CLOSED);
  assert.equal((la.signal.reason as CoorddError).reason, Reason.SESSION_CLOSED);
  assert.equal(lostCalled, false, "onLost is for losses, not closes");
  await assert.rejects(a.lock(name), reasonOf(Reason.SESSION_CLOSED));
  await (await b.tryLock(name)).release();
  await b.close();
});

test("a release or resign that failed can be repeated; the grant stays with the session meanwhile", async (t) => {
  const proxy = await startProxy(d.endpoint());
  const via = new Client({ endpoints: [proxy.endpoint] });
  t.after(async () => {
    await via.close();
    await proxy.close();
  });
  const name = unique("again");
  const s = await via.session({ ttl: 30 });
  const lock = await s.lock(name);
  const lead = await s.campaign(name, "v");
  proxy.down(); // nothing the holder sends arrives
  await assert.rejects(lock.release({ signal: AbortSignal.timeout(300) }));
  await assert.rejects(lead.resign({ signal: AbortSignal.timeout(300) }));
  assert.equal(lock.signal.aborted, true, "the holder stops acting at the first release");
  const other = await d.client().session({ ttl: 10 });
  await assert.rejects(other.tryLock(name), reasonOf(Reason.LOCK_HELD));
  assert.equal((await d.client().leader(name))?.term, lead.term);
  proxy.up();
  await lock.release();
  await lead.resign();
  await (await other.tryLock(name)).release();
  assert.equal(await d.client().leader(name), undefined);
  await lock.release(); // after a success: nothing to do
  await lead.resign();
  await other.close();
  await s.close();
});
