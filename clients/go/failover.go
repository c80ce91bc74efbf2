// Failover between the endpoints of one deployment: how every request of the client is
// sent, which failures may move a call to the next node, and which may not (the rules of
// the Python client's _failover.py, docs/python.md "Several servers: failover").
//
// A call moves to the next endpoint when the current one could not be reached (no
// connection: refused, timed out, a failed TLS handshake or a TLS session the server
// refused) or answered 503. A call whose
// request may already have been applied (it was sent and no answer came back) moves on
// only if resending it cannot apply it twice: reads, renewals, releases, token checks and
// writes carrying an Idempotency-Key. A client with several endpoints puts a fresh key on
// every fenced write and barrier, so a resend is answered with the first outcome. An
// acquire (or a session's creation) whose answer was lost is never resent: a second one
// would be a second lease. A call that is safe to resend gets one more try on an endpoint
// that lost its answer, after the others (a keep-alive connection the server closed
// between two requests fails exactly that way).

package palisade

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"
)

// retryClass is how freely a call may be resent to the next endpoint.
type retryClass int

const (
	// retrySafe: resending cannot change the outcome.
	retrySafe retryClass = iota
	// retryUnlessUnknown: resent when no node got it or a node answered 503, not when
	// the answer was lost (an acquire: resending could take a second lease).
	retryUnlessUnknown
	// retryOnlyUnreachable: resent only when it surely reached no node (a write without
	// an idempotency key: a 503 from a replicated backend may come after it was applied).
	retryOnlyUnreachable
)

// failure is how one attempt on one endpoint failed.
type failure int

const (
	// unreachable: the request was never sent.
	unreachable failure = iota
	// unavailable: the node answered 503.
	unavailable
	// unknownOutcome: the request was sent and no answer came back.
	unknownOutcome
)

// mayTryNext says whether a call of class r may move on after a failure f.
func mayTryNext(r retryClass, f failure) bool {
	switch f {
	case unreachable:
		return true
	case unavailable:
		return r != retryOnlyUnreachable
	default:
		return r == retrySafe
	}
}

// endpoints are the base URLs of one deployment, tried in order starting from the last
// one that answered (so a dead node costs one failed connection, not one per call).
type endpoints struct {
	bases     []string
	mu        sync.Mutex
	preferred int
}

func (e *endpoints) order() []string {
	e.mu.Lock()
	start := e.preferred
	e.mu.Unlock()
	return append(append([]string{}, e.bases[start:]...), e.bases[:start]...)
}

func (e *endpoints) prefer(base string) {
	for i, b := range e.bases {
		if b == base {
			e.mu.Lock()
			e.preferred = i
			e.mu.Unlock()
			return
		}
	}
}

// call is one API request, ready for any endpoint: {base}{path}.
type call struct {
	method      string
	path        string
	body        []byte
	contentType string
	headers     http.Header
	// timeout bounds each attempt (for a stream: until its answer's head arrives).
	timeout time.Duration
	retry   retryClass
	// stream leaves the answer's body unbounded in time (the events streams).
	stream bool
}

// exchange sends k over the endpoints and returns the answer that is its outcome, whatever
// its status, with the function that releases it (call it once the body is read). A call
// that gets no such answer is a *TransportError.
func (c *Client) exchange(ctx context.Context, k call) (*http.Response, func(), error) {
	if c.err != nil {
		return nil, nil, c.err
	}
	queue := c.endpoints.order()
	resent := map[string]bool{}
	var tried []string
	unknown := false
	var last error
	fail := func(err error) error {
		attempts := append([]string(nil), tried...)
		return &TransportError{Method: k.method, Path: k.path, Attempts: attempts, OutcomeUnknown: unknown, Err: err}
	}
	for len(queue) > 0 {
		base := queue[0]
		queue = queue[1:]
		if err := ctx.Err(); err != nil {
			tried = append(tried, fmt.Sprintf("%s: not tried: %v", base, err))
			return nil, nil, fail(err)
		}
		response, release, f, err := c.attempt(ctx, base, k)
		if err == nil {
			if response.StatusCode == http.StatusServiceUnavailable && len(queue) > 0 && mayTryNext(k.retry, unavailable) {
				answer, _ := io.ReadAll(io.LimitReader(response.Body, 1<<20))
				release()
				tried = append(tried, base+": HTTP 503")
				last = ParseError(response.StatusCode, answer)
				continue
			}
			c.endpoints.prefer(base)
			return response, release, nil
		}
		unknown = unknown || f == unknownOutcome
		tried = append(tried, fmt.Sprintf("%s: %v", base, err))
		last = fail(err)
		if ctx.Err() != nil || f < 0 || !mayTryNext(k.retry, f) {
			return nil, nil, last
		}
		if f == unknownOutcome && !resent[base] {
			// After the other endpoints: a node that lost one answer may be going down.
			resent[base] = true
			queue = append(queue, base)
		}
	}
	if last == nil {
		last = fail(errors.New("no endpoint to send to"))
	}
	return nil, nil, last
}

// attempt sends k to one endpoint. On failure it says how the request failed: -1 for a
// mistake no other endpoint would fix (the request could not even be made).
func (c *Client) attempt(ctx context.Context, base string, k call) (*http.Response, func(), failure, error) {
	var asked, got atomic.Bool
	trace := &httptrace.ClientTrace{
		GetConn: func(string) { asked.Store(true) },
		GotConn: func(httptrace.GotConnInfo) { got.Store(true) },
	}
	var actx context.Context
	var cancel context.CancelFunc
	var timer *time.Timer
	if k.stream {
		actx, cancel = context.WithCancel(ctx)
		timer = time.AfterFunc(k.timeout, cancel)
	} else {
		actx, cancel = context.WithTimeout(ctx, k.timeout)
	}
	var body io.Reader
	if k.body != nil {
		body = bytes.NewReader(k.body)
	}
	request, err := http.NewRequestWithContext(httptrace.WithClientTrace(actx, trace), k.method, base+k.path, body)
	if err != nil {
		cancel()
		return nil, nil, -1, err
	}
	for name, values := range k.headers {
		request.Header[name] = values
	}
	if k.contentType != "" {
		request.Header.Set("Content-Type", k.contentType)
	}
	if c.key != "" {
		request.Header.Set("Authorization", "Bearer "+c.key)
	}
	request.Header.Set("User-Agent", "palisade-go")
	response, err := c.http.Do(request)
	if timer != nil && !timer.Stop() && err == nil {
		// The head arrived as the timer cancelled the request: too late to read.
		response.Body.Close()
		err = fmt.Errorf("no answer within %v", k.timeout)
	}
	if err != nil {
		cancel()
		switch {
		case !asked.Load():
			return nil, nil, -1, err
		case !got.Load():
			return nil, nil, unreachable, err
		case tlsAlert(err):
			// The server refused the TLS session (under TLS 1.3 a client certificate is
			// refused after the client's side of the handshake): nothing it sent was read.
			return nil, nil, unreachable, err
		default:
			return nil, nil, unknownOutcome, err
		}
	}
	release := func() {
		response.Body.Close()
		cancel()
	}
	return response, release, 0, nil
}

// tlsAlert says whether err is a TLS alert the server sent (crypto/tls reports one as a
// *net.OpError whose Op is "remote error"): the server ended the TLS session.
func tlsAlert(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error"
}
