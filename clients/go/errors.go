// The typed errors: the decoding of every error answer the server sends (ParseError),
// the errors a call raises before anything is sent or when no answer came back
// (TransportError), and the predicates callers branch on (IsFenced, IsLost).

package palisade

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// APIError is an error answer of the server: its stable Code (docs/api.md, "Error
// codes"), its HTTP Status and a Message for humans. Every typed error below unwraps to
// its APIError, so errors.As(err, &apiErr) reads the code of any of them; a code this
// version does not know, or a known code whose fields are missing or of another type,
// is a plain *APIError (no field is ever invented).
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("%s (refused by the client, nothing sent): %s", e.Code, e.Message)
	}
	return fmt.Sprintf("%s (HTTP %d): %s", e.Code, e.Status, e.Message)
}

// badRequest is a call this client refuses before sending anything: the server's code
// bad_request with Status 0.
func badRequest(format string, args ...any) error {
	return &APIError{Code: "bad_request", Message: fmt.Sprintf(format, args...)}
}

// StaleTokenError is stale_token: a newer epoch (HighWater) reached the resource first;
// this holder is fenced off.
type StaleTokenError struct {
	APIError
	HighWater uint64
	Epoch     uint64
}

// StaleSequenceError is stale_sequence: within the epoch, a sequence number at or below
// the last one admitted.
type StaleSequenceError struct {
	APIError
	HighWater    uint64
	HighWaterSeq uint64
	Epoch        uint64
	Seq          uint64
}

// LockHeldError is lock_held. Holder is nil while the lock sits in its lock-delay, or
// when the caller may not see holders.
type LockHeldError struct {
	APIError
	Holder       *string
	RetryAfterMs uint64
}

// RevisionMismatchError is revision_mismatch: an If-Match or If-None-Match precondition
// failed. CurrentRevision is nil when the key does not exist.
type RevisionMismatchError struct {
	APIError
	CurrentRevision *uint64
}

// WrongLockError is wrong_lock: the token is genuine but for TokenLock.
type WrongLockError struct {
	APIError
	TokenLock string
}

// QuotaExceededError is quota_exceeded: Resource is limited to Limit; nothing changed.
type QuotaExceededError struct {
	APIError
	Resource string
	Limit    uint64
}

// PayloadTooLargeError is payload_too_large; Limit is nil when the connection's own limit
// refused the request.
type PayloadTooLargeError struct {
	APIError
	Limit *uint64
}

// PermissionDeniedError is permission_denied; Principal is the principal refused, when
// the caller named one.
type PermissionDeniedError struct {
	APIError
	Principal *string
}

// NotFoundError is not_found; KeyID is the key an admin key route did not find.
type NotFoundError struct {
	APIError
	KeyID *string
}

// KeyActiveError is key_active: the key KeyID still signs and cannot be retired.
type KeyActiveError struct {
	APIError
	KeyID string
}

// Unwrap gives each typed error's APIError to errors.As.
func (e *StaleTokenError) Unwrap() error       { return &e.APIError }
func (e *StaleSequenceError) Unwrap() error    { return &e.APIError }
func (e *LockHeldError) Unwrap() error         { return &e.APIError }
func (e *RevisionMismatchError) Unwrap() error { return &e.APIError }
func (e *WrongLockError) Unwrap() error        { return &e.APIError }
func (e *QuotaExceededError) Unwrap() error    { return &e.APIError }
func (e *PayloadTooLargeError) Unwrap() error  { return &e.APIError }
func (e *PermissionDeniedError) Unwrap() error { return &e.APIError }
func (e *NotFoundError) Unwrap() error         { return &e.APIError }
func (e *KeyActiveError) Unwrap() error        { return &e.APIError }

// IsFenced reports whether err says this holder's epoch is fenced off (stale_token or
// stale_sequence).
func IsFenced(err error) bool {
	switch err.(type) {
	case *StaleTokenError, *StaleSequenceError:
		return true
	}
	return false
}

// IsLost reports whether err says a lease or session is gone: lease_expired or
// session_expired, from the server (Status 404) or from this client, which refuses a
// call through a guard it knows or presumes lost (Status 0) before sending anything.
func IsLost(err error) bool {
	var api *APIError
	return errors.As(err, &api) && (api.Code == "lease_expired" || api.Code == "session_expired")
}

