// Tests of TLS with a deployment's own CA (src/tls.ts): a throwaway CA and a server
// certificate made by openssl in the test, a real `palisade serve --tls-cert --tls-key`,
// trusted through `ca` (PEM text) and `caFile`, and refused without them.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";

import { Agent, fetch as undiciFetch } from "undici";

import { Client, PalisadeError } from "../src/index.js";
import { startServer } from "./server.js";

const run = promisify(execFile);

test("a server with a certificate of the deployment's own CA: trusted through ca or caFile only", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "palisade-ts-tls-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const openssl = (...args: string[]) => run("openssl", args, { cwd: dir });
  await openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
    "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem");
  await openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
    "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr");
  await writeFile(join(dir, "ext.cnf"), "subjectAltName=IP:127.0.0.1\n");
  await openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
    "-days", "2", "-extfile", "ext.cnf", "-out", "server.pem");
  const ca = await readFile(join(dir, "ca.pem"), "utf8");
  const agent = new Agent({ connect: { ca } });
  t.after(() => agent.close());
  const url = await startServer(t, {
    args: ["--tls-cert", join(dir, "server.pem"), "--tls-key", join(dir, "server.key")],
    healthFetch: (u) => undiciFetch(u, { dispatcher: agent }),
  });
  assert.ok(url.startsWith("https://"), url);

  const trusting = new Client(url, { ca });
  const lease = await trusting.acquire("orders", { holder: "a", ttlMs: 10_000 });
  assert.equal((await trusting.lockStatus("orders")).holder, "a");
  const fromFile = new Client(url, { caFile: join(dir, "ca.pem") });
  assert.equal((await fromFile.lockStatus("orders")).holder, "a");
  await fromFile.release(lease.leaseId);

  const stranger = new Client(url);
  await assert.rejects(stranger.lockStatus("orders"), (err) => {
    assert.ok(!(err instanceof PalisadeError), String(err));
    assert.ok(err instanceof TypeError); // fetch failed: the certificate is not trusted
    return true;
  });
  assert.throws(() => new Client(url, { ca: "not a certificate" }), TypeError);
});
