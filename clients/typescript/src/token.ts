// The offline token verifier: checks Palisade fencing tokens with the issuer's public keys
// and no call to the issuer, byte for byte by the rules of docs/token-format.md (those of
// the Rust palisade-token crate and of the Go and Python verifiers).
//
// A token is pal1.<payload>.<signature>: base64url without padding of the claims JSON
// {"l":<lock>,"e":<epoch>,"h":<holder>,"k":<key id>} and of an Ed25519 signature over the
// ASCII bytes pal1.<payload>. A Verifier checks, in the Rust verifier's order:
//
//  1. at most 4096 bytes; exactly three parts; the prefix pal1;
//  2. the payload is strict base64url (no padding, no stray bits) of UTF-8 JSON with the
//     four claims, of the right types;
//  3. a legal lock name, an epoch from 1 to 2^64-1, a holder of at most 256 bytes;
//  4. canonical form: the claims re-encoded as the issuer writes them are the payload's
//     bytes exactly;
//  5. the key id names a trusted key; the signature is 64 bytes and verifies under the
//     rules of ed25519-dalek's verify_strict: S below the group order, R and the public
//     key points of large order, and the cofactorless equation [S]B - [k]A = R (R's
//     bytes exactly), on top of @noble/curves' RFC 8032 check (zip215: false).
//     @noble/curves (audited) rather than node:crypto: node:crypto's Ed25519 offers no
//     point arithmetic, and the small-order and cofactorless checks need it.
//
// Every refusal is a TokenError: MalformedTokenError, UnknownKeyError, BadSignatureError
// or WrongLockTokenError, the classes of vectors/tokens.json. What this module does not
// do: it does not know whether an epoch is still current (a genuine token stays genuine
// forever; staleness is the resource's high-water decision), and it is not access
// control.

import { createHash } from "node:crypto";
import { ed25519 } from "@noble/curves/ed25519.js";

import { JsonNumber, parseJson, u64 } from "./json.js";

/** The version part of every token of this format. */
export const PREFIX = "pal1";
/** The longest token text accepted, in bytes. */
export const MAX_TOKEN_LEN = 4096;
/** The longest holder accepted, in bytes of UTF-8. */
export const MAX_HOLDER_LEN = 256;

const U64_MAX = (1n << 64n) - 1n;
const Point = ed25519.Point;
/** L, the order of the group Ed25519 signs in. */
const GROUP_ORDER = Point.Fn.ORDER;

/** What a token says: holder `holder` acquired lock `lock` and was given epoch `epoch`;
 * `keyId` names the key that signed it. */
export interface Claims {
  readonly lock: string;
  readonly epoch: bigint;
  readonly holder: string;
  readonly keyId: string;
}

/** The outcome classes of docs/token-format.md (and of vectors/tokens.json) for a refusal. */
export type TokenRefusal = "malformed" | "unknown_key" | "bad_signature" | "wrong_lock";

/** A token refused; `kind` is its class in docs/token-format.md. */
export abstract class TokenError extends Error {
  abstract readonly kind: TokenRefusal;
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** Not a token of this format: too long, not three parts, another prefix, not strict
 * base64url, not the canonical JSON of legal claims, a signature that is not 64 bytes. */
export class MalformedTokenError extends TokenError {
  readonly kind = "malformed";
}

/** Signed by a key this ring does not trust (never known, or retired). */
export class UnknownKeyError extends TokenError {
  readonly kind = "unknown_key";
  constructor(readonly keyId: string) {
    super(`token signed by a key not trusted: ${JSON.stringify(keyId)}`);
  }
}

/** The signature does not verify under the key the token names. */
export class BadSignatureError extends TokenError {
  readonly kind = "bad_signature";
  constructor() {
    super("token signature does not verify");
  }
}

/** A genuine token, but for `tokenLock`, not the lock `lock` it was checked for. */
export class WrongLockTokenError extends TokenError {
  readonly kind = "wrong_lock";
  constructor(
    readonly tokenLock: string,
    readonly lock: string,
  ) {
    super(`token is for lock ${JSON.stringify(tokenLock)}, not ${JSON.stringify(lock)}`);
  }
}

/** Whether `name` is a legal lock name: 1 to 128 characters from [A-Za-z0-9._-], not
 * "." or "..". */
export function validLockName(name: string): boolean {
  return /^[A-Za-z0-9._-]{1,128}$/.test(name) && name !== "." && name !== "..";
}

/** A public key's id: the first 8 bytes of its SHA-256, in lowercase hex. */
export function keyIdOf(publicKey: Uint8Array): string {
  return createHash("sha256").update(publicKey).digest("hex").slice(0, 16);
}

/** The body of `GET /v1/keys`, as the server sends it. */
export interface KeyListing {
  keys: ListedKey[];
}

/** One key of a {@link KeyListing}. */
export interface ListedKey {
  key_id: string;
  alg: string;
  /** base64url without padding, 32 bytes. */
  public_key: string;
  /** "active", "verifying" or "retired"; absent from older servers. */
  status?: string | null;
}

/** The public keys a resource trusts, by key id. */
export class KeyRing {
  readonly #keys = new Map<string, Uint8Array>();

