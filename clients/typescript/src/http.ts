// The client's HTTP plumbing, internal: the symbol under which a Client lends its request
// function to the other files of the package (kv.ts, fence.ts, locks.ts, session.ts), the
// strict reading of a 200 answer (a field missing or of another type is a DecodeError),
// and the encoding of path segments and keys.

import { Buffer } from "node:buffer";

import { DecodeError } from "./errors.js";
import { type Json, type JsonObject, parseJson, safeInteger, u64 } from "./json.js";

/** The key of a Client's request function; not exported by the package. */
export const CALL: unique symbol = Symbol("palisade.call");

/** One request as the package's files describe it. */
export interface Request {
  signal?: AbortSignal | undefined;
  json?: unknown;
  raw?: Uint8Array;
  headers?: Record<string, string>;
  /** Milliseconds on top of the client's timeout (a wait in line). */
  extraMs?: number;
  /** How a failover client may retry it (failover.ts); "read" when absent for GET. */
  retry?: Retry;
}

/** Whether a request may be sent to the next endpoint after its answer was lost:
 * "safe" (a read, a renewal, a release, a token check, a keyed write), "unlessUnknown" (an
 * acquisition, a session's creation: a grant may have happened), "write" (a fenced write
 * or barrier: safe once it carries an Idempotency-Key). */
export type Retry = "safe" | "unlessUnknown" | "write";

/** The key of a Client's stream opener (events.ts); not exported by the package. */
export const OPEN: unique symbol = Symbol("palisade.open");

/** What a Client lends the package's files. */
export interface Caller {
  [CALL](method: string, path: string, request: Request): Promise<Answer>;
  /** Opens a streamed GET over the endpoints, as a read: the 200 response with its body
   * unread (the timeout covers only the wait for its headers), or the typed error. */
  [OPEN](path: string, request: Request): Promise<Response>;
}

/** A 200 answer, read strictly: a field missing or of another type is a DecodeError. */
export class Answer {
  constructor(
    readonly status: number,
    readonly headers: Headers,
    readonly bytes: Uint8Array,
  ) {}

  text(): string {
    return new TextDecoder().decode(this.bytes);
  }

  undecodable(): DecodeError {
    return new DecodeError(this.status, this.text().slice(0, 200));
  }

  object(): JsonObject {
    let json: Json;
    try {
      json = parseJson(this.text());
    } catch {
      throw this.undecodable();
    }
    if (!(json instanceof Map)) throw this.undecodable();
    return json;
  }

  /** `fields` with every value present, or a DecodeError. */
  read<T extends object>(fields: { [K in keyof T]: T[K] | undefined }): T {
    return readFields(fields, () => this.undecodable());
  }

  /** `value` as a list of objects, each read by `read` (see {@link Answer.read}); anything
   * else is a DecodeError. */
  objects<T extends object>(value: Json | undefined, read: (o: JsonObject) => { [K in keyof T]: T[K] | undefined }): T[] {
    if (!Array.isArray(value)) throw this.undecodable();
    return value.map((item) => {
      if (!(item instanceof Map)) throw this.undecodable();
      return this.read<T>(read(item));
    });
  }
}

/** `fields` frozen with every value present, or the error `fail` makes. */
export function readFields<T extends object>(fields: { [K in keyof T]: T[K] | undefined }, fail: () => Error): T {
  for (const value of Object.values(fields)) {
    if (value === undefined) throw fail();
  }
  return Object.freeze(fields) as T;
}

export function str(value: Json | undefined): string | undefined {
  return typeof value === "string" ? value : undefined;
}

export function bool(value: Json | undefined): boolean | undefined {
  return typeof value === "boolean" ? value : undefined;
}

/** A field that may be null or absent: null then, undefined when of another type. */
export function orNull<T>(value: Json | undefined, read: (value: Json) => T | undefined): T | null | undefined {
  return value === undefined || value === null ? null : read(value);
}

export const nullableStr = (v: Json | undefined): string | null | undefined => orNull(v, str);
export const nullableU64 = (v: Json | undefined): bigint | null | undefined => orNull(v, u64);
export const nullableMs = (v: Json | undefined): number | null | undefined => orNull(v, safeInteger);

/** Standard base64 with padding (a lock value), strictly: anything else is undefined. */
export function base64(value: Json | undefined): Uint8Array | undefined {
  if (typeof value !== "string" || !/^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/.test(value)) {
    return undefined;
  }
  const bytes = Buffer.from(value, "base64");
  return bytes.toString("base64") === value ? new Uint8Array(bytes) : undefined;
}

export function toBase64(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("base64");
}

export function decimalU64(text: string): bigint | undefined {
  if (!/^(?:0|[1-9][0-9]*)$/.test(text)) return undefined;
  const n = BigInt(text);
  return n < 1n << 64n ? n : undefined;
}

export function wholeMs(what: string, ms: number): void {
  if (!Number.isSafeInteger(ms) || ms < 0) {
    throw new RangeError(`${what} must be a whole number of milliseconds, not ${ms}`);
  }
}

/** A u64 the caller gives (a revision, a sequence number), checked before it is sent. */
export function u64Arg(what: string, n: bigint): string {
  if (typeof n !== "bigint" || n < 0n || n >= 1n << 64n) throw new RangeError(`${what} must be a bigint from 0 to 2^64-1`);
  return n.toString();
}

/** Percent-encodes one path segment: every byte outside RFC 3986's unreserved set
 * (A-Z a-z 0-9 - . _ ~) becomes %XX, as the Rust and Python clients send it. */
export function encodeSegment(what: string, value: string): string {
  if (value === "." || value === "..") {
    // A URL parser removes dot segments before the request leaves: another route or key.
    throw new TypeError(`${what} ${JSON.stringify(value)} cannot be sent in a URL path`);
  }
  try {
    return encodeURIComponent(value).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
  } catch {
    throw new TypeError(`${what} ${JSON.stringify(value)} is not valid Unicode text`);
  }
}

/** A name that must be exactly one path segment (a lock name, a lease id). */
export function segment(what: string, value: string): string {
  if (value === "") throw new TypeError(`${what} must not be empty`);
  return encodeSegment(what, value);
}

/** A key keeps `/` as its separator, each part encoded on its own, so `a/b c` is sent as
 * `a/b%20c` and the server sees the key it was given. */
export function kvPath(lock: string, key: string): string {
  if (key === "") throw new TypeError("key must not be empty");
  const parts = key.split("/").map((part) => encodeSegment(`key ${JSON.stringify(key)} has a segment`, part));
  return `/v1/kv/${segment("lock name", lock)}/${parts.join("/")}`;
}

/** A query string of the defined values, or "". */
export function query(params: Record<string, string | number | undefined>): string {
  const q = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined) q.set(name, String(value));
  }
  const text = q.toString();
  return text === "" ? "" : `?${text}`;
}
