// Tests of the typed errors: every answer of vectors/errors.json, and answers that
// must never be read as values.

package palisade

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// Codes this client reads as the plain *APIError on purpose: nothing to branch on.
var plain = map[string]bool{
	"bad_request": true, "method_not_allowed": true, "uri_too_long": true,
	"headers_too_large": true, "unauthenticated": true, "missing_token": true,
	"invalid_token": true, "lease_expired": true, "session_expired": true,
	"idempotency_conflict": true, "storage_failed": true, "unavailable": true,
}

// Every answer of vectors/errors.json (made from the server's own definitions, one per
// code and shape) decodes into its typed error carrying the answer's fields, and
// unwraps to an *APIError with the answer's code and status.
func TestEveryErrorTheServerCanSendDecodesWithItsFields(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "vectors", "errors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Answers []struct {
			Status int             `json:"status"`
			Body   json.RawMessage `json:"body"`
		} `json:"answers"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Answers) < 20 {
		t.Fatalf("only %d answers", len(file.Answers))
	}
	for _, answer := range file.Answers {
		var body struct {
			Error map[string]any `json:"error"`
		}
		if err := json.Unmarshal(answer.Body, &body); err != nil {
			t.Fatal(err)
		}
		code := body.Error["code"].(string)
		decoded := ParseError(answer.Status, answer.Body)
		var api *APIError
		if !errors.As(decoded, &api) || api.Code != code || api.Status != answer.Status {
			t.Fatalf("%s: %#v", code, decoded)
		}
		_, isPlain := decoded.(*APIError)
		if isPlain != plain[code] {
			t.Fatalf("%s decoded as %T", code, decoded)
		}
		want := map[string]any{}
		for name, value := range body.Error {
			if name != "code" && name != "message" {
				want[name] = value
			}
		}
		if got := fieldsOf(decoded); !isPlain && !reflect.DeepEqual(got, want) {
			t.Errorf("%s: fields %v, want %v", code, got, want)
		}
	}
}

// A known code whose fields are missing or mistyped is the plain *APIError; a body that
// is not an error envelope is a *DecodeError.
func TestNothingIsInvented(t *testing.T) {
	err := ParseError(409, []byte(`{"error":{"code":"stale_token","message":"m","epoch":1}}`))
	if _, ok := err.(*APIError); !ok {
		t.Fatalf("got %#v", err)
	}
	err = ParseError(409, []byte(`{"error":{"code":"stale_token","high_water":"2","epoch":1}}`))
	if _, ok := err.(*APIError); !ok {
		t.Fatalf("got %#v", err)
	}
	for _, body := range []string{
		`{"error":{"code":"stale_token","message":"m","high_water":null,"epoch":1}}`,
		`{"error":{"code":"wrong_lock","message":"m","token_lock":null}}`,
		`{"error":{"code":"quota_exceeded","message":"m","resource":"locks","limit":null}}`,
	} {
		if _, ok := ParseError(409, []byte(body)).(*APIError); !ok {
			t.Fatalf("a required field sent as null was read as a value: %s", body)
		}
	}
	if !IsFenced(ParseError(409, []byte(`{"error":{"code":"stale_token","high_water":2,"epoch":1}}`))) {
		t.Fatal("a stale token is fenced")
	}
	var decode *DecodeError
	if !errors.As(ParseError(404, nil), &decode) {
		t.Fatal("an empty 404 is not an error body")
	}
}

// The fields a typed error carries, as the JSON they came from (absent ones left out).
func fieldsOf(err error) map[string]any {
	out := map[string]any{}
	num := func(v uint64) any { return float64(v) }
	switch e := err.(type) {
	case *StaleTokenError:
		out["high_water"], out["epoch"] = num(e.HighWater), num(e.Epoch)
	case *StaleSequenceError:
		out["high_water"], out["high_water_seq"] = num(e.HighWater), num(e.HighWaterSeq)
		out["epoch"], out["seq"] = num(e.Epoch), num(e.Seq)
	case *LockHeldError:
		out["holder"], out["retry_after_ms"] = nil, num(e.RetryAfterMs)
		if e.Holder != nil {
			out["holder"] = *e.Holder
		}
	case *RevisionMismatchError:
		out["current_revision"] = nil
		if e.CurrentRevision != nil {
			out["current_revision"] = num(*e.CurrentRevision)
		}
	case *WrongLockError:
		out["token_lock"] = e.TokenLock
	case *QuotaExceededError:
		out["resource"], out["limit"] = e.Resource, num(e.Limit)
	case *PayloadTooLargeError:
		if e.Limit != nil {
			out["limit"] = num(*e.Limit)
		}
	case *PermissionDeniedError:
		if e.Principal != nil {
			out["principal"] = *e.Principal
		}
	case *NotFoundError:
		if e.KeyID != nil {
			out["key_id"] = *e.KeyID
		}
	case *KeyActiveError:
		out["key_id"] = e.KeyID
	}
	return out
}

// A success whose required fields are missing, null or of another type is a
// *DecodeError: never a zero epoch or an empty token read as the server's.
func TestASuccessMissingAFieldIsADecodeError(t *testing.T) {
	for _, body := range []string{
		`{"lock":"orders","holder":"a","token":"t","lease_id":"l","ttl_ms":1000}`,
		`{"lock":"orders","holder":"a","epoch":null,"token":"t","lease_id":"l","ttl_ms":1000}`,
		`{"lock":"orders","holder":"a","epoch":"1","token":"t","lease_id":"l","ttl_ms":1000}`,
		`<html>ok</html>`,
	} {
		node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(body))
		}))
		_, err := New(node.URL).Acquire(context.Background(), "orders", AcquireOptions{Holder: "a", TTL: time.Second})
		node.Close()
		var decode *DecodeError
		if !errors.As(err, &decode) || decode.Status != 200 {
			t.Fatalf("%s: %#v", body, err)
		}
	}
}
