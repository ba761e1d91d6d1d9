import { test } from "node:test";
import assert from "node:assert/strict";
import type { ConfigUpdate, ElectionEvent } from "../src/index.js";
import { unique, useDaemon, waitFor } from "./helpers.js";

const d = useDaemon();

test("a daemon restart: the session lives on, observe and subscribe resume without loss or repeats", async (t) => {
  const restart = d.daemon().restart;
  if (!restart) {
    t.skip("the daemon is COORDD_ENDPOINT's: not restarted");
    return;
  }
  const c = d.client();
  const name = unique("restart");
  const ns = unique("restart");
  const s = await c.session({ ttl: 10 });
  const lock = await s.lock(name);
  const lead = await s.campaign(name, "v1");

  const events: ElectionEvent[] = [];
  const stop = new AbortController();
  const observing = (async () => {
    for await (const ev of c.observe(name, { signal: stop.signal })) events.push(ev);
  })();
  const updates: ConfigUpdate[] = [];
  await c.config.put(ns, "k", "1");
  const sub = await c.config.subscribe([ns], (u) => void updates.push(u));
  await waitFor("the first event", () => events.length >= 1);

  await restart();

  await lead.proclaim("v2");
  await c.config.put(ns, "k", "2");
  await waitFor("the proclamation after the restart", () => events.some((e) => e.type === "PROCLAIMED"), 10_000);
  await waitFor("release 2 after the restart", () => updates.some((u) => u.release === 2n), 10_000);

  assert.deepEqual(events.map((e) => `${e.type}:${e.leader?.value}`), ["ELECTED:v1", "PROCLAIMED:v2"]);
  assert.deepEqual(updates.map((u) => u.release), [1n, 2n]);
  assert.deepEqual(Object.fromEntries(updates[1]!.values), { k: "2" });
  assert.equal(s.signal.aborted, false, "the session outlived the restart");
  assert.equal(lock.signal.aborted, false);
  await lock.validate(); // still the holder, on the server too
  await lead.validate();

  stop.abort();
  await observing;
  await sub.close();
  await s.close();
});
