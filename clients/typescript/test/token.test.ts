// Tests of the offline token verifier (src/token.ts): every vector of vectors/tokens.json,
// the key listing, the cache against a replaced ring, the canonical escapes, and each of
// verify_strict's rules shown to matter with a signature that passes the others.

import assert from "node:assert/strict";
import { createHash, generateKeyPairSync, randomBytes, sign } from "node:crypto";
import { test } from "node:test";
import { ed25519 } from "@noble/curves/ed25519.js";

import {
  BadSignatureError,
  type Claims,
  KeyRing,
  MalformedTokenError,
  PREFIX,
  TokenError,
  UnknownKeyError,
  Verifier,
  WrongLockTokenError,
  canonicalPayload,
  keyIdOf,
} from "../src/token.js";
import { vectorsFile } from "./server.js";

interface VectorFile {
  classes: string[];
  keys: { key_id: string; public_key: string; trusted: boolean }[];
  vectors: {
    name: string;
    token: string;
    lock: string;
    expect: string;
    claims?: { lock: string; epoch: string; holder: string; key_id: string };
  }[];
}

// The outcome classes of docs/token-format.md, and the error each refusal must be.
const CLASSES: Record<string, (new (...args: never[]) => TokenError) | null> = {
  valid: null,
  malformed: MalformedTokenError,
  unknown_key: UnknownKeyError,
  bad_signature: BadSignatureError,
  wrong_lock: WrongLockTokenError,
};

test("every vector of vectors/tokens.json has its outcome, and a valid one its claims", () => {
  // Epochs reach 2^64-1: quoted before JSON.parse, so that they are read exactly.
  const file = JSON.parse(vectorsFile("tokens.json").replace(/"epoch": ([0-9]+)/g, '"epoch": "$1"')) as VectorFile;
  for (const cls of file.classes) assert.ok(cls in CLASSES, `a class this verifier does not know: ${cls}`);
  assert.ok(file.vectors.length >= 20, `only ${file.vectors.length} vectors`);
  const ring = KeyRing.fromListing({
    keys: file.keys.map((k) => ({ key_id: k.key_id, alg: "Ed25519", public_key: k.public_key, status: k.trusted ? "active" : "retired" })),
  });
  assert.equal(ring.size, file.keys.filter((k) => k.trusted).length);
  const verifier = new Verifier(ring, { cacheSize: 16 });
  const failures: string[] = [];
  const seen = new Set<string>();
  for (const v of file.vectors) {
    assert.ok(v.expect in CLASSES, `${v.name}: a class this verifier does not know: ${v.expect}`);
    seen.add(v.expect);
    const want = CLASSES[v.expect]!; // known: checked above
    // Twice: the second answer may come from the cache and must be the same.
    for (const round of ["first", "cached"]) {
      try {
        const claims = verifier.verify(v.token, v.lock);
        if (want !== null) {
          failures.push(`${v.name} (${round}): accepted, want ${v.expect}`);
          continue;
        }
        const c = v.claims!;
        const expected: Claims = { lock: c.lock, epoch: BigInt(c.epoch), holder: c.holder, keyId: c.key_id };
        if (JSON.stringify(claims, bigints) !== JSON.stringify(expected, bigints)) {
          failures.push(`${v.name} (${round}): claims ${JSON.stringify(claims, bigints)}, want ${JSON.stringify(expected, bigints)}`);
        }
      } catch (err) {
        if (want === null || !(err instanceof want) || (err).kind !== v.expect) {
          failures.push(`${v.name} (${round}): ${String(err)}, want ${v.expect}`);
        }
      }
    }
  }
  assert.deepEqual(failures, []);
  assert.deepEqual([...seen].sort(), [...file.classes].sort(), "every class has a vector");
});

test("a key listing trusts active and verifying keys, and refuses a key under the wrong id", () => {
  const [a, b, c] = [newKey(), newKey(), newKey()];
  const ring = KeyRing.fromListing({
    keys: [
      { key_id: a.id, alg: "Ed25519", public_key: b64(a.publicKey), status: "active" },
      { key_id: b.id, alg: "Ed25519", public_key: b64(b.publicKey), status: "verifying" },
      { key_id: c.id, alg: "Ed25519", public_key: b64(c.publicKey), status: "retired" },
      { key_id: "x", alg: "Ed448", public_key: "AAAA", status: "active" },
      { key_id: "y", alg: "Ed25519", public_key: "AAAA", status: "someday" },
    ],
  });
  assert.deepEqual([ring.has(a.id), ring.has(b.id), ring.has(c.id), ring.size], [true, true, false, 2]);
  assert.ok(KeyRing.fromListing({ keys: [{ key_id: a.id, alg: "Ed25519", public_key: b64(a.publicKey) }] }).has(a.id));
  assert.throws(
    () => KeyRing.fromListing({ keys: [{ key_id: b.id, alg: "Ed25519", public_key: b64(a.publicKey), status: "active" }] }),
    /listed under the wrong id/,
  );
  assert.throws(
    () => KeyRing.fromListing({ keys: [{ key_id: a.id, alg: "Ed25519", public_key: b64(a.publicKey) + "A", status: "active" }] }),
    /not 32 bytes of base64url/,
  );
});

