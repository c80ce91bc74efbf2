package palisade

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Client speaks the HTTP API of one Palisade server (docs/api.md). It is safe for
// concurrent use. Every failure the server answers is a typed error (ParseError);
// a request that did not complete is the net/http error, for a mutation an unknown
// outcome.
type Client struct {
	base    string
	http    *http.Client
	key     string
	timeout time.Duration
}

// Option sets up a Client.
type Option func(*Client)

// WithKey sends key as the bearer key of every request (a server with authentication).
func WithKey(key string) Option { return func(c *Client) { c.key = key } }

// WithHTTPClient uses h for every request (TLS settings, a proxy). Leave its Timeout
// unset: WithTimeout bounds each request, and an acquisition that waits in line needs
// more than the default.
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// WithTimeout bounds each request (30 s by default); an acquisition that waits in line
// gets its Wait on top. The caller's context may end a request sooner.
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// New is a client of the server at baseURL (http://127.0.0.1:7070, say).
func New(baseURL string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), http: &http.Client{}, timeout: 30 * time.Second}
	for _, opt := range opts {
		opt(c)
	}
	return c
}

// AcquireOptions are the settings of one acquisition.
type AcquireOptions struct {
	// Holder names who holds the lease (with authentication: a label after the
	// principal's name).
	Holder string
	// TTL is how long the lease lives without a keepalive (whole milliseconds).
	TTL time.Duration
	// Wait is how long to wait in the lock's first-come first-served line; 0 refuses at
	// once with *LockHeldError when the lock is held.
	Wait time.Duration
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
}

// Written is the answer to a fenced write: the key's new revision and the epoch that
// wrote it.
type Written struct {
	Revision uint64 `json:"revision"`
	Epoch    uint64 `json:"epoch"`
}

// Entry is a key of the fenced store: its value, revision, and the epoch that wrote it.
type Entry struct {
	Value    []byte
	Revision uint64
	Epoch    uint64
}

// Acquire takes lock (POST /v1/locks/{lock}/acquire).
func (c *Client) Acquire(ctx context.Context, lock string, opts AcquireOptions) (*Lease, error) {
	body := map[string]any{"ttl_ms": opts.TTL.Milliseconds()}
	if opts.Holder != "" {
		body["holder"] = opts.Holder
	}
	if opts.Wait > 0 {
		body["wait_ms"] = opts.Wait.Milliseconds()
	}
	var lease Lease
	name, err := segment("lock name", lock)
	if err != nil {
		return nil, err
	}
	path := "/v1/locks/" + name + "/acquire"
	if err := c.callWithin(ctx, c.timeout+opts.Wait, http.MethodPost, path, body, nil, &lease); err != nil {
		return nil, err
	}
	return &lease, nil
}

// KeepAlive renews a lease for a full TTL from now; *APIError with code lease_expired
// when it is gone.
func (c *Client) KeepAlive(ctx context.Context, leaseID string) error {
	id, err := segment("lease id", leaseID)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, "/v1/leases/"+id+"/keepalive", nil, nil, nil)
}

// Release gives a lease up; the lock passes to the next in line.
func (c *Client) Release(ctx context.Context, leaseID string) error {
	id, err := segment("lease id", leaseID)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, "/v1/leases/"+id+"/release", nil, nil, nil)
}

// Put writes value under key in lock's namespace, fenced by token: refused with
// *StaleTokenError once a newer epoch wrote there.
func (c *Client) Put(ctx context.Context, lock, key string, value []byte, token string) (*Written, error) {
	var written Written
	headers := http.Header{"Fencing-Token": {token}}
	path, err := kvPath(lock, key)
	if err != nil {
		return nil, err
	}
	if err := c.call(ctx, http.MethodPut, path, value, headers, &written); err != nil {
		return nil, err
	}
	return &written, nil
}

// Get reads key in lock's namespace; *NotFoundError when it does not exist.
func (c *Client) Get(ctx context.Context, lock, key string) (*Entry, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	path, err := kvPath(lock, key)
	if err != nil {
		return nil, err
	}
	response, err := c.send(ctx, http.MethodGet, path, nil, nil)
	if err != nil {
		return nil, err
	}
	defer response.Body.Close()
	value, err := io.ReadAll(response.Body)
	if err != nil {
		return nil, err
	}
	if response.StatusCode != http.StatusOK {
		return nil, ParseError(response.StatusCode, value)
	}
	revision, err1 := strconv.ParseUint(strings.Trim(response.Header.Get("ETag"), `"`), 10, 64)
	epoch, err2 := strconv.ParseUint(response.Header.Get("Fencing-Epoch"), 10, 64)
	if err1 != nil || err2 != nil {
		return nil, &DecodeError{Status: response.StatusCode, Snippet: "no ETag or Fencing-Epoch header"}
	}
	return &Entry{Value: value, Revision: revision, Epoch: epoch}, nil
}

// ErrUnsendablePath is the error of a name that cannot be sent in a URL path: empty, or
// a "." or ".." segment, which URL normalisation (here, or in a proxy) would remove,
// silently addressing another key or route. Nothing is sent.
var ErrUnsendablePath = errors.New("cannot be sent in a URL path")

