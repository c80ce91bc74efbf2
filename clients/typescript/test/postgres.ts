// Test helper: a throwaway PostgreSQL cluster, as clients/go/internal/testpg does it:
// initdb in a temp dir under /tmp, the server on a free loopback port (no Unix socket,
// fsync on), ready once it answers a query, stopped by its pid (SIGINT, PostgreSQL's fast
// shutdown) and its dir removed by stop(). PostgreSQL refuses to run as root, so as root
// the cluster belongs to nobody: initdb and postgres run through setpriv. The binaries
// are PALISADE_PG_BIN's, or the newest /usr/lib/postgresql/N/bin's; none found is a
// failure, never a skip.

import { type ChildProcess, execFile, spawn } from "node:child_process";
import { chownSync, closeSync, existsSync, openSync, readFileSync, readdirSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { join } from "node:path";
import { after, before } from "node:test";
import { setTimeout as delay } from "node:timers/promises";
import { promisify } from "node:util";
import pg from "pg";

const run = promisify(execFile);

/** A running cluster: user postgres, trust authentication, database postgres. */
export interface Cluster {
  readonly port: number;
  /** The libpq conninfo of database `postgres`, plus `extra` ("options=-csearch_path=x"). */
  conninfo(extra?: string): string;
  /** pg's connection settings for database `postgres`. */
  config(): pg.ClientConfig;
  /** Stops the server (by its pid) and removes its directory. */
  stop(): Promise<void>;
}

/** The directory of initdb and postgres. */
function binDir(): string {
  const fromEnv = process.env.PALISADE_PG_BIN;
  if (fromEnv !== undefined && fromEnv !== "") return fromEnv;
  const root = "/usr/lib/postgresql";
  const versions = existsSync(root)
    ? readdirSync(root)
        .filter((v) => /^[0-9]+$/.test(v) && existsSync(join(root, v, "bin", "postgres")))
        .sort((a, b) => Number(b) - Number(a))
    : [];
  if (versions.length === 0) {
    throw new Error("PostgreSQL server binaries (initdb, postgres) not found: set PALISADE_PG_BIN, or run scripts/adapter-services");
  }
  return join(root, versions[0]!, "bin");
}

/** uid and gid of nobody:nogroup, from /etc/passwd and /etc/group. */
function nobody(): { uid: number; gid: number } {
  const field = (file: string, name: string): number => {
    const line = readFileSync(file, "utf8")
      .split("\n")
      .find((l) => l.startsWith(`${name}:`));
    if (line === undefined) throw new Error(`${name} is not in ${file}: cannot run PostgreSQL as root`);
    return Number(line.split(":")[2]);
  };
  return { uid: field("/etc/passwd", "nobody"), gid: field("/etc/group", "nogroup") };
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve, reject) => server.once("error", reject).listen(0, "127.0.0.1", resolve));
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (address === null || typeof address === "string") throw new Error("no port");
  return address.port;
}

/** One cluster for the calling test file: started before its tests, stopped after them.
 * The returned function gives it to a test (and throws outside the tests). */
export function fileCluster(): () => Cluster {
  let cluster: Cluster | undefined;
  before(async () => {
    cluster = await startCluster();
  });
  after(async () => {
    await cluster?.stop();
  });
  return () => {
    if (cluster === undefined) throw new Error("the file's PostgreSQL cluster is not running");
    return cluster;
  };
}

let schemas = 0;

/** A schema name no other test of this process has: `prefix`, the pid, a counter. */
export function schemaName(prefix: string): string {
  return `${prefix}_${process.pid}_${++schemas}`;
}

/** Starts a cluster; call stop() when done. */
export async function startCluster(): Promise<Cluster> {
  const bin = binDir();
  const dir = await mkdtemp("/tmp/palisade-pg-");
  const asRoot = process.getuid?.() === 0;
  if (asRoot) {
    const { uid, gid } = nobody();
    chownSync(dir, uid, gid);
  }
  // As root: setpriv execs the program as nobody, so the pid is the program's own.
  const command = (program: string, args: string[]): [string, string[]] =>
    asRoot
      ? ["setpriv", ["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", join(bin, program), ...args]]
      : [join(bin, program), args];
  const env = { ...process.env, LC_ALL: "C" };
  const data = join(dir, "data");
  try {
    await run(...command("initdb", ["-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"]), { cwd: dir, env });
  } catch (err) {
    await rm(dir, { recursive: true, force: true });
    const e = err as { stdout?: string; stderr?: string };
    throw new Error(`initdb failed: ${String(err)}\n${e.stdout ?? ""}${e.stderr ?? ""}`);
  }
  const port = await freePort();
  const logPath = join(dir, "server.log");
  const log = openSync(logPath, "a");
  const [program, args] = command("postgres", [
    "-D", data, "-p", String(port), "-h", "127.0.0.1",
    "-c", "unix_socket_directories=", "-c", "fsync=on", "-c", "max_connections=100",
  ]);
  const server: ChildProcess = spawn(program, args, { cwd: dir, env, stdio: ["ignore", log, log] });
  closeSync(log);
  const exited = new Promise<void>((resolve) => server.once("exit", () => resolve()));
  const logText = (): string => (existsSync(logPath) ? readFileSync(logPath, "utf8") : "");

  const stop = async (): Promise<void> => {
    if (server.exitCode === null && server.signalCode === null && server.pid !== undefined) {
      process.kill(server.pid, "SIGINT"); // PostgreSQL's fast shutdown
      const timer = setTimeout(() => server.pid !== undefined && process.kill(server.pid, "SIGKILL"), 15_000);
      await exited;
      clearTimeout(timer);
    }
    await rm(dir, { recursive: true, force: true });
  };
  const config = (): pg.ClientConfig => ({ host: "127.0.0.1", port, user: "postgres", database: "postgres" });

  const deadline = Date.now() + 60_000;
  for (;;) {
    if (server.exitCode !== null || server.signalCode !== null) {
      const text = logText();
      await stop();
      throw new Error(`postgres exited:\n${text}`);
    }
    const probe = new pg.Client(config());
    probe.on("error", () => {});
    try {
      await probe.connect();
      await probe.query("SELECT 1");
      await probe.end();
      break;
    } catch {
      await probe.end().catch(() => {});
    }
    if (Date.now() > deadline) {
      const text = logText();
      await stop();
      throw new Error(`postgres not ready within 60 s:\n${text}`);
    }
    await delay(50);
  }
  return {
    port,
    conninfo: (extra = "") => `host=127.0.0.1 port=${port} user=postgres dbname=postgres${extra === "" ? "" : ` ${extra}`}`,
    config,
    stop,
  };
}
