import { test } from "node:test";
import assert from "node:assert/strict";
import { CoorddError, Reason, type ElectionEvent } from "../src/index.js";
import { abortedAt, rawClients, unique, useDaemon, waitFor, within } from "./helpers.js";

const d = useDaemon();

/** Collects an observation's events in the background. */
function collect(it: AsyncIterable<ElectionEvent>) {
  const events: ElectionEvent[] = [];
  const done = (async () => {
    for await (const ev of it) events.push(ev);
  })();
  return { events, done };
}

const summary = (evs: ElectionEvent[]) => evs.map((e) => `${e.type}${e.leader ? ":" + e.leader.value : ""}`);

test("campaign, leader, proclaim, resign and observe, in order", async () => {
  const name = unique("election");
  const c = d.client();
  const stop = new AbortController();
  const obs = collect(c.observe(name, { signal: stop.signal }));
  await waitFor("the VACANT state", () => obs.events.length >= 1);
  assert.equal(obs.events[0]!.type, "VACANT");
  assert.equal(obs.events[0]!.current, true);
  assert.equal(await c.leader(name), undefined);

  const a = await c.session();
  const b = await c.session();
  const la = await a.campaign(name, "a-1");
  assert.equal(typeof la.term, "bigint");
  const leader = await c.leader(name);
  assert.equal(leader?.value, "a-1");
  assert.equal(leader?.term, la.term);
  assert.equal(leader?.sessionId, a.id);

  await la.proclaim("a-2");
  assert.equal((await c.leader(name))?.value, "a-2");

  const bWins = b.campaign(name, "b-1", { timeoutMs: 5000 });
  await waitFor("b's candidacy", async () => (await c.candidates(name)).length === 1);
  await la.resign();
  assert.equal((la.signal.reason as CoorddError).reason, Reason.RESIGNED);
  const lb = await within(5000, "b elected", bWins);
  assert.ok(lb.term > la.term, `term ${lb.term} after ${la.term}`);
  assert.equal((await c.leader(name))?.value, "b-1");
  await lb.resign();
  assert.equal(await c.leader(name), undefined);

  const want = ["VACANT", "ELECTED:a-1", "PROCLAIMED:a-2", "RESIGNED:a-2", "ELECTED:b-1", "RESIGNED:b-1", "VACANT"];
  await waitFor("every event", () => obs.events.length >= want.length);
  assert.deepEqual(summary(obs.events), want);
  const revs = obs.events.map((e) => e.revision);
  for (let i = 1; i < revs.length; i++) assert.ok(revs[i]! >= revs[i - 1]!, "revisions never go back");
  stop.abort();
  await within(2000, "observer stops", obs.done);

  // Resuming from a revision replays what came after it, nothing before.
  const from = obs.events[3]!.revision; // RESIGNED:a-2 and ELECTED:b-1 share it
  const stopReplay = new AbortController();
  const replay = collect(c.observe(name, { fromRevision: from + 1n, signal: stopReplay.signal }));
  await waitFor("the replay", () => replay.events.length >= 2);
  assert.deepEqual(summary(replay.events), ["RESIGNED:b-1", "VACANT"]);
  stopReplay.abort();
  await within(2000, "replay stops", replay.done);
  await a.close();
  await b.close();
});

test("breaking out of an observation ends its stream", async () => {
  const name = unique("break");
  for await (const ev of d.client().observe(name)) {
    assert.equal(ev.type, "VACANT");
    break;
  }
});

test("a lost session ends the leadership before another candidate is elected", async () => {
  const name = unique("expiry");
  const a = await d.client().session({ ttl: 2 });
  const b = await d.client().session();
  const la = await a.campaign(name, "a");
  const lostAt = abortedAt(la.signal);
  const bWins = b.campaign(name, "b").then((l) => ({ l, at: performance.now() }));
  a.stopRenewalsForTesting();
  const { l: lb, at } = await within(10_000, "b elected", bWins);
  const lost = await within(100, "leadership signal", lostAt);
  assert.ok(lost < at, `lost at ${lost.toFixed(1)}, b elected at ${at.toFixed(1)}`);
  assert.equal(la.lost?.reason, Reason.SESSION_EXPIRED);
  assert.ok(lb.term > la.term);
  await assert.rejects(la.proclaim("late"), (e: unknown) => CoorddError.is(e, Reason.NOT_LEADER));
  await assert.rejects(la.put(`${name}/k`, "late"), (e: unknown) => CoorddError.is(e, Reason.STALE_TOKEN));
  await lb.put(`${name}/k`, "b's write");
  await lb.resign();
  await a.close();
  await b.close();
});

