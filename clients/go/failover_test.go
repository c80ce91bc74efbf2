// Tests of failover: scripted nodes (refusing, answering 503, dropping answers) in
// front of a real server.

package palisade

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// node is a scripted endpoint in front of a real server: each request it gets is
// answered by the next behaviour of its script (then "forward" once the script is done):
//
//	forward       pass it to the server and its answer back
//	503           answer 503 unavailable without passing it on
//	drop          close the connection without answering or passing it on
//	forward-drop  pass it to the server, then close the connection without answering
type node struct {
	*httptest.Server
	real   string
	mu     sync.Mutex
	script []string
	got    []*http.Request
}

func newNode(t *testing.T, real string, script ...string) *node {
	t.Helper()
	n := &node{real: real, script: script}
	n.Server = httptest.NewServer(http.HandlerFunc(n.serve))
	t.Cleanup(n.Close)
	return n
}

func (n *node) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	n.mu.Lock()
	n.got = append(n.got, r)
	behaviour := "forward"
	if len(n.script) > 0 {
		behaviour, n.script = n.script[0], n.script[1:]
	}
	n.mu.Unlock()
	drop := func() {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}
	switch behaviour {
	case "503":
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"code":"unavailable","message":"shutting down"}}`))
	case "drop":
		drop()
	case "forward", "forward-drop":
		request, _ := http.NewRequest(r.Method, n.real+r.URL.RequestURI(), bytes.NewReader(body))
		request.Header = r.Header.Clone()
		response, err := http.DefaultClient.Do(request)
		if err != nil {
			drop()
			return
		}
		answer, _ := io.ReadAll(response.Body)
		response.Body.Close()
		if behaviour == "forward-drop" {
			drop()
			return
		}
		for name, values := range response.Header {
			w.Header()[name] = values
		}
		w.WriteHeader(response.StatusCode)
		_, _ = w.Write(answer)
	}
}

// then sets the node's script anew.
func (n *node) then(script ...string) {
	n.mu.Lock()
	n.script = script
	n.mu.Unlock()
}

// header is header name of the i-th request the node got.
func (n *node) header(i int, name string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.got[i].Header.Get(name)
}

// requests is how many requests the node got.
func (n *node) requests() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.got)
}

// dead is a loopback URL nothing listens on (connections refused).
func dead(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close()
	return url
}

// A call moves past a node that cannot be reached and one that answers 503, to the node
// that answers; the next calls start there.
func TestFailoverPassesDeadAndUnavailableNodes(t *testing.T) {
	real := serve(t)
	unavailable := newNode(t, real, "503", "503", "503")
	c, err := NewClient([]string{dead(t), unavailable.URL, real})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// An acquire moves on past both: nothing was applied on either.
	guard := holdGuard(t, c, "orders", AcquireOptions{Holder: "a", TTL: 900 * time.Millisecond})
	if unavailable.requests() != 1 {
		t.Fatalf("the 503 node got %d requests", unavailable.requests())
	}
	if _, err := guard.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // a few renewals
	if _, err := c.Get(ctx, "orders", "k"); err != nil || guard.Err() != nil {
		t.Fatal(err, guard.Err())
	}
	if unavailable.requests() != 1 {
		t.Fatalf("calls after the failover went back to the 503 node: %d", unavailable.requests())
	}
	// Every node down: a *TransportError naming each attempt, not sent anywhere.
	down, _ := NewClient([]string{dead(t), dead(t)})
	_, err = down.Get(ctx, "orders", "k")
	var transport *TransportError
	if !errors.As(err, &transport) || transport.OutcomeUnknown || len(transport.Attempts) != 2 {
		t.Fatalf("%#v", err)
	}
	// One node, answering 503: its answer is the outcome.
	_, err = New(newNode(t, real, "503").URL).Get(ctx, "orders", "k")
	var api *APIError
	if !errors.As(err, &api) || api.Code != "unavailable" || api.Status != 503 {
		t.Fatalf("%#v", err)
	}
}

// An acquire whose answer was lost is not resent (a second acquire would be a second
// lease): *TransportError with OutcomeUnknown, and the next node never saw it. A read in
// the same position is resent.
func TestALostAcquireIsNotResent(t *testing.T) {
	real := serve(t)
	lossy := newNode(t, real, "drop", "drop", "drop")
	c, err := NewClient([]string{lossy.URL, real})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err = c.Acquire(ctx, "orders", AcquireOptions{Holder: "a", TTL: time.Second})
	var transport *TransportError
	if !errors.As(err, &transport) || !transport.OutcomeUnknown || len(transport.Attempts) != 1 {
		t.Fatalf("%#v", err)
	}
	direct := New(real)
	status, err := direct.LockStatus(ctx, "orders")
	if err != nil || status.Holder != nil || status.Epoch != 0 {
		t.Fatalf("the acquire was resent: %+v %v", status, err)
	}
	if _, err := c.CreateSession(ctx, SessionOptions{Holder: "a", TTL: time.Second}); !errors.As(err, &transport) || !transport.OutcomeUnknown {
		t.Fatalf("a session's creation: %#v", err)
	}
	if _, err := c.LockStatus(ctx, "orders"); err != nil {
		t.Fatalf("a read is resent: %v", err)
	}
	if lossy.requests() != 3 {
		t.Fatalf("the lossy node got %d requests", lossy.requests())
	}
}

// A fenced write whose answer was lost after the node applied it is resent to the next
// node with the same Idempotency-Key (a client with several endpoints adds one): the
// answer is the first outcome, marked replayed, and the write is applied once.
func TestALostWriteIsResentWithItsKeyAndReplayed(t *testing.T) {
	real := serve(t)
	lossy := newNode(t, real, "forward-drop")
	c, err := NewClient([]string{lossy.URL, real})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lease := hold(t, New(real), "orders", "a")
	written, err := c.Put(ctx, "orders", "k", []byte("once"), lease.Token)
	if err != nil || !written.Replayed {
		t.Fatalf("%+v %v", written, err)
	}
	key := lossy.header(0, "Idempotency-Key")
	if !strings.HasPrefix(key, "go-") || len(key) != 35 {
		t.Fatalf("the write carried key %q", key)
	}
	entry, err := c.Get(ctx, "orders", "k")
	if err != nil || entry.Revision != written.Revision || string(entry.Value) != "once" {
		t.Fatalf("%+v %v", entry, err)
	}
	// The barrier too (a new client starts at the lossy node again).
	lossy.then("forward-drop")
	c, _ = NewClient([]string{lossy.URL, real})
	if fenced, err := c.Fence(ctx, "orders", lease.Token); err != nil || fenced.HighWater != lease.Epoch {
		t.Fatalf("%+v %v", fenced, err)
	}
	if barrierKey := lossy.header(1, "Idempotency-Key"); !strings.HasPrefix(barrierKey, "go-") || barrierKey == key {
		t.Fatalf("the barrier carried key %q", barrierKey)
	}
}

// With one endpoint, a call that is safe to resend gets one more try on it after a lost
// answer (a keep-alive connection the server closed fails that way); a write without an
// idempotency key is not resent: its outcome is unknown, and here it was applied.
func TestOneEndpointResendsOnlyWhatIsSafe(t *testing.T) {
	real := serve(t)
	flaky := newNode(t, real, "drop")
	c, ctx := New(flaky.URL), context.Background()
	if _, err := c.LockStatus(ctx, "orders"); err != nil || flaky.requests() != 2 {
		t.Fatalf("%v after %d requests", err, flaky.requests())
	}
	lease := hold(t, c, "orders", "a")
	flaky.then("forward-drop")
	before := flaky.requests()
	_, err := c.Put(ctx, "orders", "k", []byte("v"), lease.Token)
	var transport *TransportError
	if !errors.As(err, &transport) || !transport.OutcomeUnknown || flaky.requests() != before+1 {
		t.Fatalf("%#v after %d requests", err, flaky.requests()-before)
	}
	if entry, err := c.Get(ctx, "orders", "k"); err != nil || string(entry.Value) != "v" {
		t.Fatalf("the write whose answer was lost: %+v %v", entry, err)
	}
}
