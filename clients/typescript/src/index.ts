// The package's entry point, @palisade/client: the lock client (client.ts) and what its
// methods take and answer (locks.ts, kv.ts, fence.ts, session.ts), the deadlines of its
// guards (renewal.ts), failover between endpoints (failover.ts), TLS options (tls.ts),
// the event stream (events.ts), leader election (election.ts), the typed errors of the
// server's answers (errors.ts) and the offline token verifier (token.ts, also importable
// alone as @palisade/client/token).

export * from "./client.js";
export * from "./errors.js";
export { type CampaignOptions, DEFAULT_POLL_INTERVAL_MS, Election, type ElectionOptions, Leader, type LeaderInfo, Observer } from "./election.js";
export {
  type EventsOptions,
  EventStream,
  type ExpiredEvent,
  type FencedEvent,
  type GrantedEvent,
  IDLE_LIMIT_MS,
  type LockEvent,
  MAX_LINE,
  type RejectedEvent,
  type ReleasedEvent,
  type ResetEvent,
} from "./events.js";
export type { FenceOptions, Fenced, FenceStatus, GenuineToken, NotGenuineToken, TokenCheck } from "./fence.js";
export type { CallOptions, Entry, ListOptions, WriteOptions, Written } from "./kv.js";
export type { AcquireOptions, Lease, LockPage, LockPageOptions, LockStatus, Proclaimed, Renewed } from "./locks.js";
export { type Failure, type RetryClass, mayTryNext } from "./failover.js";
export { type Session, type SessionLease, type SessionOptions, SessionGuard } from "./session.js";
export { DEFAULT_DEADLINES, type Deadlines } from "./renewal.js";
export type { TlsOptions } from "./tls.js";
export * from "./token.js";