// TransportError is a call that got no answer to decode: no endpoint could be reached,
// or an answer was lost. OutcomeUnknown is true when a request was sent and no answer came
// back, so it may have been applied (an acquire may have granted a lease, a write without
// an idempotency key may have been written). Attempts lists each endpoint tried and how
// it failed; Err is the last failure (errors.Is(err, context.DeadlineExceeded) and
// errors.As(err, &urlErr) see through it).
type TransportError struct {
	Method         string
	Path           string
	Attempts       []string
	OutcomeUnknown bool
	Err            error
}

func (e *TransportError) Error() string {
	outcome := "not sent"
	if e.OutcomeUnknown {
		outcome = "outcome unknown"
	}
	return fmt.Sprintf("%s %s failed (%s): %s", e.Method, e.Path, outcome, strings.Join(e.Attempts, "; "))
}

// Unwrap gives the last failure to errors.Is and errors.As.
func (e *TransportError) Unwrap() error { return e.Err }

// DecodeError is an answer this client cannot read as an error body (a proxy's HTML page,
// an empty 404 from a wrong base URL): never a guessed code.
type DecodeError struct {
	Status  int
	Snippet string
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("HTTP %d with a body that is not a Palisade error: %q", e.Status, e.Snippet)
}

// strict reads field name as a T; one missing, null or of another type clears *ok.
func strict[T any](fields map[string]json.RawMessage, name string, ok *bool) T {
	var v T
	raw := fields[name]
	if string(raw) == "null" || json.Unmarshal(raw, &v) != nil {
		*ok = false
	}
	return v
}

// optional reads field name with read, or nil when it is absent or null.
func optional[T any](fields map[string]json.RawMessage, name string, read func(string) T) *T {
	raw, present := fields[name]
	if !present || string(raw) == "null" {
		return nil
	}
	v := read(name)
	return &v
}

// ParseError turns a non-success answer into its typed error.
func ParseError(status int, body []byte) error {
	var envelope struct {
		Error map[string]json.RawMessage `json:"error"`
	}
	var code, message string
	if json.Unmarshal(body, &envelope) != nil || envelope.Error == nil ||
		json.Unmarshal(envelope.Error["code"], &code) != nil {
		snippet := string(body)
		if len(snippet) > 200 {
			snippet = snippet[:200]
		}
		return &DecodeError{Status: status, Snippet: snippet}
	}
	_ = json.Unmarshal(envelope.Error["message"], &message)
	base := APIError{Status: status, Code: code, Message: message}
	fields := envelope.Error
	// Each field read strictly; a field missing, null or of another type leaves the
	// generic error (encoding/json would read a null as the zero value: never invent one).
	ok := true
	u64 := func(name string) uint64 { return strict[uint64](fields, name, &ok) }
	str := func(name string) string { return strict[string](fields, name, &ok) }
	optU64 := func(name string) *uint64 { return optional(fields, name, u64) }
	optStr := func(name string) *string { return optional(fields, name, str) }
	var typed error
	switch code {
	case "stale_token":
		typed = &StaleTokenError{base, u64("high_water"), u64("epoch")}
	case "stale_sequence":
		typed = &StaleSequenceError{base, u64("high_water"), u64("high_water_seq"), u64("epoch"), u64("seq")}
	case "lock_held":
		typed = &LockHeldError{base, optStr("holder"), u64("retry_after_ms")}
	case "revision_mismatch":
		typed = &RevisionMismatchError{base, optU64("current_revision")}
	case "wrong_lock":
		typed = &WrongLockError{base, str("token_lock")}
	case "quota_exceeded":
		typed = &QuotaExceededError{base, str("resource"), u64("limit")}
	case "payload_too_large":
		typed = &PayloadTooLargeError{base, optU64("limit")}
	case "permission_denied":
		typed = &PermissionDeniedError{base, optStr("principal")}
	case "not_found":
		typed = &NotFoundError{base, optStr("key_id")}
	case "key_active":
		typed = &KeyActiveError{base, str("key_id")}
	default:
		return &base
	}
	if !ok {
		return &base
	}
	return typed
}
