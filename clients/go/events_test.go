// Tests of the events streams against a real server (and a proxy that cuts and holds
// connections), and of the stream parser's bounds.

package palisade

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// proxy is a TCP proxy to a server that can cut every open connection and hold new ones
// back (accepted, not yet forwarded) until let through.
type proxy struct {
	ln       net.Listener
	target   string
	mu       sync.Mutex
	conns    []net.Conn
	held     chan struct{} // closed: connections go through
	accepted int
}

func newProxy(t *testing.T, base string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: strings.TrimPrefix(base, "http://"), held: make(chan struct{})}
	close(p.held)
	t.Cleanup(func() {
		ln.Close()
		p.cut()
	})
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.accepted++
			p.conns = append(p.conns, conn)
			held := p.held
			p.mu.Unlock()
			go func() {
				<-held
				upstream, err := net.Dial("tcp", p.target)
				if err != nil {
					conn.Close()
					return
				}
				p.mu.Lock()
				p.conns = append(p.conns, upstream)
				p.mu.Unlock()
				go func() { _, _ = io.Copy(upstream, conn); upstream.Close() }()
				_, _ = io.Copy(conn, upstream)
				conn.Close()
			}()
		}
	}()
	return p
}

func (p *proxy) url() string { return "http://" + p.ln.Addr().String() }

// cut closes every connection open now.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, conn := range p.conns {
		conn.Close()
	}
	p.conns = nil
}

// hold makes new connections wait until release.
func (p *proxy) hold() {
	p.mu.Lock()
	p.held = make(chan struct{})
	p.mu.Unlock()
}

func (p *proxy) release() {
	p.mu.Lock()
	close(p.held)
	p.mu.Unlock()
}

func (p *proxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// next reads one event within 10 s.
func next(t *testing.T, s *EventStream) Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	event, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("no event: %v (last failure: %v)", err, s.LastError())
	}
	return event
}

// describe is an event in a few words, for comparing sequences.
func describe(e Event) string {
	switch e := e.(type) {
	case *GrantedEvent:
		return fmt.Sprintf("granted %s %d %s", e.Lock, e.Epoch, e.Holder)
	case *ReleasedEvent:
		return fmt.Sprintf("released %s %d %s %s", e.Lock, e.Epoch, e.Holder, e.Cause)
	case *ExpiredEvent:
		return fmt.Sprintf("expired %s %d %s", e.Lock, e.Epoch, e.Holder)
	case *FencedEvent:
		return fmt.Sprintf("fenced %s %d", e.Lock, e.HighWater)
	case *RejectedEvent:
		epoch, high := "-", "-"
		if e.Epoch != nil {
			epoch = fmt.Sprint(*e.Epoch)
		}
		if e.HighWater != nil {
			high = fmt.Sprint(*e.HighWater)
		}
		return fmt.Sprintf("rejected %s %s %s %s", e.Lock, e.Code, epoch, high)
	case *ResetEvent:
		return "reset " + e.Reason
	}
	return fmt.Sprintf("%T", e)
}

