import { test } from "node:test";
import assert from "node:assert/strict";
import type { Lock, Leadership, Session } from "../src/index.js";
import { rawClients, unique, useDaemon } from "./helpers.js";

// The old holder always knows first: in every path, when the next
// holder's call resolves, the old one's signal has already aborted. Each
// path runs COORDD_HANDOVERS hand-overs (1,000 by default).
const d = useDaemon();
const rounds = Number(process.env.COORDD_HANDOVERS ?? "1000");

type Holding = { signal: AbortSignal };

/** Starts call; resolves with what it got and whether old's signal still lived when it did. */
async function next<T>(old: Holding, call: () => Promise<T>): Promise<{ got: T; stale: boolean }> {
  const got = await call();
  return { got, stale: !old.signal.aborted };
}

/** Waits for check, asking again at once (each check is a round trip): a hand-over costs a few milliseconds. */
async function until(what: string, check: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
  }
}

async function queued(name: string, n: number): Promise<void> {
  await until(`${n} waiter(s) on ${name}`, async () => (await d.client().describeLock(name)).waiters.length >= n);
}

async function candidates(name: string, n: number): Promise<void> {
  await until(`${n} candidate(s) in ${name}`, async () => (await d.client().candidates(name)).length >= n);
}

async function sessions(): Promise<[Session, Session]> {
  return [await d.client().session({ ttl: 60 }), await d.client().session({ ttl: 60 })];
}

test("outside releases: the holder's signal aborts before the waiter holds", async () => {
  const name = unique("told-release");
  const [a, b] = await sessions();
  const raw = rawClients(d.endpoint());
  let holder: Lock = await a.lock(name);
  let waiter = b;
  let overlaps = 0;
  try {
    for (let i = 0; i < rounds; i++) {
      const w = next(holder, () => waiter.lock(name));
      await queued(name, 1);
      await raw.locks.release({ name, token: holder.token }); // as an operator would
      const r = await w;
      if (r.stale) overlaps++;
      waiter = waiter === a ? b : a;
      holder = r.got;
    }
  } finally {
    raw.close();
  }
  assert.equal(overlaps, 0, `in ${overlaps} of ${rounds} outside releases the old holder's signal still lived`);
  await holder.release();
  await a.close();
  await b.close();
});

test("outside resignations: the leader's signal aborts before the next one leads", async () => {
  const name = unique("told-resign");
  const [a, b] = await sessions();
  const raw = rawClients(d.endpoint());
  let leader: Leadership = await a.campaign(name, "a");
  let other = b;
  let overlaps = 0;
  try {
    for (let i = 0; i < rounds; i++) {
      const w = next(leader, () => other.campaign(name, "next"));
      await candidates(name, 1);
      await raw.elections.resign({ name, term: leader.term });
      const r = await w;
      if (r.stale) overlaps++;
      other = other === a ? b : a;
      leader = r.got;
    }
  } finally {
    raw.close();
  }
  assert.equal(overlaps, 0, `in ${overlaps} of ${rounds} outside resignations the old leader's signal still lived`);
  await leader.resign();
  await a.close();
  await b.close();
});

test("transfers: the leader's signal aborts before the successor leads", async () => {
  const name = unique("told-transfer");
  const [a, b] = await sessions();
  let leader: Leadership = await a.campaign(name, "a");
  let other = b;
  let overlaps = 0;
  for (let i = 0; i < rounds; i++) {
    const w = next(leader, () => other.campaign(name, "next"));
    await candidates(name, 1);
    await leader.transfer(other.id);
    const r = await w;
    if (r.stale) overlaps++;
    other = other === a ? b : a;
    leader = r.got;
  }
  assert.equal(overlaps, 0, `in ${overlaps} of ${rounds} transfers the old leader's signal still lived`);
  await leader.resign();
  await a.close();
  await b.close();
});

test("semaphore and read/write grants released from outside: the holder knows first", async () => {
  for (const mode of ["semaphore", "rw"] as const) {
    const name = unique(`told-${mode}`);
    const [a, b] = await sessions();
    const third = await d.client().session({ ttl: 60 });
    const raw = rawClients(d.endpoint());
    const opts = mode === "semaphore" ? { limit: 2 } : {};
    const keep = mode === "semaphore" ? await third.lock(name, opts) : undefined;
    let holder: Lock = await a.lock(name, opts);
    let waiter = b;
    let overlaps = 0;
    try {
      for (let i = 0; i < rounds; i++) {
        const read = mode === "rw" && i % 2 === 0;
        const w = next(holder, () => waiter.lock(name, { ...opts, read }));
        await queued(name, 1);
        await raw.locks.release({ name, token: holder.token });
        const r = await w;
        if (r.stale) overlaps++;
        waiter = waiter === a ? b : a;
        holder = r.got;
      }
    } finally {
      raw.close();
    }
    assert.equal(overlaps, 0, `${mode}: in ${overlaps} of ${rounds} outside releases the old holder's signal still lived`);
    await holder.release();
    await keep?.release();
    await Promise.all([a.close(), b.close(), third.close()]);
  }
});

test("sessions closed from outside: every holder's signal aborts before the waiter holds", async () => {
  const name = unique("told-close");
  const raw = rawClients(d.endpoint());
  let holderSession = await d.client().session({ ttl: 60 });
  let holder: Lock = await holderSession.lock(name);
  let overlaps = 0;
  try {
    for (let i = 0; i < rounds; i++) {
      const waiter = await d.client().session({ ttl: 60 });
      const w = next(holder, () => waiter.lock(name));
      await queued(name, 1);
      await raw.sessions.closeSession({ sessionId: holderSession.id }); // from outside
      const r = await w;
      if (r.stale) overlaps++;
      holder = r.got;
      holderSession = waiter;
    }
  } finally {
    raw.close();
  }
  assert.equal(overlaps, 0, `in ${overlaps} of ${rounds} session closes the old holder's signal still lived`);
  await holderSession.close();
});
