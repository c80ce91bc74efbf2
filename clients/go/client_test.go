// Tests of the lock client against a real server (started by serve, stopped by its pid):
// acquisitions, guards and their renewal, loss and context, and names in paths.

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
	return New(serve(t))
}

// holdGuard holds lock with opts (Client.Hold), failing the test if it cannot.
func holdGuard(t *testing.T, c *Client, lock string, opts AcquireOptions) *Guard {
	t.Helper()
	guard, err := c.Hold(context.Background(), lock, opts)
	if err != nil {
		t.Fatal(err)
	}
	return guard
}

// awaitLoss waits (ten seconds at most) for lost to be closed, then wants err() to be
// the server's refusal with code: why a guard (or a session guard) was lost.
func awaitLoss(t *testing.T, lost <-chan struct{}, err func() error, code string) {
	t.Helper()
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("the loss was never noticed")
	}
	var api *APIError
	if !errors.As(err(), &api) || api.Code != code || api.Status != 404 {
		t.Fatalf("got %#v", err())
	}
}

// serve starts `palisade serve` with extra flags (a policy, TLS files, an auth file) and
// answers its base URL, from its start-up line.
func serve(t *testing.T, flags ...string) string {
	t.Helper()
	base, _ := serveProcess(t, flags...)
	return base
}

// serveProcess is serve, with the server's process (to kill it in a test).
func serveProcess(t *testing.T, flags ...string) (string, *exec.Cmd) {
	t.Helper()
	bin := os.Getenv("PALISADE_BIN")
	if bin == "" {
		bin = filepath.Join("..", "..", "target", "debug", "palisade")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no palisade binary at %s (build it, or set PALISADE_BIN): %v", bin, err)
	}
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), "data")}, flags...)
	cmd := exec.Command(bin, args...)
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
	return strings.Split(url, ",")[0], cmd
}

// eventually polls cond every 20 ms until it holds, failing the test after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	guard := holdGuard(t, c, "jobs", AcquireOptions{Holder: "a", TTL: ttl})
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

// A guard whose lease was taken away (released by someone else here) says so: Lost is
// closed, Err is the server's lease_expired, Context is cancelled with it as cause, and
// the holder is safe no longer (SafeUntil moved back to the refused renewal's send).
func TestAGuardSaysWhenItsLeaseIsLost(t *testing.T) {
	c, ctx := server(t), context.Background()
	guard := holdGuard(t, c, "jobs", AcquireOptions{Holder: "a", TTL: 600 * time.Millisecond})
	if guard.SafeFor() <= 0 || !guard.SafeUntil().After(guard.RenewDeadline()) {
		t.Fatalf("a fresh guard: safe for %v, until %v after its renewal deadline", guard.SafeFor(), guard.SafeUntil().Sub(guard.RenewDeadline()))
	}
	if err := c.Release(ctx, guard.Lease.LeaseID); err != nil {
		t.Fatal(err)
	}
	awaitLoss(t, guard.Lost(), guard.Err, "lease_expired")
	// Moved back to the send of the renewal refused, which came before the renewal deadline.
	if guard.SafeFor() != 0 || !guard.SafeUntil().Before(guard.RenewDeadline()) || guard.SafeUntil().After(time.Now()) {
		t.Fatalf("a lease over at the server: safe for %v, until %v before the renewal deadline", guard.SafeFor(), guard.RenewDeadline().Sub(guard.SafeUntil()))
	}
	select {
	case <-guard.Context().Done():
	default:
		t.Fatal("Lost is closed, the context is not cancelled")
	}
	if context.Cause(guard.Context()) != guard.Err() {
		t.Fatalf("cause %#v", context.Cause(guard.Context()))
	}
	if err := guard.Release(ctx); !IsLost(err) {
		t.Fatalf("releasing a lease that ended: %#v", err)
	}
}

