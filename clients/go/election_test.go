// Tests of leader election against a real server: campaign, observe, resign, a crashed
// leader, polling without the events stream.

package palisade

import (
	"context"
	"errors"
	"testing"
	"time"
)

// changed reads the observer's next leadership within 10 s.
func changed(t *testing.T, o *Observer) *LeaderInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := o.Changed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// Two candidates: the first leads with its value, the second waits in line and leads the
// moment the first resigns, with a larger epoch; an observer polling once an hour learns
// of both from the events stream; the new leader's barrier fences the old one's token.
func TestCampaignObserveResign(t *testing.T) {
	c, ctx := server(t), context.Background()
	election := c.Election("primary", ElectionOptions{TTL: 2 * time.Second, PollInterval: time.Hour})
	observer := election.Observe()
	defer observer.Close()
	if info := changed(t, observer); info != nil {
		t.Fatalf("nobody leads yet: %+v", info)
	}
	a, err := election.Campaign(ctx, "replica-a", []byte("10.0.1.5:8080"))
	if err != nil {
		t.Fatal(err)
	}
	info := changed(t, observer)
	if info == nil || info.Holder != "replica-a" || info.Epoch != a.Lease.Epoch || string(info.Value) != "10.0.1.5:8080" {
		t.Fatalf("%+v", info)
	}
	if !observer.Streaming() {
		t.Fatal("the observer is not streaming")
	}
	if _, err := a.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	second := make(chan *Leader, 1)
	go func() {
		b, err := election.Campaign(ctx, "replica-b", []byte("10.0.1.6:8080"))
		if err != nil {
			t.Error(err)
		}
		second <- b
	}()
	eventually(t, 5*time.Second, "the second candidate in line", func() bool {
		status, err := c.LockStatus(ctx, "primary")
		return err == nil && status.Waiters == 1
	})
	leading, err := election.Leader(ctx)
	if err != nil || leading.Holder != "replica-a" {
		t.Fatalf("%+v %v", leading, err)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	b := <-second
	if b == nil {
		t.FailNow()
	}
	defer b.Resign(ctx)
	if b.Lease.Epoch <= a.Lease.Epoch {
		t.Fatalf("epochs %d then %d", a.Lease.Epoch, b.Lease.Epoch)
	}
	// The observer may first answer "nobody" between the release and the grant.
	info = changed(t, observer)
	if info == nil {
		info = changed(t, observer)
	}
	if info == nil || info.Holder != "replica-b" || info.Epoch != b.Lease.Epoch || string(info.Value) != "10.0.1.6:8080" {
		t.Fatalf("%+v", info)
	}
	if _, err := b.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "primary", "state", []byte("old leader"), a.Lease.Token); !IsFenced(err) {
		t.Fatalf("the former leader's write: %#v", err)
	}
	if !errors.Is(context.Cause(a.Context()), ErrReleased) {
		t.Fatalf("the resigned leader's context: %v", context.Cause(a.Context()))
	}
}

// Without the events stream an observer polls: a proclaimed value (which is no event)
// is seen within a poll interval or so.
func TestAnObserverPollsWithoutEvents(t *testing.T) {
	c, ctx := server(t), context.Background()
	election := c.Election("primary", ElectionOptions{PollInterval: 100 * time.Millisecond, NoEvents: true})
	leader, err := election.Campaign(ctx, "replica-a", []byte("starting"))
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Resign(ctx)
	observer := election.Observe()
	defer observer.Close()
	if info := changed(t, observer); info == nil || string(info.Value) != "starting" {
		t.Fatalf("%+v", info)
	}
	if _, err := leader.Proclaim(ctx, []byte("ready")); err != nil {
		t.Fatal(err)
	}
	proclaimed := time.Now()
	info := changed(t, observer)
	if info == nil || string(info.Value) != "ready" || info.Epoch != leader.Lease.Epoch {
		t.Fatalf("%+v", info)
	}
	if late := time.Since(proclaimed); late > time.Second {
		t.Fatalf("seen %v late", late)
	}
	if observer.Streaming() {
		t.Fatal("streaming with NoEvents")
	}
}

// A leader that stops renewing (a crash: its lease is never renewed) is replaced after
// its TTL by the candidate waiting in line; a campaign with a deadline gives up with
// *LockHeldError before it, leaving nobody in line.
func TestACrashedLeaderIsReplacedAfterItsTTL(t *testing.T) {
	c, ctx := server(t), context.Background()
	election := c.Election("primary", ElectionOptions{TTL: time.Second})
	crashed, err := c.Acquire(ctx, "primary", AcquireOptions{Holder: "crashed", TTL: 3 * time.Second, Value: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	started := time.Now()
	var held *LockHeldError
	if _, err := election.Campaign(short, "impatient", nil); !errors.As(err, &held) || held.Holder == nil || *held.Holder != "crashed" {
		t.Fatalf("%#v", err)
	}
	if took := time.Since(started); took > 1500*time.Millisecond {
		t.Fatalf("gave up after %v, past its deadline", took)
	}
	status, err := c.LockStatus(ctx, "primary")
	if err != nil || status.Waiters != 0 {
		t.Fatalf("%+v %v", status, err)
	}
	leader, err := election.Campaign(ctx, "replica-b", []byte("b"))
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Resign(ctx)
	if leader.Lease.Epoch <= crashed.Epoch || time.Since(started) < 2*time.Second {
		t.Fatalf("led at epoch %d after %v", leader.Lease.Epoch, time.Since(started))
	}
	// Led past several of its own TTLs, renewed in the background.
	time.Sleep(2500 * time.Millisecond)
	if leader.Err() != nil {
		t.Fatal(leader.Err())
	}
	info, err := election.Leader(ctx)
	if err != nil || info.Holder != "replica-b" || info.Epoch != leader.Lease.Epoch {
		t.Fatalf("%+v %v", info, err)
	}
}