// A lock's stream carries its grants, mark advances, refusals, releases and expiries, in
// order and typed; a prefix stream carries the locks under its prefix only.
func TestAStreamCarriesALocksEventsInOrder(t *testing.T) {
	c, ctx := server(t), context.Background()
	stream := c.Watch("orders")
	defer stream.Close()
	prefixed := c.Events("ord")
	defer prefixed.Close()
	for _, s := range []*EventStream{stream, prefixed} {
		if err := s.Connect(ctx); err != nil {
			t.Fatal(err)
		}
	}
	a := hold(t, c, "orders", "a")
	hold(t, c, "other", "x")
	if _, err := c.Put(ctx, "orders", "k", []byte("v"), a.Token); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, a.LeaseID); err != nil {
		t.Fatal(err)
	}
	b := hold(t, c, "orders", "b")
	if _, err := c.Fence(ctx, "orders", b.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "orders", "k", []byte("late"), a.Token); !IsFenced(err) {
		t.Fatal(err)
	}
	if err := c.Release(ctx, b.LeaseID); err != nil {
		t.Fatal(err)
	}
	e, err := c.Acquire(ctx, "orders", AcquireOptions{Holder: "e", TTL: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		fmt.Sprintf("granted orders %d a", a.Epoch),
		fmt.Sprintf("fenced orders %d", a.Epoch),
		fmt.Sprintf("released orders %d a release", a.Epoch),
		fmt.Sprintf("granted orders %d b", b.Epoch),
		fmt.Sprintf("fenced orders %d", b.Epoch),
		fmt.Sprintf("rejected orders stale_token %d %d", a.Epoch, b.Epoch),
		fmt.Sprintf("released orders %d b release", b.Epoch),
		fmt.Sprintf("granted orders %d e", e.Epoch),
		fmt.Sprintf("expired orders %d e", e.Epoch),
	}
	for _, s := range []*EventStream{stream, prefixed} {
		var last uint64
		for i, w := range want {
			event := next(t, s)
			if got := describe(event); got != w {
				t.Fatalf("event %d: %q, want %q", i, got, w)
			}
			if event.Meta().ID <= last || event.Meta().AtMs == 0 {
				t.Fatalf("ids out of order: %+v after %d", event.Meta(), last)
			}
			last = event.Meta().ID
			if id, ok := s.LastEventID(); !ok || id != last {
				t.Fatalf("LastEventID %d %v", id, ok)
			}
		}
	}
	if stream.Connections() != 1 || !stream.Streaming() {
		t.Fatalf("connections %d", stream.Connections())
	}
	if err := stream.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Next(ctx); !errors.Is(err, ErrStreamClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// A connection cut while events happen is reopened with Last-Event-ID: the events of the
// gap arrive after it, none twice, no reset.
func TestAStreamResumesAfterACut(t *testing.T) {
	base := serve(t)
	direct, ctx := New(base), context.Background()
	p := newProxy(t, base)
	stream := New(p.url()).Watch("orders")
	defer stream.Close()
	if err := stream.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	a := hold(t, direct, "orders", "a")
	if got := describe(next(t, stream)); got != fmt.Sprintf("granted orders %d a", a.Epoch) {
		t.Fatal(got)
	}
	p.hold()
	p.cut()
	eventually(t, 10*time.Second, "the stream reconnecting", func() bool { return p.connections() == 2 })
	// The stream is away: these happen in the gap.
	if err := direct.Release(ctx, a.LeaseID); err != nil {
		t.Fatal(err)
	}
	b := hold(t, direct, "orders", "b")
	if _, err := direct.Put(ctx, "orders", "k", []byte("v"), b.Token); err != nil {
		t.Fatal(err)
	}
	p.release()
	for _, want := range []string{
		fmt.Sprintf("released orders %d a release", a.Epoch),
		fmt.Sprintf("granted orders %d b", b.Epoch),
		fmt.Sprintf("fenced orders %d", b.Epoch),
	} {
		if got := describe(next(t, stream)); got != want {
			t.Fatalf("%q, want %q", got, want)
		}
	}
	if stream.Connections() != 2 {
		t.Fatalf("connections %d", stream.Connections())
	}
	var transport *TransportError
	if !errors.As(stream.LastError(), &transport) {
		t.Fatalf("the cut is not the last failure: %#v", stream.LastError())
	}
}

// A new stream resumes after an id of an earlier one; an id the server does not hold
// starts with a reset.
func TestAStreamResumesAfterAnIdOrResets(t *testing.T) {
	c, ctx := server(t), context.Background()
	first := c.Watch("orders")
	if err := first.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	a := hold(t, c, "orders", "a")
	next(t, first)
	id, _ := first.LastEventID()
	first.Close()
	if err := c.Release(ctx, a.LeaseID); err != nil {
		t.Fatal(err)
	}
	resumed := c.Watch("orders").ResumeAfter(id)
	defer resumed.Close()
	if got := describe(next(t, resumed)); got != fmt.Sprintf("released orders %d a release", a.Epoch) {
		t.Fatal(got)
	}
	unknown := c.Watch("orders").ResumeAfter(1)
	defer unknown.Close()
	if got := describe(next(t, unknown)); got != "reset unknown_last_event_id" {
		t.Fatal(got)
	}
}

// A refusal that retrying will not change ends the stream with its error; too many
// streams (429) is retried until a place frees.
func TestStreamFailures(t *testing.T) {
	c, ctx := New(serve(t, "--max-event-subscribers", "1")), context.Background()
	bad := c.Events("no spaces in lock names")
	var api *APIError
	if _, err := bad.Next(ctx); !errors.As(err, &api) || api.Code != "bad_request" {
		t.Fatalf("%#v", err)
	}
	if _, err := bad.Next(ctx); !errors.As(err, &api) {
		t.Fatalf("a second Next: %#v", err)
	}
	bad.Close()
	first := c.Watch("orders")
	if err := first.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	second := c.Watch("orders")
	defer second.Close()
	connected := make(chan error, 1)
	go func() { connected <- second.Connect(ctx) }()
	var quota *QuotaExceededError
	eventually(t, 10*time.Second, "a 429 retried", func() bool { return errors.As(second.LastError(), &quota) })
	if quota.Resource != "event_subscribers" || second.Streaming() {
		t.Fatalf("%+v", quota)
	}
	first.Close()
	select {
	case err := <-connected:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second stream never got the place")
	}
	a := hold(t, c, "orders", "a")
	if got := describe(next(t, second)); got != fmt.Sprintf("granted orders %d a", a.Epoch) {
		t.Fatal(got)
	}
	if _, err := c.Watch("..").Next(ctx); !errors.Is(err, ErrUnsendablePath) {
		t.Fatalf("%v", err)
	}
}

// The parser keeps data lines only, joins them, and drops an event holding a line over
// its bound without accumulating it.
func TestTheEventParserIsBounded(t *testing.T) {
	huge := strings.Repeat("x", maxEventLine+10)
	stream := strings.Join([]string{
		": keep-alive", "",
		"event: granted", "id: 1", `data: {"id":1,"at_ms":2,"type":"granted","lock":"a","epoch":3,"holder":"h","ttl_ms":4}`, "",
		"data: " + huge, "",
		`data: {"id":5,"at_ms":2,"type":"new_kind"}`, "",
		`data: {"id":6,"at_ms":2,"type":"expired","lock":"a","holder":"h"}`, "",
		`data: {"id":7,"at_ms":2,`, `data: "type":"reset","reason":"lagged"}`, "", "",
	}, "\r\n")
	s := New("http://127.0.0.1:1").stream("/")
	var got []string
	go func() {
		_, _ = s.read(strings.NewReader(stream), func() {}, new(*uint64))
		close(s.events)
	}()
	for event := range s.events {
		got = append(got, describe(event))
	}
	// The unknown type and the event missing its epoch are skipped; the huge line is
	// dropped whole.
	if fmt.Sprint(got) != "[granted a 3 h reset lagged]" {
		t.Fatalf("%q", got)
	}
}

// A line over the bound is answered as too long and never accumulated, and the next line
// reads intact; data adding up past the bound drops its event and holds no more than the
// bound.
func TestLongLinesAreDroppedNotAccumulated(t *testing.T) {
	input := strings.Repeat("x", 3*maxEventLine) + "\nnext\n"
	reader := bufio.NewReaderSize(strings.NewReader(input), eventStreamReadBufferBytes)
	line, tooLong, err := readLine(reader, maxEventLine)
	if err != nil || !tooLong || line != nil {
		t.Fatalf("%d bytes, too long %v, %v", len(line), tooLong, err)
	}
	line, tooLong, err = readLine(reader, maxEventLine)
	if err != nil || tooLong || string(line) != "next" {
		t.Fatalf("%q %v %v", line, tooLong, err)
	}
	var p sseParser
	half := []byte("data: " + strings.Repeat("y", maxEventLine/2+1))
	for i := 0; i < 3; i++ {
		if _, ok := p.line(half); ok {
			t.Fatal("an event before its blank line")
		}
		if cap(p.data) > maxEventLine {
			t.Fatalf("holds %d bytes", cap(p.data))
		}
	}
	if _, ok := p.line(nil); ok {
		t.Fatal("an oversized event was answered")
	}
	p.line([]byte(`data: {"id":1}`))
	if data, ok := p.line(nil); !ok || string(data) != `{"id":1}` {
		t.Fatalf("the next event: %q %v", data, ok)
	}
}
