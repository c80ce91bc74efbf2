// Tests of lock values, lock-delay and lock status (one lock and pages of them),
// against a real server.

package palisade

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// A lease's value and lock-delay show in lock status (with its holder, epoch and the
// waiters in line); Proclaim replaces the value, or clears it, without changing the
// epoch; an oversized value is refused by the server with its limit.
func TestLockValuesAndStatus(t *testing.T) {
	c, ctx := server(t), context.Background()
	never, err := c.LockStatus(ctx, "svc")
	if err != nil || never.Epoch != 0 || never.Holder != nil || never.Value != nil || never.Waiters != 0 {
		t.Fatalf("a lock never acquired: %+v %v", never, err)
	}
	guard := holdGuard(t, c, "svc", AcquireOptions{Holder: "a", TTL: 10 * time.Second,
		Value: []byte("10.0.0.1:7700"), LockDelay: 2 * time.Second})
	defer guard.Release(ctx)
	if string(guard.Lease.Value) != "10.0.0.1:7700" || guard.Lease.LockDelayMs != 2000 {
		t.Fatalf("%+v", guard.Lease)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, "svc", AcquireOptions{Holder: "b", TTL: time.Second, Wait: 2 * time.Second})
		waiting <- err
	}()
	var status *LockStatus
	eventually(t, 5*time.Second, "a waiter in line", func() bool {
		status, err = c.LockStatus(ctx, "svc")
		return err == nil && status.Waiters == 1
	})
	if status.Holder == nil || *status.Holder != "a" || status.Epoch != guard.Lease.Epoch ||
		status.LeaseEpoch == nil || *status.LeaseEpoch != guard.Lease.Epoch ||
		!bytes.Equal(status.Value, []byte("10.0.0.1:7700")) || status.LockDelayMs == nil || *status.LockDelayMs != 2000 ||
		status.LeaseID == nil || *status.LeaseID != guard.Lease.LeaseID || status.RemainingMs == nil {
		t.Fatalf("%+v", status)
	}
	var held *LockHeldError
	if err := <-waiting; !errors.As(err, &held) {
		t.Fatalf("the waiter: %#v", err)
	}
	proclaimed, err := guard.Proclaim(ctx, []byte("10.0.0.1:7700 ready"))
	if err != nil || proclaimed.Epoch != guard.Lease.Epoch || string(proclaimed.Value) != "10.0.0.1:7700 ready" {
		t.Fatalf("%+v %v", proclaimed, err)
	}
	status, err = c.LockStatus(ctx, "svc")
	if err != nil || string(status.Value) != "10.0.0.1:7700 ready" || status.Epoch != guard.Lease.Epoch {
		t.Fatalf("%+v %v", status, err)
	}
	if _, err := c.Proclaim(ctx, guard.Lease.LeaseID, nil); err != nil {
		t.Fatal(err)
	}
	status, err = c.LockStatus(ctx, "svc")
	if err != nil || status.Value != nil {
		t.Fatalf("cleared: %+v %v", status, err)
	}
	var large *PayloadTooLargeError
	if _, err := guard.Proclaim(ctx, make([]byte, 4097)); !errors.As(err, &large) || large.Limit == nil || *large.Limit != 4096 {
		t.Fatalf("an oversized value: %#v", err)
	}
	if _, err := c.Acquire(ctx, "other", AcquireOptions{Holder: "a", TTL: time.Second, Value: make([]byte, 4097)}); !errors.As(err, &large) {
		t.Fatalf("an oversized value at acquisition: %#v", err)
	}
	if _, err := c.Proclaim(ctx, "no-such-lease", []byte("x")); !IsLost(err) {
		t.Fatalf("proclaiming for a lease that is gone: %#v", err)
	}
}

// A lease that expires keeps its lock ungrantable for its lock-delay (lock_held with no
// holder); LockDelay zero leaves the server's default (--lock-delay-ms), a negative one
// asks for none.
func TestALockDelayAfterAnExpiry(t *testing.T) {
	c, ctx := New(serve(t, "--lock-delay-ms", "60000")), context.Background()
	byDefault, err := c.Acquire(ctx, "default", AcquireOptions{Holder: "a", TTL: time.Second})
	if err != nil || byDefault.LockDelayMs != 60000 {
		t.Fatalf("the server's default: %+v %v", byDefault, err)
	}
	expiring, err := c.Acquire(ctx, "svc", AcquireOptions{Holder: "a", TTL: 200 * time.Millisecond, LockDelay: 1500 * time.Millisecond})
	if err != nil || expiring.LockDelayMs != 1500 {
		t.Fatalf("%+v %v", expiring, err)
	}
	var held *LockHeldError
	eventually(t, 5*time.Second, "the lease expired into its lock-delay", func() bool {
		_, err := c.Acquire(ctx, "svc", AcquireOptions{Holder: "b", TTL: time.Second})
		return errors.As(err, &held) && held.Holder == nil
	})
	next, err := c.Acquire(ctx, "svc", AcquireOptions{Holder: "b", TTL: time.Second, Wait: 5 * time.Second})
	if err != nil || next.Epoch <= expiring.Epoch {
		t.Fatalf("after the lock-delay: %+v %v", next, err)
	}
	none, err := c.Acquire(ctx, "none", AcquireOptions{Holder: "c", TTL: 100 * time.Millisecond, LockDelay: -1})
	if err != nil || none.LockDelayMs != 0 {
		t.Fatalf("%+v %v", none, err)
	}
	// Granted as soon as the lease expired: the server's 60 s did not apply.
	eventually(t, 3*time.Second, "granted right after the expiry", func() bool {
		_, err := c.Acquire(ctx, "none", AcquireOptions{Holder: "d", TTL: time.Second})
		return err == nil
	})
}

// Locks answers pages in name order with a continuation; AllLocks walks them all.
func TestLocksArePagedInNameOrder(t *testing.T) {
	c, ctx := server(t), context.Background()
	for i := 0; i < 5; i++ {
		hold(t, c, fmt.Sprintf("job-%d", i), "a")
	}
	hold(t, c, "other", "a")
	page, err := c.Locks(ctx, LocksOptions{Prefix: "job-", Limit: 2})
	if err != nil || len(page.Locks) != 2 || page.Locks[0].Lock != "job-0" || page.Locks[1].Lock != "job-1" || page.Next == nil {
		t.Fatalf("%+v %v", page, err)
	}
	page, err = c.Locks(ctx, LocksOptions{Prefix: "job-", After: *page.Next, Limit: 2})
	if err != nil || len(page.Locks) != 2 || page.Locks[0].Lock != "job-2" {
		t.Fatalf("%+v %v", page, err)
	}
	var names []string
	for status, err := range c.AllLocks(ctx, "job-", 2) {
		if err != nil {
			t.Fatal(err)
		}
		if status.Holder == nil || *status.Holder != "a" {
			t.Fatalf("%+v", status)
		}
		names = append(names, status.Lock)
	}
	if fmt.Sprint(names) != "[job-0 job-1 job-2 job-3 job-4]" {
		t.Fatalf("%v", names)
	}
}
