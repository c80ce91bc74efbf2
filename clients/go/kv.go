// The fenced store: fenced writes (put, delete) with their options (If-Match,
// If-None-Match, Idempotency-Key, Fencing-Seq), and reads (get, list), which need no
// token.

package palisade

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// WriteOption is an option of a fenced mutation (Put, Delete, Fence).
type WriteOption func(*writeOptions)

type writeOptions struct {
	ifMatch        *uint64
	ifAbsent       bool
	idempotencyKey string
	seq            *uint64
}

// IfMatch applies the write only if the key is at this revision (If-Match: "<revision>");
// otherwise *RevisionMismatchError with the current revision (nil when the key is absent).
func IfMatch(revision uint64) WriteOption {
	return func(o *writeOptions) { o.ifMatch = &revision }
}

// IfAbsent applies a put only if the key does not exist (If-None-Match: *); otherwise
// *RevisionMismatchError with the current revision.
func IfAbsent() WriteOption { return func(o *writeOptions) { o.ifAbsent = true } }

// IdempotencyKey makes a retry safe (Idempotency-Key: 1 to 128 visible ASCII characters,
// no space): a repeat with the same key answers the first outcome, Written.Replayed set,
// without applying twice; the key reused for another request is an *APIError
// idempotency_conflict. Fencing alone does not deduplicate retries.
func IdempotencyKey(key string) WriteOption {
	return func(o *writeOptions) { o.idempotencyKey = key }
}

// Seq sends Fencing-Seq, required in namespaces whose policy is sequence, where
// (epoch, seq) must strictly increase with each operation (*StaleSequenceError for a
// replay).
func Seq(n uint64) WriteOption { return func(o *writeOptions) { o.seq = &n } }

// Written is the answer to a fenced put or delete: the key's new revision and the epoch
// that wrote it. Replayed is true when the answer is the first outcome of an earlier
// request with the same idempotency key (header Idempotent-Replayed).
type Written struct {
	Revision uint64 `json:"revision"`
	Epoch    uint64 `json:"epoch"`
	Replayed bool   `json:"-"`
}

// Entry is a key of the fenced store: its value, revision, and the epoch that wrote it.
type Entry struct {
	Value    []byte
	Revision uint64
	Epoch    uint64
}

// newIdempotencyKey is a fresh key for one logical write: 128 random bits.
func newIdempotencyKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "go-" + hex.EncodeToString(b[:])
}

func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '!' || s[i] > '~' {
			return false
		}
	}
	return true
}

// mutation is the call of a fenced mutation: the token, the options as headers, and how
// freely it may be resent (with an idempotency key: safe; without: only when it surely
// reached no node). A client with several endpoints adds a fresh key to every mutation.
func (c *Client) mutation(method, path, token string, opts []WriteOption, body []byte, what string) (call, error) {
	var o writeOptions
	for _, opt := range opts {
		opt(&o)
	}
	// An empty token is sent as it is: the server answers missing_token. Only what
	// cannot travel in a header is refused here.
	for i := 0; i < len(token); i++ {
		if token[i] < ' ' || token[i] > '~' {
			return call{}, &APIError{Code: "invalid_token", Message: "the token has characters an HTTP header cannot carry"}
		}
	}
	headers := http.Header{"Fencing-Token": {token}}
	if o.ifMatch != nil && o.ifAbsent {
		return call{}, badRequest("use IfMatch or IfAbsent, not both")
	}
	if o.ifAbsent && what != "put" {
		return call{}, badRequest("IfAbsent applies to a put, not a %s", what)
	}
	if o.ifMatch != nil && what == "barrier" {
		return call{}, badRequest("IfMatch applies to a put or a delete, not a barrier")
	}
	if o.ifMatch != nil {
		headers.Set("If-Match", fmt.Sprintf("%q", strconv.FormatUint(*o.ifMatch, 10)))
	}
	if o.ifAbsent {
		headers.Set("If-None-Match", "*")
	}
	if o.seq != nil {
		headers.Set("Fencing-Seq", strconv.FormatUint(*o.seq, 10))
	}
	key := o.idempotencyKey
	if key == "" && len(c.endpoints.bases) > 1 {
		key = newIdempotencyKey()
	}
	retry := retryOnlyUnreachable
	if key != "" {
		if len(key) > 128 || !visibleASCII(key) {
			return call{}, badRequest("an idempotency key is 1 to 128 visible ASCII characters without spaces")
		}
		headers.Set("Idempotency-Key", key)
		retry = retrySafe
	}
	k := call{method: method, path: path, headers: headers, timeout: c.timeout, retry: retry}
	if body != nil {
		k.body, k.contentType = body, "application/octet-stream"
	}
	return k, nil
}