// Releasing a guard cancels its context with ErrReleased (not a loss: Lost stays open),
// and calls through it are refused from then on.
func TestReleasingAGuardCancelsItsContext(t *testing.T) {
	c, ctx := server(t), context.Background()
	guard := holdGuard(t, c, "jobs", AcquireOptions{Holder: "a", TTL: 10 * time.Second})
	work := guard.Context()
	if work.Err() != nil {
		t.Fatal("cancelled before the release")
	}
	if err := guard.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if work.Err() == nil || !errors.Is(context.Cause(work), ErrReleased) {
		t.Fatalf("after the release: %v %v", work.Err(), context.Cause(work))
	}
	if guard.SafeFor() != 0 || guard.SafeUntil().After(time.Now()) {
		t.Fatalf("a released guard is safe for %v", guard.SafeFor())
	}
	select {
	case <-guard.Lost():
		t.Fatal("a release is not a loss")
	default:
	}
	if _, err := guard.Put(ctx, "k", []byte("v")); !IsLost(err) {
		t.Fatalf("a put through a released guard: %#v", err)
	}
	status, err := c.LockStatus(ctx, "jobs")
	if err != nil || status.Holder != nil {
		t.Fatalf("%+v %v", status, err)
	}
}

// A guard whose server is gone gives its lease up at its renewal deadline: the time its
// last successful renewal was sent plus 2/3 of the TTL (by default), so no later than
// that after the server died, and before its safe deadline (the TTL less 1 %), which
// giving up does not move. Err says no renewal succeeded.
func TestAGuardGivesItsLeaseUpAtTheRenewalDeadline(t *testing.T) {
	base, process := serveProcess(t)
	c := New(base, WithTimeout(time.Second))
	ttl := 900 * time.Millisecond
	guard := holdGuard(t, c, "jobs", AcquireOptions{Holder: "a", TTL: ttl})
	// Let a renewal or two succeed, then kill the server.
	time.Sleep(ttl / 2)
	if err := process.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	select {
	case <-guard.Lost():
	case <-time.After(5 * ttl):
		t.Fatal("never given up")
	}
	lostAt := time.Now()
	if late := lostAt.Sub(killed); late > ttl*2/3+150*time.Millisecond {
		t.Fatalf("given up %v after the server died, more than 2/3 of the TTL", late)
	}
	// Both deadlines count from the same send, the last confirmed renewal's: 600 ms and
	// 891 ms after it.
	renewBy, safeUntil := guard.RenewDeadline(), guard.SafeUntil()
	if safeUntil.Sub(renewBy) != 291*time.Millisecond {
		t.Fatalf("safe until %v after the renewal deadline, not 291 ms", safeUntil.Sub(renewBy))
	}
	if lostAt.Before(renewBy) || !lostAt.Before(safeUntil) {
		t.Fatalf("given up %v after the renewal deadline, %v before the safe deadline", lostAt.Sub(renewBy), safeUntil.Sub(lostAt))
	}
	if got := guard.SafeFor(); got > 291*time.Millisecond {
		t.Fatalf("safe for %v after giving up", got)
	}
	var api *APIError
	if !errors.As(guard.Err(), &api) || api.Code != "lease_expired" || api.Status != 0 ||
		!strings.Contains(api.Message, "no renewal succeeded before the renewal deadline") {
		t.Fatalf("%#v", guard.Err())
	}
	if !errors.As(context.Cause(guard.Context()), &api) {
		t.Fatalf("cause %#v", context.Cause(guard.Context()))
	}
}

// A Hold that waited in line longer than its TTL renews once before it returns, so its
// deadlines count from that renewal, not from the send: without it, the guard would give
// its fresh lease up at once.
func TestAHoldThatWaitedRenewsBeforeReturning(t *testing.T) {
	c, ctx := server(t), context.Background()
	first, err := c.Acquire(ctx, "queue", AcquireOptions{Holder: "a", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(1500 * time.Millisecond)
		_ = c.Release(ctx, first.LeaseID)
	}()
	ttl := 600 * time.Millisecond
	guard := holdGuard(t, c, "queue", AcquireOptions{Holder: "b", TTL: ttl, Wait: 10 * time.Second})
	defer guard.Release(ctx)
	if !guard.RenewDeadline().After(time.Now()) || guard.SafeFor() <= 0 {
		t.Fatalf("a Hold that waited: renewal deadline %v ago, safe for %v", time.Since(guard.RenewDeadline()), guard.SafeFor())
	}
	time.Sleep(2 * ttl)
	if guard.Err() != nil {
		t.Fatalf("lost after its wait: %v", guard.Err())
	}
	status, err := c.LockStatus(ctx, "queue")
	if err != nil || status.Holder == nil || *status.Holder != "b" || *status.LeaseEpoch != guard.Lease.Epoch {
		t.Fatalf("%+v %v", status, err)
	}
}