// segment percent-encodes a name that is exactly one path segment (a lock name, a
// lease id).
func segment(what, value string) (string, error) {
	if value == "" || value == "." || value == ".." {
		return "", fmt.Errorf("%s %q: %w", what, value, ErrUnsendablePath)
	}
	return url.PathEscape(value), nil
}

// kvPath is a key's path: each "/"-separated segment of the key encoded on its own, the
// separators kept (the server reads a%2Fb and a/b as the same key).
func kvPath(lock, key string) (string, error) {
	name, err := segment("lock name", lock)
	if err != nil {
		return "", err
	}
	if key == "" {
		return "", fmt.Errorf("key %q: %w", key, ErrUnsendablePath)
	}
	parts := strings.Split(key, "/")
	for i, part := range parts {
		if part == "." || part == ".." {
			return "", fmt.Errorf("key %q has a %q segment: %w", key, part, ErrUnsendablePath)
		}
		parts[i] = url.PathEscape(part)
	}
	return "/v1/kv/" + name + "/" + strings.Join(parts, "/"), nil
}

// call sends body (JSON, or raw bytes) and decodes a 200's JSON into out, within the
// client's timeout.
func (c *Client) call(ctx context.Context, method, path string, body any, headers http.Header, out any) error {
	return c.callWithin(ctx, c.timeout, method, path, body, headers, out)
}

// callWithin is call with the request bounded by timeout.
func (c *Client) callWithin(ctx context.Context, timeout time.Duration, method, path string, body any, headers http.Header, out any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	response, err := c.send(ctx, method, path, body, headers)
	if err != nil {
		return err
	}
	defer response.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(response.Body, 16<<20))
	if err != nil {
		return err
	}
	if response.StatusCode != http.StatusOK {
		return ParseError(response.StatusCode, answer)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(answer, out); err != nil {
		return &DecodeError{Status: response.StatusCode, Snippet: fmt.Sprintf("%.200s", answer)}
	}
	return nil
}

func (c *Client) send(ctx context.Context, method, path string, body any, headers http.Header) (*http.Response, error) {
	var reader io.Reader
	contentType := ""
	switch b := body.(type) {
	case nil:
	case []byte:
		reader = bytes.NewReader(b)
		contentType = "application/octet-stream"
	default:
		encoded, err := json.Marshal(b)
		if err != nil {
			return nil, err
		}
		reader = bytes.NewReader(encoded)
		contentType = "application/json"
	}
	request, err := http.NewRequestWithContext(ctx, method, c.base+path, reader)
	if err != nil {
		return nil, err
	}
	for name, values := range headers {
		request.Header[name] = values
	}
	if contentType != "" {
		request.Header.Set("Content-Type", contentType)
	}
	if c.key != "" {
		request.Header.Set("Authorization", "Bearer "+c.key)
	}
	return c.http.Do(request)
}

// Guard holds a lease and renews it in the background, every third of its TTL, until
// Release, or until a renewal is refused (the lease is lost: Lost is closed). A guard
// does not stop the work it protects by itself: check Lost, and let the resource's gate
// refuse the late writes fencing exists for.
type Guard struct {
	Lease  *Lease
	client *Client
	lost   chan struct{}
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
	err    error
}

// Hold acquires lock and starts renewing it.
func (c *Client) Hold(ctx context.Context, lock string, opts AcquireOptions) (*Guard, error) {
	lease, err := c.Acquire(ctx, lock, opts)
	if err != nil {
		return nil, err
	}
	g := &Guard{Lease: lease, client: c, lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go g.renew(time.Duration(lease.TTLMs) * time.Millisecond / 3)
	return g, nil
}

// Lost is closed when a renewal was refused or failed past the lease's TTL: the lease
// may have ended, and another holder may have the lock.
func (g *Guard) Lost() <-chan struct{} { return g.lost }

// Err is why the lease was lost (nil while it is held).
func (g *Guard) Err() error {
	select {
	case <-g.lost:
		return g.err
	default:
		return nil
	}
}

func (g *Guard) renew(every time.Duration) {
	defer close(g.done)
	ttl := time.Duration(g.Lease.TTLMs) * time.Millisecond
	renewed := time.Now()
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-ticker.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		err := g.client.KeepAlive(ctx, g.Lease.LeaseID)
		cancel()
		if err == nil {
			renewed = time.Now()
			continue
		}
		var api *APIError
		// A refusal is final; a failed request is retried until the TTL is spent.
		if errors.As(err, &api) || time.Since(renewed) >= ttl {
			g.err = err
			close(g.lost)
			return
		}
	}
}

// Release stops renewing and releases the lease (nothing to release once it was lost).
func (g *Guard) Release(ctx context.Context) error {
	g.once.Do(func() { close(g.stop) })
	<-g.done
	select {
	case <-g.lost:
		return g.err
	default:
	}
	return g.client.Release(ctx, g.Lease.LeaseID)
}
