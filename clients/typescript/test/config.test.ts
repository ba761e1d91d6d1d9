import { test } from "node:test";
import assert from "node:assert/strict";
import { CoorddError, Reason, type ConfigUpdate } from "../src/index.js";
import { unique, useDaemon, waitFor, within } from "./helpers.js";

const d = useDaemon();

const obj = (m: ReadonlyMap<string, string>) => Object.fromEntries(m);

test("publish, then the subscription delivers every release in order, complete", async () => {
  const ns = unique("app");
  const cfg = d.client().config;
  const updates: ConfigUpdate[] = [];
  const sub = await cfg.subscribe([ns], (u) => {
    updates.push(u);
  });
  // subscribe resolves after the first snapshot was delivered.
  assert.equal(updates.length, 1);
  assert.equal(updates[0]!.snapshot, true);
  assert.equal(updates[0]!.release, 0n);
  assert.equal(updates[0]!.values.size, 0);

  const r1 = await cfg.publish(ns, [
    { key: "timeout", value: "5s" },
    { key: "retries", value: "3" },
  ], { author: "test", message: "first" });
  assert.equal(r1.number, 1n);
  const r2 = await cfg.put(ns, "retries", "4");
  const r3 = await cfg.publish(ns, [
    { key: "timeout", delete: true },
    { key: "mode", value: "fast" },
  ]);
  const r4 = await cfg.delete(ns, "mode");
  assert.deepEqual([r2.number, r3.number, r4.number], [2n, 3n, 4n]);

  await waitFor("four releases", () => updates.length >= 5);
  const releases = updates.slice(1);
  assert.deepEqual(releases.map((u) => u.release), [1n, 2n, 3n, 4n]);
  assert.equal(releases.every((u) => !u.snapshot && u.namespace === ns), true);
  assert.deepEqual(releases.map((u) => obj(u.values)), [
    { timeout: "5s", retries: "3" },
    { timeout: "5s", retries: "4" },
    { retries: "4", mode: "fast" },
    { retries: "4" },
  ]);
  assert.deepEqual(releases[2]!.changes.map((c) => c.key).sort(), ["mode", "timeout"]);
  for (let i = 1; i < releases.length; i++) assert.ok(releases[i]!.revision > releases[i - 1]!.revision);
  assert.deepEqual(obj(sub.current(ns)!.values), { retries: "4" });

  const snap = await cfg.snapshot(ns);
  assert.equal(snap.release, 4n);
  assert.equal(snap.changedRevision, r4.revision);
  assert.deepEqual(obj(snap.values), { retries: "4" });
  assert.deepEqual(await cfg.get(ns, "retries"), { value: "4", modRevision: r2.revision });
  await assert.rejects(cfg.get(ns, "timeout"), (e: unknown) => CoorddError.is(e, Reason.KEY_NOT_FOUND));
  await sub.close();

  // A later subscriber starts from the snapshot: the newest complete release.
  const later: ConfigUpdate[] = [];
  const sub2 = await cfg.subscribe([ns], (u) => void later.push(u));
  assert.equal(later.length, 1);
  assert.equal(later[0]!.release, 4n);
  assert.deepEqual(obj(later[0]!.values), { retries: "4" });
  await sub2.close();
});

test("callbacks run one at a time and are awaited, in order", async () => {
  const ns = `ts-test/slow-${Date.now()}`;
  const cfg = d.client().config;
  const seen: bigint[] = [];
  let running = 0;
  let overlap = false;
  const errors: unknown[] = [];
  const sub = await cfg.subscribe([ns], async (u) => {
    if (running++ > 0) overlap = true;
    await new Promise((r) => setTimeout(r, 30));
    seen.push(u.release);
    running--;
    if (u.release === 2n) throw new Error("a failing callback does not stop the subscription");
  }, { onError: (e) => errors.push(e) });
  for (let i = 1; i <= 4; i++) await cfg.put(ns, "n", String(i));
  await waitFor("every release", () => seen.length >= 5);
  assert.deepEqual(seen, [0n, 1n, 2n, 3n, 4n]);
  assert.equal(overlap, false);
  assert.equal(errors.length, 1);
  await sub.close();
});

test("a subscription follows several namespaces", async () => {
  const [a, b] = [`ts-test/multi-a-${Date.now()}`, `ts-test/multi-b-${Date.now()}`];
  const cfg = d.client().config;
  const got: string[] = [];
  const sub = await cfg.subscribe([a, b], (u) => void got.push(`${u.namespace === a ? "a" : "b"}${u.release}`));
  assert.deepEqual(got.sort(), ["a0", "b0"]);
  await cfg.put(b, "k", "1");
  await cfg.put(a, "k", "1");
  await cfg.put(b, "k", "2");
  await waitFor("three releases", () => got.length >= 5);
  assert.deepEqual(got.slice(2), ["b1", "a1", "b2"]);
  await sub.close();
});

test("config errors carry their reasons", async () => {
  const cfg = d.client().config;
  const ns = `ts-test/errors-${Date.now()}`;
  const r = await cfg.put(ns, "k", "v");
  await assert.rejects(cfg.put(ns, "k", "w", { expectedRevision: r.revision - 1n }), (e: unknown) =>
    CoorddError.is(e, Reason.REVISION_MISMATCH));
  await assert.rejects(cfg.delete(ns, "missing"), (e: unknown) => CoorddError.is(e, Reason.KEY_NOT_FOUND));
  await assert.rejects(cfg.put("bad//ns", "k", "v"), (e: unknown) => CoorddError.is(e, Reason.INVALID_ARGUMENT));
  await assert.rejects(
    within(5000, "refused subscription", cfg.subscribe(["bad//ns"], () => {})),
    (e: unknown) => CoorddError.is(e, Reason.INVALID_ARGUMENT),
  );
});