// written sends a put or delete and reads its answer.
func (c *Client) written(ctx context.Context, k call) (*Written, error) {
	var w Written
	headers, err := c.do(ctx, k, &w, "revision", "epoch")
	if err != nil {
		return nil, err
	}
	w.Replayed = strings.EqualFold(strings.TrimSpace(headers.Get("Idempotent-Replayed")), "true")
	return &w, nil
}

// Put writes value under key in lock's namespace, fenced by token: refused with
// *StaleTokenError once a newer epoch wrote there (or fenced it). Options: IfMatch,
// IfAbsent, IdempotencyKey, Seq. Over quota: *QuotaExceededError, nothing written.
func (c *Client) Put(ctx context.Context, lock, key string, value []byte, token string, opts ...WriteOption) (*Written, error) {
	path, err := kvPath(lock, key)
	if err != nil {
		return nil, err
	}
	if value == nil {
		value = []byte{}
	}
	k, err := c.mutation(http.MethodPut, path, token, opts, value, "put")
	if err != nil {
		return nil, err
	}
	return c.written(ctx, k)
}

// Delete removes key from lock's namespace, fenced like a put (*StaleTokenError for an
// older epoch); *NotFoundError when it is absent (nothing changes). Options: IfMatch,
// IdempotencyKey, Seq.
func (c *Client) Delete(ctx context.Context, lock, key, token string, opts ...WriteOption) (*Written, error) {
	path, err := kvPath(lock, key)
	if err != nil {
		return nil, err
	}
	k, err := c.mutation(http.MethodDelete, path, token, opts, nil, "delete")
	if err != nil {
		return nil, err
	}
	return c.written(ctx, k)
}

// Get reads key in lock's namespace; *NotFoundError when it does not exist.
func (c *Client) Get(ctx context.Context, lock, key string) (*Entry, error) {
	path, err := kvPath(lock, key)
	if err != nil {
		return nil, err
	}
	response, release, err := c.exchange(ctx, call{method: http.MethodGet, path: path, timeout: c.timeout, retry: retrySafe})
	if err != nil {
		return nil, err
	}
	defer release()
	value, err := io.ReadAll(response.Body)
	if err != nil {
		return nil, &TransportError{Method: http.MethodGet, Path: path, Attempts: []string{"the answer's body broke off: " + err.Error()}, Err: err}
	}
	if response.StatusCode != http.StatusOK {
		return nil, ParseError(response.StatusCode, value)
	}
	revision, err1 := strconv.ParseUint(strings.Trim(strings.TrimPrefix(response.Header.Get("ETag"), "W/"), `"`), 10, 64)
	epoch, err2 := strconv.ParseUint(strings.TrimSpace(response.Header.Get("Fencing-Epoch")), 10, 64)
	if err1 != nil || err2 != nil {
		return nil, &DecodeError{Status: response.StatusCode, Snippet: "no ETag or Fencing-Epoch header"}
	}
	return &Entry{Value: value, Revision: revision, Epoch: epoch}, nil
}

// ListOptions choose the keys List answers.
type ListOptions struct {
	// Prefix keeps the keys that start with it.
	Prefix string
	// Limit is the most keys answered (0: the most the server gives, 10,000).
	Limit int
}

// List answers the keys of lock's namespace in key order (GET /v1/kv/{lock}?prefix=&limit=).
// The API has no continuation for keys: a namespace with more keys than the limit is
// read in narrower prefixes.
func (c *Client) List(ctx context.Context, lock string, opts ListOptions) ([]string, error) {
	name, err := segment("lock name", lock)
	if err != nil {
		return nil, err
	}
	if opts.Limit < 0 {
		return nil, badRequest("Limit must not be negative")
	}
	limit := opts.Limit
	if limit == 0 {
		limit = 10_000
	}
	query := url.Values{"limit": {strconv.Itoa(limit)}}
	if opts.Prefix != "" {
		query.Set("prefix", opts.Prefix)
	}
	k, _ := c.jsonCall(http.MethodGet, "/v1/kv/"+name+"?"+query.Encode(), nil, retrySafe)
	var answer struct {
		Keys []string `json:"keys"`
	}
	if _, err := c.do(ctx, k, &answer, "keys"); err != nil {
		return nil, err
	}
	return answer.Keys, nil
}
