import { test } from "node:test";
import assert from "node:assert/strict";
import { CoorddError, Reason } from "../src/index.js";
import { unique, useDaemon } from "./helpers.js";

const d = useDaemon();

const timedOut = (e: unknown) => e instanceof CoorddError && e.reason === Reason.DEADLINE_EXCEEDED;

test("a barrier opens when count are in, and leave waits for all", async () => {
  const name = unique("barrier");
  const sessions = await Promise.all([0, 1, 2].map(() => d.client().session()));
  const barriers = await Promise.all(sessions.map((s) => s.enterBarrier(name, 3, { timeoutMs: 10_000 })));
  assert.deepEqual(barriers.map((b) => b.participants), [3, 3, 3]);
  await Promise.all(barriers.map((b) => b.leave({ timeoutMs: 10_000 })));
  for (const s of sessions) await s.close();
});

test("a wait that times out leaves no participant behind", async () => {
  const name = unique("barrier");
  const a = await d.client().session();
  const b = await d.client().session();
  await assert.rejects(a.enterBarrier(name, 2, { timeoutMs: 200 }), timedOut);
  // Had the first stayed in, this would open with 2 at once.
  await assert.rejects(b.enterBarrier(name, 2, { timeoutMs: 200 }), timedOut);
  await a.close();
  await b.close();
});