test("a token of a key the ring no longer trusts is refused, cached or not", () => {
  const key = newKey();
  const ring = new KeyRing();
  assert.equal(ring.add(key.publicKey), key.id);
  const token = key.sign({ lock: "orders", epoch: 3n, holder: "w", keyId: key.id });
  const verifier = new Verifier(ring, { cacheSize: 8 });
  assert.equal(verifier.verify(token, "orders").epoch, 3n);
  assert.throws(() => verifier.verify(token, "invoices"), WrongLockTokenError);
  verifier.setKeys(new KeyRing());
  assert.throws(() => verifier.verify(token, "orders"), UnknownKeyError);
});

test("the canonical payload escapes exactly as the token format says", () => {
  const got = Buffer.from(
    canonicalPayload({ lock: "a", epoch: 18446744073709551615n, holder: '"\\\b\t\n\f\r\x01\x1f/\x7fé', keyId: "k" }),
  ).toString("utf8");
  assert.equal(got, '{"l":"a","e":18446744073709551615,"h":"\\"\\\\\\b\\t\\n\\f\\r\\u0001\\u001f/\x7fé","k":"k"}');
  assert.throws(() => canonicalPayload({ lock: "a", epoch: 1n << 64n, holder: "", keyId: "k" }), RangeError);
});

test("base64url with stray bits in its last character is refused", () => {
  const key = newKey();
  const ring = new KeyRing();
  ring.add(key.publicKey);
  const token = key.sign({ lock: "orders", epoch: 1n, holder: "w", keyId: key.id });
  const verifier = new Verifier(ring, { cacheSize: 0 });
  verifier.verify(token, "orders");
  // The signature's 86 characters carry 512 bits and 4 spare ones, all zero in its text.
  const last = token.at(-1)!;
  const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  const strayed = token.slice(0, -1) + alphabet[alphabet.indexOf(last) + 1];
  assert.throws(() => verifier.verify(strayed, "orders"), MalformedTokenError);
});

// verify_strict's rules, each shown to matter: the token in each case passes the other
// checks (@noble/curves' RFC 8032 check with zip215: false accepts it), and is refused.

const Point = ed25519.Point;
const L = Point.Fn.ORDER;
// A point of order 8 (the torsion subgroup), from the canonical list of small-order points.
const T8 = Point.fromBytes(Buffer.from("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a", "hex"));

test("the torsion point used below is of order 8", () => {
  assert.ok(T8.isSmallOrder() && !T8.multiplyUnsafe(4n).is0() && T8.multiplyUnsafe(8n).is0());
});

test("small-order and non-canonical public keys are refused by the ring", () => {
  const identity = new Uint8Array(32);
  identity[0] = 1; // y = 1
  assert.throws(() => new KeyRing().add(identity), /large order/);
  assert.throws(() => new KeyRing().add(T8.toBytes()), /large order/);
  // y = 2 is not on the curve.
  const notAPoint = new Uint8Array(32);
  notAPoint[0] = 2;
  assert.throws(() => new KeyRing().add(notAPoint), /large order/);
  // y = 3 + p: a point of large order, but not its canonical encoding (RFC 8032 refuses it).
  const nonCanonical = le32(3n + (1n << 255n) - 19n);
  assert.ok(!Point.fromBytes(nonCanonical, true).isSmallOrder());
  assert.throws(() => new KeyRing().add(nonCanonical), /large order/);
});

test("a signature with a small-order R is refused though both equations hold", () => {
  const a = scalar();
  const A = Point.BASE.multiplyUnsafe(a).toBytes();
  // R = the identity and S = k·a: [S]B - [k]A = R exactly.
  const token = tokenSignedBy(A, (signed) => {
    const R = Point.ZERO.toBytes();
    const k = challenge(R, A, signed);
    return { R, s: (k * a) % L };
  });
  assertRefusedThoughNobleAccepts(A, token);
});

