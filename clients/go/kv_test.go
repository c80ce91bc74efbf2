// Tests of the fenced store against a real server: preconditions, idempotency keys,
// local refusals, fenced deletes, listings and the sequence policy.

package palisade

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"
)

func hold(t *testing.T, c *Client, lock, holder string) *Lease {
	t.Helper()
	lease, err := c.Acquire(context.Background(), lock, AcquireOptions{Holder: holder, TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return lease
}

// If-None-Match and If-Match guard a put against a real server: the refusal carries the
// key's current revision (nil when absent), and nothing is written.
func TestPutPreconditions(t *testing.T) {
	c, ctx := server(t), context.Background()
	lease := hold(t, c, "orders", "a")
	first, err := c.Put(ctx, "orders", "k", []byte("v1"), lease.Token, IfAbsent())
	if err != nil || first.Revision == 0 || first.Epoch != lease.Epoch || first.Replayed {
		t.Fatalf("%+v %v", first, err)
	}
	_, err = c.Put(ctx, "orders", "k", []byte("again"), lease.Token, IfAbsent())
	var mismatch *RevisionMismatchError
	if !errors.As(err, &mismatch) || mismatch.CurrentRevision == nil || *mismatch.CurrentRevision != first.Revision {
		t.Fatalf("if-absent on an existing key: %#v", err)
	}
	_, err = c.Put(ctx, "orders", "k", []byte("stale"), lease.Token, IfMatch(first.Revision+7))
	if !errors.As(err, &mismatch) || *mismatch.CurrentRevision != first.Revision {
		t.Fatalf("if-match on another revision: %#v", err)
	}
	_, err = c.Put(ctx, "orders", "absent", []byte("x"), lease.Token, IfMatch(1))
	if !errors.As(err, &mismatch) || mismatch.CurrentRevision != nil {
		t.Fatalf("if-match on an absent key: %#v", err)
	}
	second, err := c.Put(ctx, "orders", "k", []byte("v2"), lease.Token, IfMatch(first.Revision))
	if err != nil || second.Revision <= first.Revision {
		t.Fatalf("%+v %v", second, err)
	}
	entry, err := c.Get(ctx, "orders", "k")
	if err != nil || string(entry.Value) != "v2" || entry.Revision != second.Revision {
		t.Fatalf("%+v %v", entry, err)
	}
	if _, err := c.Get(ctx, "orders", "absent"); !errors.As(err, new(*NotFoundError)) {
		t.Fatalf("the refused put wrote: %v", err)
	}
}

// An idempotency key makes a retry answer the first outcome without applying twice; the
// key reused for another request is idempotency_conflict.
func TestAnIdempotentRetryIsReplayed(t *testing.T) {
	c, ctx := server(t), context.Background()
	lease := hold(t, c, "orders", "a")
	first, err := c.Put(ctx, "orders", "k", []byte("v"), lease.Token, IdempotencyKey("invoice-17"))
	if err != nil || first.Replayed {
		t.Fatalf("%+v %v", first, err)
	}
	again, err := c.Put(ctx, "orders", "k", []byte("v"), lease.Token, IdempotencyKey("invoice-17"))
	if err != nil || !again.Replayed || again.Revision != first.Revision {
		t.Fatalf("the retry: %+v %v", again, err)
	}
	entry, err := c.Get(ctx, "orders", "k")
	if err != nil || entry.Revision != first.Revision {
		t.Fatalf("applied twice: %+v %v", entry, err)
	}
	_, err = c.Put(ctx, "orders", "k", []byte("other"), lease.Token, IdempotencyKey("invoice-17"))
	var api *APIError
	if !errors.As(err, &api) || api.Code != "idempotency_conflict" || api.Status != 422 {
		t.Fatalf("another request under the key: %#v", err)
	}
}

// Options that cannot be sent, or mean nothing for the call, are refused before
// anything is sent (bad_request with Status 0; the server never sees them).
func TestMeaninglessOptionsAreRefusedLocally(t *testing.T) {
	c, ctx := server(t), context.Background()
	lease := hold(t, c, "orders", "a")
	for name, call := range map[string]func() error{
		"if-match and if-absent": func() error {
			_, err := c.Put(ctx, "orders", "k", []byte("v"), lease.Token, IfMatch(1), IfAbsent())
			return err
		},
		"a key with a space": func() error {
			_, err := c.Put(ctx, "orders", "k", []byte("v"), lease.Token, IdempotencyKey("a b"))
			return err
		},
		"a key too long": func() error {
			_, err := c.Put(ctx, "orders", "k", []byte("v"), lease.Token, IdempotencyKey(string(make([]byte, 129))))
			return err
		},
		"if-absent on a delete": func() error {
			_, err := c.Delete(ctx, "orders", "k", lease.Token, IfAbsent())
			return err
		},
		"if-match on a barrier": func() error {
			_, err := c.Fence(ctx, "orders", lease.Token, IfMatch(1))
			return err
		},
		"a ttl under 50 ms": func() error {
			_, err := c.Acquire(ctx, "x", AcquireOptions{Holder: "a", TTL: time.Millisecond})
			return err
		},
		"a wait over 300 s": func() error {
			_, err := c.Acquire(ctx, "x", AcquireOptions{Holder: "a", TTL: time.Second, Wait: 301 * time.Second})
			return err
		},
	} {
		var api *APIError
		if err := call(); !errors.As(err, &api) || api.Code != "bad_request" || api.Status != 0 {
			t.Errorf("%s: %#v", name, err)
		}
	}
	if _, err := c.Get(ctx, "orders", "k"); !errors.As(err, new(*NotFoundError)) {
		t.Fatalf("something was written: %v", err)
	}
	var api *APIError
	if _, err := c.Put(ctx, "orders", "k", []byte("v"), "pal1.\n"); !errors.As(err, &api) || api.Code != "invalid_token" || api.Status != 0 {
		t.Fatalf("a token a header cannot carry: %#v", err)
	}
}

// A delete is fenced like a put: an older epoch is refused and the key stays; a delete of
// an absent key is not_found.
func TestDeleteIsFenced(t *testing.T) {
	c, ctx := server(t), context.Background()
	first := hold(t, c, "orders", "a")
	if _, err := c.Put(ctx, "orders", "k", []byte("v"), first.Token); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, first.LeaseID); err != nil {
		t.Fatal(err)
	}
	second := hold(t, c, "orders", "b")
	if _, err := c.Put(ctx, "orders", "k2", []byte("v"), second.Token); err != nil {
		t.Fatal(err)
	}
	_, err := c.Delete(ctx, "orders", "k", first.Token)
	var stale *StaleTokenError
	if !errors.As(err, &stale) || stale.Epoch != first.Epoch || stale.HighWater != second.Epoch {
		t.Fatalf("a stale delete: %#v", err)
	}
	if _, err := c.Get(ctx, "orders", "k"); err != nil {
		t.Fatalf("the refused delete deleted: %v", err)
	}
	entry, _ := c.Get(ctx, "orders", "k")
	var mismatch *RevisionMismatchError
	if _, err := c.Delete(ctx, "orders", "k", second.Token, IfMatch(entry.Revision+1)); !errors.As(err, &mismatch) {
		t.Fatalf("if-match on a delete: %#v", err)
	}
	deleted, err := c.Delete(ctx, "orders", "k", second.Token, IfMatch(entry.Revision))
	if err != nil || deleted.Epoch != second.Epoch {
		t.Fatalf("%+v %v", deleted, err)
	}
	if _, err := c.Get(ctx, "orders", "k"); !errors.As(err, new(*NotFoundError)) {
		t.Fatalf("still there: %v", err)
	}
	if _, err := c.Delete(ctx, "orders", "k", second.Token); !errors.As(err, new(*NotFoundError)) {
		t.Fatalf("deleting an absent key: %#v", err)
	}
}

// List answers a namespace's keys in key order, by prefix, at most Limit.
func TestListKeys(t *testing.T) {
	c, ctx := server(t), context.Background()
	lease := hold(t, c, "orders", "a")
	for _, key := range []string{"b/2", "a", "b/1", "c", "b/3"} {
		if _, err := c.Put(ctx, "orders", key, []byte(key), lease.Token); err != nil {
			t.Fatal(err)
		}
	}
	all, err := c.List(ctx, "orders", ListOptions{})
	if err != nil || !reflect.DeepEqual(all, []string{"a", "b/1", "b/2", "b/3", "c"}) {
		t.Fatalf("%v %v", all, err)
	}
	some, err := c.List(ctx, "orders", ListOptions{Prefix: "b/", Limit: 2})
	if err != nil || !reflect.DeepEqual(some, []string{"b/1", "b/2"}) {
		t.Fatalf("%v %v", some, err)
	}
	none, err := c.List(ctx, "empty", ListOptions{})
	if err != nil || len(none) != 0 {
		t.Fatalf("%v %v", none, err)
	}
}

// In a namespace with the sequence policy, (epoch, seq) must strictly increase: a write
// without Seq is refused, a replayed seq is *StaleSequenceError with its fields, and the
// barrier takes a Seq too.
func TestTheSequencePolicy(t *testing.T) {
	c, ctx := New(serve(t, "--policy", "ledger=sequence")), context.Background()
	lease := hold(t, c, "ledger", "a")
	var api *APIError
	if _, err := c.Put(ctx, "ledger", "k", []byte("v"), lease.Token); !errors.As(err, &api) || api.Code != "bad_request" || api.Status != 400 {
		t.Fatalf("no Fencing-Seq: %#v", err)
	}
	for seq := uint64(1); seq <= 2; seq++ {
		if _, err := c.Put(ctx, "ledger", "k", []byte("v"), lease.Token, Seq(seq)); err != nil {
			t.Fatal(seq, err)
		}
	}
	_, err := c.Put(ctx, "ledger", "k", []byte("replay"), lease.Token, Seq(2))
	var stale *StaleSequenceError
	if !errors.As(err, &stale) || stale.Epoch != lease.Epoch || stale.Seq != 2 || stale.HighWater != lease.Epoch || stale.HighWaterSeq != 2 || !IsFenced(err) {
		t.Fatalf("a replayed seq: %#v", err)
	}
	fenced, err := c.Fence(ctx, "ledger", lease.Token, Seq(5))
	if err != nil || fenced.HighWater != lease.Epoch || fenced.Epoch != lease.Epoch {
		t.Fatalf("%+v %v", fenced, err)
	}
	status, err := c.HighWater(ctx, "ledger")
	if err != nil || status.Policy != "sequence" || status.HighWater != lease.Epoch || status.Seq == nil || *status.Seq != 5 {
		t.Fatalf("%+v %v", status, err)
	}
	if _, err := c.Delete(ctx, "ledger", "k", lease.Token, Seq(5)); !errors.As(err, &stale) {
		t.Fatalf("a delete at the barrier's seq: %#v", err)
	}
	if _, err := c.Delete(ctx, "ledger", "k", lease.Token, Seq(6)); err != nil {
		t.Fatal(err)
	}
	// A guard counts its own sequence numbers.
	if err := c.Release(ctx, lease.LeaseID); err != nil {
		t.Fatal(err)
	}
	guard := holdGuard(t, c, "ledger", AcquireOptions{Holder: "b", TTL: 10 * time.Second})
	defer guard.Release(ctx)
	for i := uint64(1); i <= 3; i++ {
		if n := guard.NextSeq(); n != i {
			t.Fatalf("NextSeq %d, want %d", n, i)
		}
		if _, err := guard.Put(ctx, "k", []byte("v"), Seq(i)); err != nil {
			t.Fatal(err)
		}
	}
	status, err = c.HighWater(ctx, "ledger")
	if err != nil || status.HighWater != guard.Lease.Epoch || *status.Seq != 3 {
		t.Fatalf("%+v %v", status, err)
	}
}
