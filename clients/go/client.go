// The client: its settings (endpoints, key, timeouts), how a call is sent and its answer
// read, and the issuer's lock calls (acquire, keepalive, release, proclaim, lock status).

package palisade

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Client speaks the HTTP API (docs/api.md) of one Palisade deployment: one server, or the
// nodes of one deployment for failover (NewClient). It is safe for concurrent use. Every
// failure the server answers is a typed error (ParseError); a call refused before sending
// is an *APIError with Status 0; a call that got no answer is a *TransportError.
type Client struct {
	endpoints      *endpoints
	http           *http.Client
	key            string
	timeout        time.Duration
	connectTimeout time.Duration
	tls            tlsSettings
	// deadlines: how its leases and sessions derive their deadlines (WithDeadlines).
	deadlines Deadlines
	// err is a setting that did not check out (New): every call returns it.
	err error
}

// Option sets up a Client.
type Option func(*Client)

// WithKey sends key as the bearer key of every request (a server with authentication).
func WithKey(key string) Option { return func(c *Client) { c.key = key } }

// WithHTTPClient uses h for every request (a proxy, your own transport). Leave its
// Timeout unset: WithTimeout bounds each request, and an acquisition that waits in line
// or an events stream needs more. It cannot be combined with the TLS options (configure
// TLS on h's transport then).
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// WithTimeout bounds each request (30 s by default), each attempt on its own when the
// client fails over; an acquisition that waits in line gets its Wait on top. The
// caller's context may end a request sooner.
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithConnectTimeout bounds establishing a connection, TLS handshake included (3 s by
// default, at most the request timeout), so that a node that does not answer is passed
// over quickly. Not used with WithHTTPClient.
func WithConnectTimeout(d time.Duration) Option { return func(c *Client) { c.connectTimeout = d } }

// New is a client of the server at baseURL (http://127.0.0.1:7070, say). It never fails:
// a URL or option that NewClient would refuse makes every call of the client return that
// error. Use NewClient to see it at once, or to give several endpoints.
func New(baseURL string, opts ...Option) *Client {
	return build([]string{baseURL}, opts)
}

// NewClient is a client of the nodes of one deployment (several stateless nodes over
// etcd, docs/deployment.md), tried in order from the last one that answered: a call
// moves on when a node cannot be reached or answers 503, under the rules of failover.go
// (docs/go.md). With several endpoints, every fenced write and barrier carries an
// Idempotency-Key (a fresh one unless the caller gave one), so that a resent write is
// never applied twice. It refuses a URL that is not http(s)://host[:port] (with no query
// or fragment), repeated URLs, a TLS option with an http:// URL, a CA or certificate
// file that does not load, and Deadlines that cannot hold (WithDeadlines).
func NewClient(baseURLs []string, opts ...Option) (*Client, error) {
	c := build(baseURLs, opts)
	if c.err != nil {
		return nil, c.err
	}
	return c, nil
}

func build(baseURLs []string, opts []Option) *Client {
	c := &Client{timeout: 30 * time.Second, connectTimeout: 3 * time.Second, deadlines: DefaultDeadlines()}
	for _, opt := range opts {
		opt(c)
	}
	bases, err := normaliseBases(baseURLs)
	c.endpoints = &endpoints{bases: bases}
	if err != nil {
		c.err = err
		return c
	}
	if c.timeout <= 0 || c.connectTimeout <= 0 {
		c.err = badRequest("timeouts must be positive")
		return c
	}
	if err := c.deadlines.check(); err != nil {
		c.err = err
		return c
	}
	c.err = c.setUpTransport(bases)
	return c
}

// normaliseBases checks each base URL and drops a trailing "/".
func normaliseBases(urls []string) ([]string, error) {
	if len(urls) == 0 {
		return nil, badRequest("at least one server URL is needed")
	}
	seen := map[string]bool{}
	var bases []string
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, badRequest("server URL %q is not http(s)://host[:port]", raw)
		}
		if u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(raw, "?#") {
			return nil, badRequest("server URL %q must not have a query or fragment", raw)
		}
		base := strings.TrimRight(raw, "/")
		if seen[base] {
			return nil, badRequest("server URL %q is given twice", raw)
		}
		seen[base] = true
		bases = append(bases, base)
	}
	return bases, nil
}

// authenticated says whether the server will name the caller (a key, or a client
// certificate): the holder is then the caller's principal.
func (c *Client) authenticated() bool {
	return c.key != "" || c.tls.certFile != "" || (c.tls.config != nil && len(c.tls.config.Certificates) > 0)
}