test("a signature whose R has a torsion component is refused (the cofactorless equation)", () => {
  const a = scalar();
  const A = Point.BASE.multiplyUnsafe(a).toBytes();
  const token = tokenSignedBy(A, (signed) => {
    const r = scalar();
    const R = Point.BASE.multiplyUnsafe(r).add(T8).toBytes(); // of large order, plus torsion
    const k = challenge(R, A, signed);
    return { R, s: (r + k * a) % L };
  });
  assertRefusedThoughNobleAccepts(A, token);
});

test("a public key with a torsion component verifies only what the cofactorless equation accepts", () => {
  const a = scalar();
  const A = Point.BASE.multiplyUnsafe(a).add(T8).toBytes(); // not small order: the ring takes it
  let k = 0n;
  let holder = 0;
  let token = "";
  // [S]B - [k]A = R - [k]T8, which is R only when 8 divides k: pick a holder for which it does not.
  do {
    token = tokenSignedBy(
      A,
      (signed) => {
        const r = scalar();
        const R = Point.BASE.multiplyUnsafe(r).toBytes();
        k = challenge(R, A, signed);
        return { R, s: (r + k * a) % L };
      },
      `w${holder++}`,
    );
  } while (k % 8n === 0n);
  assertRefusedThoughNobleAccepts(A, token);
});

test("a non-canonical S (S + L) is refused", () => {
  const a = scalar();
  const A = Point.BASE.multiplyUnsafe(a).toBytes();
  const honest = (signed: Uint8Array): { R: Uint8Array; s: bigint } => {
    const r = scalar();
    const R = Point.BASE.multiplyUnsafe(r).toBytes();
    return { R, s: (r + challenge(R, A, signed) * a) % L };
  };
  const ring = new KeyRing();
  ring.add(A);
  const verifier = new Verifier(ring, { cacheSize: 0 });
  verifier.verify(tokenSignedBy(A, honest), "orders"); // the signing here is right
  const token = tokenSignedBy(A, (signed) => {
    const { R, s } = honest(signed);
    return { R, s: s + L };
  });
  assert.throws(() => verifier.verify(token, "orders"), BadSignatureError);
});

// Helpers.

function bigints(_key: string, value: unknown): unknown {
  return typeof value === "bigint" ? value.toString() : value;
}

function b64(bytes: Uint8Array): string {
  return Buffer.from(bytes).toString("base64url");
}

function le32(n: bigint): Uint8Array {
  const out = new Uint8Array(32);
  for (let i = 0; i < 32; i++) {
    out[i] = Number(n & 0xffn);
    n >>= 8n;
  }
  return out;
}

function leBigInt(bytes: Uint8Array): bigint {
  return BigInt("0x" + Buffer.from(bytes).reverse().toString("hex"));
}

function scalar(): bigint {
  return (leBigInt(randomBytes(64)) % (L - 1n)) + 1n;
}

/** k = SHA-512(R || A || message) mod L, as RFC 8032 defines it. */
function challenge(R: Uint8Array, A: Uint8Array, message: Uint8Array): bigint {
  return leBigInt(createHash("sha512").update(R).update(A).update(message).digest()) % L;
}

/** A token for lock "orders" whose signature `sign` makes from the signed bytes. */
function tokenSignedBy(A: Uint8Array, sign: (signed: Uint8Array) => { R: Uint8Array; s: bigint }, holder = "w"): string {
  const signed = `${PREFIX}.${b64(canonicalPayload({ lock: "orders", epoch: 1n, holder, keyId: keyIdOf(A) }))}`;
  const { R, s } = sign(Buffer.from(signed, "ascii"));
  return `${signed}.${b64(Buffer.concat([R, le32(s)]))}`;
}

function assertRefusedThoughNobleAccepts(A: Uint8Array, token: string): void {
  const [prefix, payload, signature] = token.split(".") as [string, string, string];
  const accepted = ed25519.verify(Buffer.from(signature, "base64url"), Buffer.from(`${prefix}.${payload}`, "ascii"), A, {
    zip215: false,
  });
  assert.ok(accepted, "the RFC 8032 check alone accepts this signature");
  const ring = new KeyRing();
  ring.add(A);
  assert.throws(() => new Verifier(ring).verify(token, "orders"), BadSignatureError);
}

/** A fresh key of node:crypto's Ed25519, an independent signer. */
function newKey(): { publicKey: Uint8Array; id: string; sign: (claims: Claims) => string } {
  const { publicKey, privateKey } = generateKeyPairSync("ed25519");
  const raw = new Uint8Array(Buffer.from(publicKey.export({ format: "jwk" }).x!, "base64url"));
  return {
    publicKey: raw,
    id: keyIdOf(raw),
    sign: (claims) => {
      const signed = `${PREFIX}.${b64(canonicalPayload(claims))}`;
      return `${signed}.${b64(sign(null, Buffer.from(signed, "ascii"), privateKey))}`;
    },
  };
}
