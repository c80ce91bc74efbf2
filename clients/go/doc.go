// Package palisade is the Go client of Palisade, the fencing-token lock service
// (docs/go.md is the guide, docs/api.md the HTTP API it speaks).
//
// A Client acquires locks (Acquire, or Hold for a Guard that renews in the background,
// says until when the holder may act (SafeUntil, Deadlines) and whose Context is
// cancelled when the lease is lost), writes the fenced store with a lease's token (Put,
// Delete, Fence), reads it (Get, List, HighWater), checks tokens (CheckToken), reads and
// proclaims lock values (LockStatus, Locks, Proclaim), holds sessions (HoldSession), runs
// elections (Election), reads the events streams (Watch, Events), fails over between the
// nodes of a deployment (NewClient) and speaks TLS with your own CA (WithCACertFile).
// Every refusal is a typed error (ParseError): branch with errors.As, IsFenced and
// IsLost. Package token verifies tokens offline; package gate/postgres guards your own
// PostgreSQL with them.
package palisade
