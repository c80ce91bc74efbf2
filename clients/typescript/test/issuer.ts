// Test helper: an issuer of fencing tokens with an Ed25519 key of its own (node:crypto),
// signing the package's canonical payload as the server would, and the ring that trusts it.

import { generateKeyPairSync, sign } from "node:crypto";

import { KeyRing, PREFIX, canonicalPayload, keyIdOf } from "../src/token.js";

export interface Issuer {
  /** The raw 32-byte public key. */
  readonly publicKey: Uint8Array;
  readonly keyId: string;
  /** A ring that trusts this issuer only. */
  ring(): KeyRing;
  /** A genuine token for `lock` at `epoch`, holder "w". */
  token(lock: string, epoch: bigint): string;
}

export function newIssuer(): Issuer {
  const { publicKey, privateKey } = generateKeyPairSync("ed25519");
  const raw = new Uint8Array(Buffer.from(publicKey.export({ format: "jwk" }).x!, "base64url"));
  const keyId = keyIdOf(raw);
  return {
    publicKey: raw,
    keyId,
    ring: () => {
      const ring = new KeyRing();
      ring.add(raw);
      return ring;
    },
    token: (lock, epoch) => {
      const payload = Buffer.from(canonicalPayload({ lock, epoch, holder: "w", keyId })).toString("base64url");
      const signed = `${PREFIX}.${payload}`;
      return `${signed}.${sign(null, Buffer.from(signed, "ascii"), privateKey).toString("base64url")}`;
    },
  };
}
