// The package's entry point, @palisade/client: the lock client (client.ts), the typed
// errors of the server's answers (errors.ts) and the offline token verifier (token.ts,
// also importable alone as @palisade/client/token).

export * from "./client.js";
export * from "./errors.js";
export * from "./token.js";
