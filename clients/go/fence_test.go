// Tests of the barrier, the online token check and a guard fenced off, against a real
// server.

package palisade

import (
	"context"
	"errors"
	"testing"
	"time"

	tokens "github.com/palisade/palisade-go/token"
)

// The barrier fences an old holder off before the new one writes anything: the old
// token's write, admitted before the barrier, is refused after it.
func TestTheBarrierFencesOffAnOldHolderBeforeAnyWrite(t *testing.T) {
	c, ctx := server(t), context.Background()
	old := hold(t, c, "orders", "a")
	if err := c.Release(ctx, old.LeaseID); err != nil {
		t.Fatal(err)
	}
	current := hold(t, c, "orders", "b")
	// Nothing of the new holder reached the namespace yet: the late write passes.
	if _, err := c.Put(ctx, "orders", "k", []byte("late, before the barrier"), old.Token); err != nil {
		t.Fatalf("before the barrier: %v", err)
	}
	fenced, err := c.Fence(ctx, "orders", current.Token)
	if err != nil || fenced.HighWater != current.Epoch || fenced.Epoch != current.Epoch || fenced.Lock != "orders" {
		t.Fatalf("%+v %v", fenced, err)
	}
	_, err = c.Put(ctx, "orders", "k", []byte("late, after the barrier"), old.Token)
	var stale *StaleTokenError
	if !errors.As(err, &stale) || stale.Epoch != old.Epoch || stale.HighWater != current.Epoch {
		t.Fatalf("after the barrier: %#v", err)
	}
	status, err := c.HighWater(ctx, "orders")
	if err != nil || status.HighWater != current.Epoch || status.Policy != "epoch" {
		t.Fatalf("%+v %v", status, err)
	}
	if _, err := c.Fence(ctx, "orders", old.Token); !errors.As(err, &stale) {
		t.Fatalf("an old barrier: %#v", err)
	}
	var api *APIError
	if _, err := c.Fence(ctx, "orders", ""); !errors.As(err, &api) || api.Code != "missing_token" {
		t.Fatalf("no token: %#v", err)
	}
	var wrong *WrongLockError
	if _, err := c.Fence(ctx, "invoices", current.Token); !errors.As(err, &wrong) || wrong.TokenLock != "orders" {
		t.Fatalf("another lock's token: %#v", err)
	}
}

// The online check says a token is genuine, current and its lease alive, and changes its
// answer when the lease ends; a forged token is not genuine. The public keys verify the
// same token offline.
func TestTheIssuerChecksTokens(t *testing.T) {
	c, ctx := server(t), context.Background()
	lease := hold(t, c, "orders", "a")
	check, err := c.CheckToken(ctx, lease.Token)
	if err != nil || !check.Genuine || !check.Current || !check.LeaseAlive || check.Lock != "orders" ||
		check.Epoch != lease.Epoch || check.CurrentEpoch != lease.Epoch || check.Holder != "a" || check.KeyID == "" {
		t.Fatalf("%+v %v", check, err)
	}
	if err := c.Release(ctx, lease.LeaseID); err != nil {
		t.Fatal(err)
	}
	next := hold(t, c, "orders", "b")
	check, err = c.CheckToken(ctx, lease.Token)
	if err != nil || !check.Genuine || check.Current || check.LeaseAlive || check.CurrentEpoch != next.Epoch {
		t.Fatalf("after the release: %+v %v", check, err)
	}
	// One character of the signature changed (to another that decodes to other bits).
	i := len(lease.Token) - 10
	swap := byte('A')
	if lease.Token[i] == 'A' {
		swap = 'B'
	}
	forged := lease.Token[:i] + string(swap) + lease.Token[i+1:]
	check, err = c.CheckToken(ctx, forged)
	if err != nil || check.Genuine || check.Reason == "" {
		t.Fatalf("forged: %+v %v", check, err)
	}
	listing, err := c.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := tokens.RingFromListing(listing)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := tokens.NewVerifier(ring, 10).VerifyFor(next.Token, "orders")
	if err != nil || claims.Epoch != next.Epoch {
		t.Fatalf("%+v %v", claims, err)
	}
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
}

// Writes through a guard carry its token; a stale refusal through it loses the guard at
// once (its context is cancelled with that refusal as the cause, and it is safe no
// longer), and calls through a lost guard are refused before anything is sent.
func TestAGuardFencedOffIsLost(t *testing.T) {
	c, ctx := server(t), context.Background()
	// A TTL long enough that no renewal comes before the stale write: that write alone
	// tells the guard.
	guard := holdGuard(t, c, "orders", AcquireOptions{Holder: "a", TTL: 30 * time.Second})
	if _, err := guard.Put(ctx, "k", []byte("a")); err != nil {
		t.Fatal(err)
	}
	// Someone takes the lock over (the guard's lease released behind its back) and fences.
	if err := c.Release(ctx, guard.Lease.LeaseID); err != nil {
		t.Fatal(err)
	}
	next := holdGuard(t, c, "orders", AcquireOptions{Holder: "b", TTL: 10 * time.Second})
	defer next.Release(ctx)
	if _, err := next.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := guard.Put(ctx, "k", []byte("late"))
	var stale *StaleTokenError
	if !errors.As(err, &stale) {
		t.Fatalf("%#v", err)
	}
	select {
	case <-guard.Context().Done():
	default:
		t.Fatal("the stale write left the guard's context alive")
	}
	if cause := context.Cause(guard.Context()); cause != err || guard.Err() != err {
		t.Fatalf("cause %#v, Err %#v", cause, guard.Err())
	}
	if guard.SafeFor() != 0 || guard.SafeUntil().After(time.Now()) {
		t.Fatalf("a guard fenced off is safe for %v", guard.SafeFor())
	}
	select {
	case <-guard.Lost():
	default:
		t.Fatal("the context ended but Lost is open")
	}
	var api *APIError
	if _, err := guard.Put(ctx, "k", []byte("later")); !errors.As(err, &api) || api.Status != 0 || !IsLost(err) {
		t.Fatalf("a put through a lost guard: %#v", err)
	}
	entry, err := c.Get(ctx, "orders", "k")
	if err != nil || string(entry.Value) != "a" {
		t.Fatalf("%+v %v", entry, err)
	}
}
