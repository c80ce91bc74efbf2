// TLS with a deployment's own CA: ClientOptions.ca (PEM text) or caFile (a PEM file) makes
// an undici Agent whose connections trust those CAs and only them (Node's `ca` replaces
// the default roots), and the client then sends its requests with undici's own fetch, the
// package's dependency, so that the Agent and the fetch that drives it are of one undici
// version (Node's global fetch is an undici bundled inside Node, of its own version, whose
// dispatcher interface an npm undici does not always match).

import { readFileSync } from "node:fs";

import { Agent, fetch as undiciFetch } from "undici";

/** The TLS settings a Client takes. */
export interface TlsOptions {
  /** The CA certificates (PEM text) the server's certificate must chain to. */
  ca?: string | Uint8Array;
  /** A PEM file of CA certificates, read once when the client is made. */
  caFile?: string;
}

/** An Agent trusting the CAs given, or undefined when none is. */
export function tlsDispatcher(options: TlsOptions): Agent | undefined {
  if (options.ca !== undefined && options.caFile !== undefined) throw new TypeError("give ca or caFile, not both");
  const ca = options.caFile !== undefined ? readFileSync(options.caFile, "utf8") : options.ca;
  if (ca === undefined) return undefined;
  const pem = typeof ca === "string" ? ca : new TextDecoder().decode(ca);
  if (!pem.includes("-----BEGIN CERTIFICATE-----")) throw new TypeError("ca holds no PEM certificate");
  return new Agent({ connect: { ca: pem } });
}

/** undici's fetch, as the client calls it (its Response has what the client reads). */
export const tlsFetch = (url: string, init: RequestInit): Promise<Response> =>
  undiciFetch(url, init);