// holderFor is the holder an acquisition sends: the one given; none with credentials
// (the principal is the holder); otherwise <hostname>/<pid>, as a server without
// authentication needs one.
func (c *Client) holderFor(holder string) string {
	if holder != "" || c.authenticated() {
		return holder
	}
	host, _ := os.Hostname()
	label := strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, fmt.Sprintf("%s/%d", host, os.Getpid()))
	if len(label) > 200 {
		label = strings.ToValidUTF8(label[:200], "")
	}
	return label
}

// jsonCall is a call with a JSON body (none when body is nil).
func (c *Client) jsonCall(method, path string, body any, retry retryClass) (call, error) {
	k := call{method: method, path: path, timeout: c.timeout, retry: retry}
	if body != nil {
		encoded, err := json.Marshal(body)
		if err != nil {
			return k, badRequest("cannot encode the request: %v", err)
		}
		k.body, k.contentType = encoded, "application/json"
	}
	return k, nil
}

// do sends k and reads the answer: a 200's JSON into out (when out is not nil) with the
// required fields present and not null; any other status as its typed error. It returns
// the answer's headers.
func (c *Client) do(ctx context.Context, k call, out any, required ...string) (http.Header, error) {
	answer, headers, err := c.raw(ctx, k)
	if err != nil {
		return nil, err
	}
	if out != nil {
		if err := decode(http.StatusOK, answer, out, required); err != nil {
			return nil, err
		}
	}
	return headers, nil
}

// into is do into a new T, which it answers.
func into[T any](ctx context.Context, c *Client, k call, required ...string) (*T, error) {
	var out T
	if _, err := c.do(ctx, k, &out, required...); err != nil {
		return nil, err
	}
	return &out, nil
}

// raw sends k and answers a 200's body and headers; any other status is its typed error.
func (c *Client) raw(ctx context.Context, k call) ([]byte, http.Header, error) {
	response, release, err := c.exchange(ctx, k)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	answer, err := io.ReadAll(io.LimitReader(response.Body, 16<<20))
	if err != nil {
		return nil, nil, &TransportError{Method: k.method, Path: k.path, OutcomeUnknown: response.StatusCode == http.StatusOK,
			Attempts: []string{"the answer's body broke off: " + err.Error()}, Err: err}
	}
	if response.StatusCode != http.StatusOK {
		return nil, nil, ParseError(response.StatusCode, answer)
	}
	return answer, response.Header, nil
}

// decode reads a success's JSON into out, strictly: a field of another type, or a
// required field missing or null, is a *DecodeError (never a zero value invented).
func decode(status int, answer []byte, out any, required []string) error {
	bad := func(why string) error {
		return &DecodeError{Status: status, Snippet: fmt.Sprintf("%s: %.200s", why, answer)}
	}
	if err := json.Unmarshal(answer, out); err != nil {
		return bad(err.Error())
	}
	if len(required) > 0 {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(answer, &fields); err != nil {
			return bad(err.Error())
		}
		for _, name := range required {
			if raw, ok := fields[name]; !ok || string(raw) == "null" {
				return bad("field " + name + " is missing")
			}
		}
	}
	return nil
}

// Health returns nil when a server answers and its store has not latched a failure
// (GET /healthz; an *APIError storage_failed when it has).
func (c *Client) Health(ctx context.Context) error {
	k, _ := c.jsonCall(http.MethodGet, "/healthz", nil, retrySafe)
	_, err := c.do(ctx, k, nil)
	return err
}

// AcquireOptions are the settings of one acquisition.
type AcquireOptions struct {
	// Holder names who holds the lease (with authentication: a label after the
	// principal's name). Empty: <hostname>/<pid> without credentials, the principal with
	// them.
	Holder string
	// TTL is how long the lease lives without a keepalive (whole milliseconds, at least
	// 50 ms). Leave it zero with Session: the session's TTL applies.
	TTL time.Duration
	// Wait is how long to wait in the lock's first-come first-served line (at most
	// 300 s); 0 refuses at once with *LockHeldError when the lock is held.
	Wait time.Duration
	// Value is what the holder advertises (at most 4096 bytes; lock status shows it to
	// everyone who may see the lock). Nil sends none.
	Value []byte
	// LockDelay is how long the lock stays ungrantable if this lease expires (not when
	// it is released). Zero leaves the server's --lock-delay-ms; a negative value asks
	// for none, whatever the server's default.
	LockDelay time.Duration
	// Session acquires inside this session (a session id): the lease takes the session's
	// TTL, is renewed by the session's keepalives and ends with it. Prefer
	// SessionGuard.Acquire.
	Session string
}