test("a resignation from outside aborts the leader's signal with NOT_LEADER", async () => {
  const name = unique("outside");
  const a = await d.client().session();
  const la = await a.campaign(name, "a");
  const raw = rawClients(d.endpoint());
  try {
    await raw.elections.resign({ name, term: la.term });
  } finally {
    raw.close();
  }
  await within(3000, "the leader's signal", abortedAt(la.signal));
  assert.equal(la.lost?.reason, Reason.NOT_LEADER);
  await a.close();
});

test("runAsLeader runs one callback at a time, resigns after, and stops on abort", async () => {
  const name = unique("run");
  const c = d.client();
  // A callback that finishes: runAsLeader resolves with its value and resigns.
  const terms: bigint[] = [];
  const out = await c.runAsLeader(name, "one", async (lead) => {
    assert.equal((await c.leader(name))?.term, lead.term);
    return "done";
  }, { ttl: 5, onElected: (t) => terms.push(t) });
  assert.equal(out, "done");
  assert.equal(terms.length, 1);
  assert.equal(await c.leader(name), undefined);

  // Two loops: the second leads only after the first is stopped.
  let running = 0;
  let maxRunning = 0;
  const started: string[] = [];
  const loop = (who: string, stop: AbortSignal) =>
    c.runAsLeader(name, who, async (_lead, signal) => {
      running++;
      maxRunning = Math.max(maxRunning, running);
      started.push(who);
      await new Promise((r) => signal.addEventListener("abort", r, { once: true }));
      running--;
      return who;
    }, { ttl: 5, signal: stop });
  const stop1 = new AbortController();
  const stop2 = new AbortController();
  const p1 = loop("first", stop1.signal).catch((e) => e);
  await waitFor("first leads", () => started.length === 1);
  const p2 = loop("second", stop2.signal).catch((e) => e);
  await waitFor("second waits", async () => (await c.candidates(name)).length === 1);
  stop1.abort();
  assert.equal((await within(5000, "first stops", p1)).name, "AbortError");
  await waitFor("second leads", () => started.length === 2);
  assert.deepEqual(started, ["first", "second"]);
  assert.equal(maxRunning, 1);
  stop2.abort();
  await within(5000, "second stops", p2);
  assert.equal(await c.leader(name), undefined);
});

test("priority orders the line, preempt asks the leader, transfer hands over in one commit", async () => {
  const name = unique("handover");
  const c = d.client();
  const [a, b, h] = [await c.session(), await c.session(), await c.session()];
  const la = await a.campaign(name, "a", { priority: 1 });
  const bWins = b.campaign(name, "b", { timeoutMs: 10_000 });
  await waitFor("b waits", async () => (await c.candidates(name)).length === 1);
  const hWins = h.campaign(name, "h", { timeoutMs: 10_000, priority: 5, preempt: true });
  await waitFor("h waits", async () => (await c.candidates(name)).length === 2);
  const line = await c.candidates(name);
  assert.deepEqual(line.map((x) => [x.value, x.priority]), [["h", 5], ["b", 0]]);
  assert.ok(line[0]!.joinedRevision > line[1]!.joinedRevision, "priority before arrival");

  const stop = new AbortController();
  const obs = collect(c.observe(name, { signal: stop.signal }));
  await waitFor("the state and the request", () => obs.events.length >= 2);
  assert.deepEqual(obs.events.slice(0, 2).map((e) => [e.type, e.current]), [["ELECTED", true], ["PREEMPT_REQUESTED", true]]);
  assert.equal(obs.events[1]!.by?.sessionId, h.id);

  await assert.rejects(la.transfer("00000000000000ff"), (e: unknown) => CoorddError.is(e, Reason.CANDIDATE_NOT_FOUND));
  assert.equal(la.signal.aborted, false, "a failed hand-over keeps the leadership");
  const term = await la.transfer(b.id);
  const lb = await within(5000, "b elected", bWins);
  assert.equal(lb.term, term);
  assert.equal((la.signal.reason as CoorddError).reason, Reason.RESIGNED);
  assert.equal(la.lost, undefined, "a hand-over is no loss");
  await waitFor("the hand-over", () => obs.events.length >= 4);
  assert.deepEqual(obs.events.slice(2, 4).map((e) => [e.type, e.revision]), [["RESIGNED", term], ["ELECTED", term]]);
  await lb.resign();
  const lh = await within(5000, "h elected", hWins);
  await lh.resign();
  stop.abort();
  await within(2000, "observer stops", obs.done);
  await a.close();
  await b.close();
  await h.close();
});