  /** The ring `GET /v1/keys` describes: every Ed25519 key whose status is active or
   * verifying (or absent), each checked against its listed id. A retired key, or a status
   * or algorithm this version does not know, is left out: unknown fails closed. A key
   * that is not 32 bytes of base64url, not a point of large order, or listed under
   * another id throws. */
  static fromListing(listing: KeyListing): KeyRing {
    const ring = new KeyRing();
    if (listing === null || typeof listing !== "object" || !Array.isArray(listing.keys)) {
      throw new TypeError("not a key listing: no keys array");
    }
    for (const key of listing.keys) {
      if (key === null || typeof key !== "object") throw new TypeError("not a key listing: a key is not an object");
      const status = key.status;
      const trusted = status === undefined || status === null || status === "active" || status === "verifying";
      if (!trusted || key.alg !== "Ed25519") continue;
      const raw = typeof key.public_key === "string" ? decodeBase64url(key.public_key) : undefined;
      if (raw === undefined || raw.length !== 32) {
        throw new Error(`key ${JSON.stringify(key.key_id)}: not 32 bytes of base64url`);
      }
      let id: string;
      try {
        id = ring.add(raw);
      } catch (e) {
        throw new Error(`key ${JSON.stringify(key.key_id)}: ${(e as Error).message}`);
      }
      if (id !== key.key_id) {
        throw new Error(`key ${JSON.stringify(key.key_id)} is listed under the wrong id (its id is ${JSON.stringify(id)})`);
      }
    }
    return ring;
  }

  /** Trusts a 32-byte Ed25519 public key and returns its id. A key that is not the
   * canonical encoding of a point, or is of small order, throws. */
  add(publicKey: Uint8Array): string {
    if (publicKey.length !== 32) {
      throw new Error(`a public key is 32 bytes, not ${publicKey.length}`);
    }
    if (!largeOrder(publicKey)) {
      throw new Error("the public key is not a point of large order");
    }
    const key = Uint8Array.from(publicKey);
    const id = keyIdOf(key);
    this.#keys.set(id, key);
    return id;
  }

  /** Whether the key `keyId` is trusted. */
  has(keyId: string): boolean {
    return this.#keys.has(keyId);
  }

  /** How many keys are trusted. */
  get size(): number {
    return this.#keys.size;
  }

  /** The public key of `keyId`, if trusted. */
  get(keyId: string): Uint8Array | undefined {
    return this.#keys.get(keyId);
  }
}

/** Verifies tokens against a key ring, caching the tokens it verified by their whole text
 * (signature included), so that an edited token can never hit an entry made for the
 * genuine one. */
export class Verifier {
  #ring: KeyRing;
  readonly #cache = new Map<string, Claims>();
  readonly #capacity: number;

  /** Trusts `ring` and remembers up to `cacheSize` verified tokens (10,000 by default;
   * 0 verifies every time). */
  constructor(ring: KeyRing, options: { cacheSize?: number } = {}) {
    this.#ring = ring;
    this.#capacity = options.cacheSize ?? 10_000;
  }

  /** Trusts exactly `ring` from now on: tokens of a key not in it are refused from the
   * moment this returns, cached or not. */
  setKeys(ring: KeyRing): void {
    this.#ring = ring;
  }

  /** Checks `token` for the resource guarded by `lock` and returns its claims; throws a
   * {@link TokenError} when it is refused. */
  verify(token: string, lock: string): Claims {
    const claims = this.#verified(token);
    if (claims.lock !== lock) throw new WrongLockTokenError(claims.lock, lock);
    return claims;
  }

