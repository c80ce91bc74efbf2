// Test helpers: a real `palisade serve` (the binary PALISADE_BIN names; unset is a test
// failure, never a skip) on a free loopback port in a temp dir, ready once its health
// answers, stopped by its pid when the test ends; and the repository's vectors/ files.

import { spawn } from "node:child_process";
import { closeSync, existsSync, openSync, readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { fileURLToPath } from "node:url";
import { setTimeout as delay } from "node:timers/promises";

/** The repository's root (this file runs as clients/typescript/dist/test/server.js). */
export const REPO = fileURLToPath(new URL("../../../../", import.meta.url));
/** The package's own directory, clients/typescript. */
export const PACKAGE = fileURLToPath(new URL("../../", import.meta.url));

/** A file of the repository's vectors/ directory, as text. */
export function vectorsFile(name: string): string {
  return readFileSync(join(REPO, "vectors", name), "utf8");
}

const LISTENING = "palisade listening on ";

/** A running `palisade serve`. */
export interface Node {
  /** Its base URL (http or https). */
  readonly url: string;
  /** Its temp dir (its data dir is `${dir}/data`). */
  readonly dir: string;
  /** Kills it (SIGKILL, by pid) and waits for its exit: a crash. */
  kill(): Promise<void>;
}

/** What a node is started with. */
export interface NodeOptions {
  /** More arguments to `palisade serve`. */
  args?: string[];
  /** The temp dir of an earlier node, to start again on its data. */
  dir?: string;
  /** The address to listen on (an earlier node's, to restart on its port). */
  listen?: string;
  /** The fetch that polls its health (one that trusts its CA, for TLS). */
  healthFetch?: (url: string) => Promise<Response>;
}

/** Starts `palisade serve --listen 127.0.0.1:0 --data-dir <temp>/data`, learns its URL from
 * its start-up line, polls GET /healthz until it answers ok, and stops it (SIGKILL, by
 * pid) and removes the temp dir when the test `t` ends. Returns the server's URL. */
export async function startServer(t: TestContext, options: NodeOptions = {}): Promise<string> {
  return (await startNode(t, options)).url;
}

/** Starts a node as startServer does, with a handle to kill it and start it again. The
 * temp dir is removed when the test ends (after every node on it was stopped). */
export async function startNode(t: TestContext, options: NodeOptions = {}): Promise<Node> {
  const bin = process.env.PALISADE_BIN;
  if (bin === undefined || bin === "") {
    throw new Error("PALISADE_BIN is not set: run scripts/ts-test, which builds the server and sets it");
  }
  if (!existsSync(bin)) throw new Error(`PALISADE_BIN names ${bin}, which does not exist: build it (scripts/ts-test)`);
  const dir = options.dir ?? (await mkdtemp(join(tmpdir(), "palisade-ts-")));
  const logPath = join(dir, "server.log");
  const log = openSync(logPath, "a");
  const args = ["serve", "--listen", options.listen ?? "127.0.0.1:0", "--data-dir", join(dir, "data"), ...(options.args ?? [])];
  const child = spawn(bin, args, { stdio: ["ignore", "pipe", log] });
  closeSync(log);
  const stdout = child.stdout!;
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const kill = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null && child.pid !== undefined) {
      process.kill(child.pid, "SIGKILL");
    }
    await exited;
  };
  t.after(async () => {
    await kill();
    if (options.dir === undefined) await rm(dir, { recursive: true, force: true });
  });
  const logText = (): string => (existsSync(logPath) ? readFileSync(logPath, "utf8") : "");

  const line = await new Promise<string>((resolve, reject) => {
    let seen = "";
    const finish = (outcome: () => void): void => {
      clearTimeout(timer);
      stdout.off("data", onData);
      child.off("exit", onExit);
      outcome();
    };
    const onData = (chunk: Buffer): void => {
      seen += chunk.toString("utf8");
      const end = seen.indexOf("\n");
      if (end >= 0) finish(() => resolve(seen.slice(0, end).trim()));
    };
    const onExit = (code: number | null, signal: string | null): void =>
      finish(() => reject(new Error(`palisade exited (${code ?? signal}) before its start-up line:\n${logText()}`)));
    const timer = setTimeout(() => finish(() => reject(new Error(`no start-up line within 60 s:\n${logText()}`))), 60_000);
    stdout.on("data", onData);
    child.once("exit", onExit);
  });
  stdout.resume(); // the rest of stdout is not read
  if (!line.startsWith(LISTENING)) throw new Error(`unexpected start-up line ${JSON.stringify(line)}`);
  const url = line.slice(LISTENING.length).split(",")[0]!.trim();

  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      const health = await (options.healthFetch ?? fetch)(`${url}/healthz`);
      if (health.status === 200 && ((await health.json()) as { status?: string }).status === "ok") return { url, dir, kill };
    } catch {
      // not answering yet
    }
    if (child.exitCode !== null || child.signalCode !== null) throw new Error(`palisade exited:\n${logText()}`);
    if (Date.now() > deadline) throw new Error(`GET /healthz not ok within 30 s:\n${logText()}`);
    await delay(20);
  }
}