// Lease is a granted lock: its epoch and the signed token every write it guards carries.
type Lease struct {
	Lock        string `json:"lock"`
	Holder      string `json:"holder"`
	Epoch       uint64 `json:"epoch"`
	Token       string `json:"token"`
	LeaseID     string `json:"lease_id"`
	TTLMs       uint64 `json:"ttl_ms"`
	LockDelayMs uint64 `json:"lock_delay_ms"`
	// Value is what the lease advertises (nil: none).
	Value []byte `json:"value"`
	// Session is the session the lease belongs to ("" for none).
	Session string `json:"session"`
}

// MaxWait is the longest wait in line an acquisition may ask for.
const MaxWait = 300 * time.Second

// Acquire takes lock (POST /v1/locks/{lock}/acquire). An acquisition whose answer was
// lost is not resent (it would take a second lease): *TransportError with
// OutcomeUnknown, and a lease it may have created ends after its TTL.
func (c *Client) Acquire(ctx context.Context, lock string, opts AcquireOptions) (*Lease, error) {
	name, err := segment("lock name", lock)
	if err != nil {
		return nil, err
	}
	body := map[string]any{}
	if opts.Session == "" {
		if opts.TTL < 50*time.Millisecond {
			return nil, badRequest("TTL must be at least 50 ms, not %v", opts.TTL)
		}
		body["ttl_ms"] = opts.TTL.Milliseconds()
	} else {
		if opts.TTL != 0 {
			return nil, badRequest("a lock in a session takes the session's TTL: leave TTL zero")
		}
		body["session"] = opts.Session
	}
	if opts.Wait < 0 || opts.Wait > MaxWait {
		return nil, badRequest("Wait must be from 0 to %v, not %v", MaxWait, opts.Wait)
	}
	if opts.Wait > 0 {
		body["wait_ms"] = opts.Wait.Milliseconds()
	}
	if holder := c.holderFor(opts.Holder); holder != "" {
		body["holder"] = holder
	}
	if opts.Value != nil {
		body["value"] = base64.StdEncoding.EncodeToString(opts.Value)
	}
	switch {
	case opts.LockDelay > 0:
		body["lock_delay_ms"] = opts.LockDelay.Milliseconds()
	case opts.LockDelay < 0:
		body["lock_delay_ms"] = 0
	}
	k, err := c.jsonCall(http.MethodPost, "/v1/locks/"+name+"/acquire", body, retryUnlessUnknown)
	if err != nil {
		return nil, err
	}
	k.timeout += opts.Wait
	return into[Lease](ctx, c, k, "lock", "holder", "epoch", "token", "lease_id", "ttl_ms")
}

// KeepAliveInfo is the answer to a keepalive: the lease runs TTLMs from the moment the
// server handled it.
type KeepAliveInfo struct {
	LeaseID string `json:"lease_id"`
	Lock    string `json:"lock"`
	Epoch   uint64 `json:"epoch"`
	TTLMs   uint64 `json:"ttl_ms"`
}

// KeepAlive renews a lease for a full TTL from now (a lease in a session renews its
// whole session); *APIError with code lease_expired when it is gone.
func (c *Client) KeepAlive(ctx context.Context, leaseID string) (*KeepAliveInfo, error) {
	id, err := segment("lease id", leaseID)
	if err != nil {
		return nil, err
	}
	k, _ := c.jsonCall(http.MethodPost, "/v1/leases/"+id+"/keepalive", nil, retrySafe)
	return into[KeepAliveInfo](ctx, c, k, "lease_id", "lock", "epoch", "ttl_ms")
}

// Release gives a lease up; the lock passes to the next in line at once (no
// lock-delay). *APIError lease_expired when it is gone.
func (c *Client) Release(ctx context.Context, leaseID string) error {
	id, err := segment("lease id", leaseID)
	if err != nil {
		return err
	}
	k, _ := c.jsonCall(http.MethodPost, "/v1/leases/"+id+"/release", nil, retrySafe)
	_, err = c.do(ctx, k, nil)
	return err
}

// Proclaimed is the answer to a proclaim: the lease's new value (nil: cleared); its epoch
// and deadline did not change.
type Proclaimed struct {
	LeaseID string `json:"lease_id"`
	Lock    string `json:"lock"`
	Epoch   uint64 `json:"epoch"`
	Value   []byte `json:"value"`
}

// Proclaim replaces what lease leaseID advertises (POST /v1/leases/{id}/proclaim); nil
// clears it. Its owner only (*PermissionDeniedError for anyone else); more than 4096
// bytes is *PayloadTooLargeError.
func (c *Client) Proclaim(ctx context.Context, leaseID string, value []byte) (*Proclaimed, error) {
	id, err := segment("lease id", leaseID)
	if err != nil {
		return nil, err
	}
	body := map[string]any{"value": nil}
	if value != nil {
		body["value"] = base64.StdEncoding.EncodeToString(value)
	}
	// Replacing a value twice leaves what replacing it once does: safe to resend.
	k, err := c.jsonCall(http.MethodPost, "/v1/leases/"+id+"/proclaim", body, retrySafe)
	if err != nil {
		return nil, err
	}
	return into[Proclaimed](ctx, c, k, "lease_id", "lock", "epoch")
}