  #verified(token: string): Claims {
    const ring = this.#ring;
    const cached = this.#cache.get(token);
    if (cached !== undefined && ring.has(cached.keyId)) return cached;
    const claims = verifyWith(ring, token);
    if (this.#capacity > 0) {
      if (this.#cache.size >= this.#capacity) this.#cache.clear(); // bounded; verifying again is only slower
      this.#cache.set(token, claims);
    }
    return claims;
  }
}

function malformed(why: string): MalformedTokenError {
  return new MalformedTokenError(`malformed token: ${why}`);
}

function verifyWith(ring: KeyRing, token: string): Claims {
  if (Buffer.byteLength(token, "utf8") > MAX_TOKEN_LEN) throw malformed("token too long");
  const parts = token.split(".");
  if (parts.length !== 3) throw malformed("expected pal1.<payload>.<signature>");
  const [prefix, payloadText, signatureText] = parts as [string, string, string];
  if (prefix !== PREFIX) throw malformed("unknown token version");
  const payload = decodeBase64url(payloadText);
  if (payload === undefined) throw malformed("payload is not base64url without padding");
  const claims = parseClaims(payload);
  if (!bytesEqual(canonicalPayload(claims), payload)) throw malformed("payload is not in canonical form");
  const publicKey = ring.get(claims.keyId);
  if (publicKey === undefined) throw new UnknownKeyError(claims.keyId);
  const signature = decodeBase64url(signatureText);
  if (signature === undefined) throw malformed("signature is not base64url without padding");
  if (signature.length !== 64) throw malformed("signature has the wrong length");
  const signed = Buffer.from(`${prefix}.${payloadText}`, "ascii");
  if (!verifyStrict(publicKey, signed, signature)) throw new BadSignatureError();
  return claims;
}

/** Reads the four claims and checks their shape. Spelling (order, white space, escapes,
 * extra or repeated fields) is left to the canonical check. */
function parseClaims(payload: Uint8Array): Claims {
  let text: string;
  try {
    // ignoreBOM keeps a byte-order mark in the text, for the canonical check to refuse.
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(payload);
  } catch {
    throw malformed("payload is not UTF-8");
  }
  let json;
  try {
    json = parseJson(text);
  } catch {
    throw malformed("payload is not the JSON of the claims");
  }
  if (!(json instanceof Map)) throw malformed("payload is not the JSON of the claims");
  const l = json.get("l");
  const e = json.get("e");
  const h = json.get("h");
  const k = json.get("k");
  if (typeof l !== "string" || typeof h !== "string" || typeof k !== "string" || !(e instanceof JsonNumber)) {
    throw malformed("a claim is missing or of the wrong type");
  }
  const epoch = u64(e);
  if (epoch === undefined || epoch === 0n) throw malformed("the epoch is not an integer from 1 to 2^64-1");
  if (!validLockName(l)) throw malformed("illegal lock name");
  if (Buffer.byteLength(h, "utf8") > MAX_HOLDER_LEN) throw malformed("holder longer than 256 bytes");
  return Object.freeze({ lock: l, epoch, holder: h, keyId: k });
}

/** The payload the issuer writes for `claims`: {"l":…,"e":…,"h":…,"k":…} with no white
 * space, strings escaped exactly as docs/token-format.md says, in UTF-8. */
export function canonicalPayload(claims: Claims): Uint8Array {
  if (claims.epoch < 1n || claims.epoch > U64_MAX) throw new RangeError("the epoch is not from 1 to 2^64-1");
  const text =
    `{"l":${canonicalString(claims.lock)},"e":${claims.epoch.toString()},` +
    `"h":${canonicalString(claims.holder)},"k":${canonicalString(claims.keyId)}}`;
  return new TextEncoder().encode(text);
}

const SHORT_ESCAPES: Record<number, string> = {
  0x22: '\\"',
  0x5c: "\\\\",
  0x08: "\\b",
  0x09: "\\t",
  0x0a: "\\n",
  0x0c: "\\f",
  0x0d: "\\r",
};

function canonicalString(s: string): string {
  let out = '"';
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    const short = SHORT_ESCAPES[c];
    if (short !== undefined) out += short;
    else if (c < 0x20) out += `\\u00${c.toString(16).padStart(2, "0")}`;
    else out += s[i];
  }
  return out + '"';
}

/** Strict base64url without padding: only [A-Za-z0-9_-], and no stray bits in the last
 * character (the decoded bytes encode back to the same text). Undefined if not. */
function decodeBase64url(text: string): Uint8Array | undefined {
  if (!/^[A-Za-z0-9_-]*$/.test(text)) return undefined;
  const bytes = Buffer.from(text, "base64url");
  if (bytes.toString("base64url") !== text) return undefined;
  return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.length);
}

/** Whether `encoded` is the canonical encoding of a point whose multiple by the cofactor
 * is not the identity: what verify_strict requires of the public key and of R. */
function largeOrder(encoded: Uint8Array): boolean {
  try {
    return !Point.fromBytes(encoded, false).isSmallOrder();
  } catch {
    return false; // not a point, or not its canonical encoding
  }
}

/** Ed25519 verification under ed25519-dalek's verify_strict rules. */
function verifyStrict(publicKey: Uint8Array, message: Uint8Array, signature: Uint8Array): boolean {
  const rBytes = signature.subarray(0, 32);
  const s = bytesToBigIntLE(signature.subarray(32, 64));
  if (s >= GROUP_ORDER) return false; // a non-canonical S
  if (!largeOrder(rBytes) || !largeOrder(publicKey)) return false; // small-order R or key
  // RFC 8032's check with canonical encodings (noble's equation is the cofactored one).
  if (!ed25519.verify(signature, message, publicKey, { zip215: false })) return false;
  // The cofactorless equation, as verify_strict and Go's crypto/ed25519 check it: a
  // torsion component in R or the key fails here though the cofactored check passed.
  const k = bytesToBigIntLE(createHash("sha512").update(rBytes).update(publicKey).update(message).digest()) % GROUP_ORDER;
  const A = Point.fromBytes(publicKey, false);
  const expectedR = Point.BASE.multiplyUnsafe(s).subtract(A.multiplyUnsafe(k));
  return bytesEqual(expectedR.toBytes(), rBytes);
}

function bytesToBigIntLE(bytes: Uint8Array): bigint {
  return BigInt("0x" + (Buffer.from(bytes).reverse().toString("hex") || "0"));
}

function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && Buffer.compare(a, b) === 0;
}
