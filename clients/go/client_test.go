package palisade

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// server starts `palisade serve` (PALISADE_BIN, or the workspace's debug build) on a
// free loopback port in a temp dir, and stops it by its pid when the test ends.
func server(t *testing.T) *Client {
	t.Helper()
	bin := os.Getenv("PALISADE_BIN")
	if bin == "" {
		bin = filepath.Join("..", "..", "target", "debug", "palisade")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no palisade binary at %s (build it, or set PALISADE_BIN): %v", bin, err)
	}
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), "data"))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	url, found := strings.CutPrefix(strings.TrimSpace(line), "palisade listening on ")
	if err != nil || !found {
		t.Fatalf("no start-up line: %q %v", line, err)
	}
	return New(strings.Split(url, ",")[0])
}

// The fencing story against a real server: a holder writes, loses the lock, and its
// late write is refused with the typed error; the lock held is refused with its holder.
func TestALateWriteIsFencedOff(t *testing.T) {
	c, ctx := server(t), context.Background()
	first, err := c.Acquire(ctx, "orders", AcquireOptions{Holder: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "orders", "k", []byte("from a"), first.Token); err != nil {
		t.Fatal(err)
	}
	_, err = c.Acquire(ctx, "orders", AcquireOptions{Holder: "b", TTL: 10 * time.Second})
	var held *LockHeldError
	if !errors.As(err, &held) || held.Holder == nil || *held.Holder != "a" {
		t.Fatalf("got %#v", err)
	}
	if err := c.Release(ctx, first.LeaseID); err != nil {
		t.Fatal(err)
	}
	second, err := c.Acquire(ctx, "orders", AcquireOptions{Holder: "b", TTL: 10 * time.Second})
	if err != nil || second.Epoch <= first.Epoch {
		t.Fatalf("second: %+v %v", second, err)
	}
	if _, err := c.Put(ctx, "orders", "k", []byte("from b"), second.Token); err != nil {
		t.Fatal(err)
	}
	_, err = c.Put(ctx, "orders", "k", []byte("late, from a"), first.Token)
	var stale *StaleTokenError
	if !errors.As(err, &stale) || stale.Epoch != first.Epoch || stale.HighWater != second.Epoch || !IsFenced(err) {
		t.Fatalf("got %#v", err)
	}
	entry, err := c.Get(ctx, "orders", "k")
	if err != nil || string(entry.Value) != "from b" || entry.Epoch != second.Epoch {
		t.Fatalf("entry %+v %v", entry, err)
	}
	var missing *NotFoundError
	if _, err := c.Get(ctx, "orders", "absent"); !errors.As(err, &missing) {
		t.Fatalf("got %#v", err)
	}
}

// A guard keeps its lease past several TTLs by renewing it, and releases it: then the
// lock is free for the next holder.
func TestAGuardRenewsUntilReleased(t *testing.T) {
	c, ctx := server(t), context.Background()
	ttl := 600 * time.Millisecond
	guard, err := c.Hold(ctx, "jobs", AcquireOptions{Holder: "a", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(4 * ttl)
	for time.Now().Before(deadline) {
		_, err := c.Acquire(ctx, "jobs", AcquireOptions{Holder: "b", TTL: ttl})
		var held *LockHeldError
		if !errors.As(err, &held) {
			t.Fatalf("the guarded lock was free or failed: %#v", err)
		}
		time.Sleep(ttl / 4)
	}
	if guard.Err() != nil {
		t.Fatal(guard.Err())
	}
	if err := guard.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "jobs", AcquireOptions{Holder: "b", TTL: ttl}); err != nil {
		t.Fatalf("after the release: %v", err)
	}
}

// A guard whose lease was taken away (released by someone else here) says so.
func TestAGuardSaysWhenItsLeaseIsLost(t *testing.T) {
	c, ctx := server(t), context.Background()
	guard, err := c.Hold(ctx, "jobs", AcquireOptions{Holder: "a", TTL: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, guard.Lease.LeaseID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-guard.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the loss was never noticed")
	}
	var api *APIError
	if !errors.As(guard.Err(), &api) || api.Code != "lease_expired" {
		t.Fatalf("got %#v", guard.Err())
	}
}

// An acquisition that waits in line longer than the client's timeout is still answered:
// the wait is added to the request's bound.
func TestAWaitLongerThanTheTimeoutIsAnswered(t *testing.T) {
	c, ctx := server(t), context.Background()
	c.timeout = 300 * time.Millisecond
	first, err := c.Acquire(ctx, "queue", AcquireOptions{Holder: "a", TTL: 700 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// The first lease expires (no keepalive) about 700 ms from now, well past the
	// timeout; the waiter is granted then.
	second, err := c.Acquire(ctx, "queue", AcquireOptions{Holder: "b", TTL: time.Second, Wait: 5 * time.Second})
	if err != nil || second.Epoch <= first.Epoch {
		t.Fatalf("second: %+v %v", second, err)
	}
}

// Names that URL normalisation would rewrite are refused before anything is sent; a key
// with "/" keeps its segments and is read back as written.
func TestDotSegmentsAreRefusedAndSlashesKept(t *testing.T) {
	c, ctx := server(t), context.Background()
	lease, err := c.Acquire(ctx, "orders", AcquireOptions{Holder: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"", ".", "..", "a/../b", "a/./b", "a/.."} {
		if _, err := c.Put(ctx, "orders", key, []byte("x"), lease.Token); !errors.Is(err, ErrUnsendablePath) {
			t.Fatalf("%q: %v", key, err)
		}
	}
	if _, err := c.Acquire(ctx, "..", AcquireOptions{Holder: "a", TTL: time.Second}); !errors.Is(err, ErrUnsendablePath) {
		t.Fatalf("lock ..: %v", err)
	}
	if _, err := c.Put(ctx, "orders", "dir/file name", []byte("v"), lease.Token); err != nil {
		t.Fatal(err)
	}
	entry, err := c.Get(ctx, "orders", "dir/file name")
	if err != nil || string(entry.Value) != "v" {
		t.Fatalf("%+v %v", entry, err)
	}
}