// LockStatus is one lock as GET /v1/locks/{lock} shows it. Epoch is the lock's one epoch:
// the live lease's while it is held, the last one granted while it is free (0 if never
// acquired). The pointer fields are nil while the lock is free (LeaseID and Session also
// for a caller who does not own the lease, with authentication on).
type LockStatus struct {
	Lock        string  `json:"lock"`
	Epoch       uint64  `json:"epoch"`
	Holder      *string `json:"holder"`
	LeaseID     *string `json:"lease_id"`
	RemainingMs *uint64 `json:"remaining_ms"`
	// Waiters is how many acquisitions wait in the lock's line.
	Waiters uint64 `json:"waiters"`
	// LeaseEpoch is the live lease's epoch (its token's).
	LeaseEpoch *uint64 `json:"lease_epoch"`
	// Value is what the holder advertises (nil: none, or free).
	Value       []byte  `json:"value"`
	LockDelayMs *uint64 `json:"lock_delay_ms"`
	Session     *string `json:"session"`
	// EpochBound: no epoch above it was granted for the lock (absent from older servers).
	EpochBound *uint64 `json:"epoch_bound"`
}

var lockStatusFields = []string{"lock", "epoch", "waiters"}

// LockStatus reads one lock's status; a lock never acquired answers epoch 0.
func (c *Client) LockStatus(ctx context.Context, lock string) (*LockStatus, error) {
	name, err := segment("lock name", lock)
	if err != nil {
		return nil, err
	}
	k, _ := c.jsonCall(http.MethodGet, "/v1/locks/"+name, nil, retrySafe)
	return into[LockStatus](ctx, c, k, lockStatusFields...)
}

// LocksOptions choose one page of GET /v1/locks.
type LocksOptions struct {
	// Prefix keeps the locks whose names start with it.
	Prefix string
	// After starts the page after this name (a previous page's Next).
	After string
	// Limit is the most locks on the page (0: the server's default, 1,000; at most
	// 10,000).
	Limit int
}

// LockPage is one page of locks, in name order. Next is nil on the last page; otherwise
// pass it as After for the next one (with authentication on, a page may hold fewer than
// Limit locks while Next is not nil).
type LockPage struct {
	Locks []LockStatus `json:"locks"`
	Next  *string      `json:"next"`
}

// Locks reads one page of locks (GET /v1/locks?prefix=&after=&limit=).
func (c *Client) Locks(ctx context.Context, opts LocksOptions) (*LockPage, error) {
	query := url.Values{}
	if opts.Prefix != "" {
		query.Set("prefix", opts.Prefix)
	}
	if opts.After != "" {
		query.Set("after", opts.After)
	}
	if opts.Limit < 0 {
		return nil, badRequest("Limit must not be negative")
	}
	if opts.Limit > 0 {
		query.Set("limit", strconv.Itoa(opts.Limit))
	}
	path := "/v1/locks"
	if len(query) > 0 {
		path += "?" + query.Encode()
	}
	k, _ := c.jsonCall(http.MethodGet, path, nil, retrySafe)
	var raw struct {
		Locks []json.RawMessage `json:"locks"`
		Next  *string           `json:"next"`
	}
	if _, err := c.do(ctx, k, &raw, "locks"); err != nil {
		return nil, err
	}
	page := &LockPage{Locks: make([]LockStatus, len(raw.Locks)), Next: raw.Next}
	for i, status := range raw.Locks {
		if err := decode(http.StatusOK, status, &page.Locks[i], lockStatusFields); err != nil {
			return nil, err
		}
	}
	return page, nil
}

// AllLocks yields every lock whose name starts with prefix, in name order, reading one
// page of up to pageSize (0: the server's default) at a time. An error ends it.
func (c *Client) AllLocks(ctx context.Context, prefix string, pageSize int) iter.Seq2[LockStatus, error] {
	return func(yield func(LockStatus, error) bool) {
		opts := LocksOptions{Prefix: prefix, Limit: pageSize}
		for {
			page, err := c.Locks(ctx, opts)
			if err != nil {
				yield(LockStatus{}, err)
				return
			}
			for _, status := range page.Locks {
				if !yield(status, nil) {
					return
				}
			}
			if page.Next == nil {
				return
			}
			opts.After = *page.Next
		}
	}
}
