import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { Client, Code, CoorddError, Reason } from "../src/index.js";
import { ErrorReason } from "../src/gen/coordd/v1/errors_pb.js";
import { Conn } from "../src/conn.js";
import { rawClients, unique, useDaemon, within } from "./helpers.js";

const d = useDaemon();

/** A loopback port nobody listens on. */
async function deadPort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const port = (srv.address() as { port: number }).port;
  await new Promise((r) => srv.close(r));
  return port;
}

test("Reason lists every reason of errors.proto", () => {
  const names = Object.keys(ErrorReason).filter((k) => Number.isNaN(Number(k)) && k !== "UNSPECIFIED");
  assert.ok(names.length >= 29);
  for (const n of names) assert.equal((Reason as Record<string, string>)[n], n);
  assert.equal(Reason.STALE_TOKEN, "STALE_TOKEN");
});

test("an invalid name fails with INVALID_ARGUMENT, code and message from the server", async () => {
  const s = await d.client().session();
  const err = await s.lock("bad//name").then(
    () => assert.fail("a bad name was accepted"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof CoorddError);
  assert.equal(err.reason, Reason.INVALID_ARGUMENT);
  assert.equal(err.code, Code.InvalidArgument);
  assert.match(err.message, /name/);
  await assert.rejects(s.campaign("/x", "v"), (e: unknown) => CoorddError.is(e, Reason.INVALID_ARGUMENT));
  await s.close();
});

test("an invalid TTL fails with INVALID_ARGUMENT", async () => {
  await assert.rejects(d.client().session({ ttl: 0.5 }), (e: unknown) => CoorddError.is(e, Reason.INVALID_ARGUMENT));
});

test("a session closed from outside: calls fail with SESSION_NOT_FOUND, and the keep-alive loses it", async () => {
  const s = await d.client().session({ ttl: 2 });
  const raw = rawClients(d.endpoint());
  try {
    await raw.sessions.closeSession({ sessionId: s.id }); // as an admin would
  } finally {
    raw.close();
  }
  const lost = new Promise<CoorddError>((resolve) => s.onLost(resolve));
  // A lock may race the keep-alive: the server's answer or the lost session's.
  await assert.rejects(s.lock(unique("gone")), (e: unknown) => CoorddError.is(e, Reason.SESSION_NOT_FOUND));
  const err = await within(s.ttlMs, "the keep-alive notices", lost);
  assert.equal(err.reason, Reason.SESSION_NOT_FOUND);
  assert.equal(s.signal.aborted, true);
  await s.close(); // gone already: still resolves
});

test("closing a session twice, or after the client, is harmless", async () => {
  const c = new Client({ endpoints: [d.endpoint()] });
  const s = await c.session();
  await s.close();
  await s.close();
  await c.close();
  await c.close();
  assert.equal(s.error?.reason, Reason.SESSION_CLOSED);
});

test("an unreachable endpoint fails with UNAVAILABLE; the client moves to the next one", async () => {
  const dead = `127.0.0.1:${await deadPort()}`;
  const alone = new Client({ endpoints: [dead], callTimeoutMs: 1000 });
  await assert.rejects(alone.leader("x"), (e: unknown) => CoorddError.is(e, Reason.UNAVAILABLE));
  await alone.close();

  const c = new Client({ endpoints: [dead, d.endpoint()] });
  try {
    // Reads are retried on the next endpoint.
    assert.equal(await c.leader(unique("failover")), undefined);
    // And later calls go there at once.
    const s = await c.session();
    const l = await s.lock(unique("failover"));
    await l.release();
    await s.close();
  } finally {
    await c.close();
  }
});

test("calls after close fail with CLIENT_CLOSED", async () => {
  const c = new Client({ endpoints: [d.endpoint()] });
  const s = await c.session();
  await c.close();
  assert.equal(s.error?.reason, Reason.SESSION_CLOSED);
  await assert.rejects(c.leader("x"), (e: unknown) => CoorddError.is(e, Reason.CLIENT_CLOSED));
  await assert.rejects(c.session(), (e: unknown) => CoorddError.is(e, Reason.CLIENT_CLOSED));
});

test("a bearer token is refused in plaintext to a non-loopback host, allowed over TLS and to loopback", async () => {
  for (const ep of ["db.example.com:7420", "10.0.0.5:7420", "http://coordd.prod.svc:7420"]) {
    assert.throws(
      () => new Client({ endpoints: ["127.0.0.1:7420", ep], token: "secret" }),
      (e: unknown) => CoorddError.is(e, Reason.INVALID_ARGUMENT) && /only over TLS/.test((e as Error).message) && (e as Error).message.includes(ep),
    );
  }
  for (const opts of [
    { endpoints: ["127.0.0.1:7420", "localhost:7420", "[::1]:7420"], token: "secret" },
    { endpoints: ["db.example.com:7420"], token: "secret", tls: {} },
    { endpoints: ["https://db.example.com:7420"], token: "secret" },
    { endpoints: ["db.example.com:7420"] },
  ]) {
    const c = new Client(opts);
    await c.close();
  }
});

test("a client that meets a member of a second cluster refuses it, and every call after", async (t) => {
  const other = process.env.COORDD_OTHER_ENDPOINT;
  if (!other) {
    t.skip("needs a second daemon (COORDD_OTHER_ENDPOINT)");
    return;
  }
  const conn = new Conn({ endpoints: [d.endpoint(), other] });
  try {
    const describe = () => conn.call((s, o) => s.locks.describeLock({ name: unique("two-clusters") }, o));
    await describe(); // the first cluster, noted
    conn.failover(conn.pick()); // as after a fail-over
    for (let i = 0; i < 2; i++) {
      await assert.rejects(describe(), (e: unknown) => e instanceof CoorddError && e.reason === "INVALID_ARGUMENT" && /two clusters/.test(e.message));
    }
  } finally {
    await conn.close();
  }
});
