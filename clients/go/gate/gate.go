// Package gate holds what every Go gate shares: the token check before anything is
// touched, the gate rule that decides the new high-water mark, and the refusals, the same
// as the Rust palisade-adapters crate and the Python gates (docs/protecting-your-database.md).
//
// A gate admits an operation in two steps:
//
//  1. VerifyForLock: the token is present, genuine (verified offline, keys from
//     GET /v1/keys) and names the lock guarding the data; a refusal here has touched
//     nothing (S12);
//  2. inside the caller's transaction, the backend reads the lock's mark, applies Decide,
//     and stores the new mark, so that the mark and the caller's writes commit together
//     or not at all (S6). Package gate/postgres does it in PostgreSQL with pgx.
//
// Refusals are the client's typed errors, with the server's codes: missing_token,
// invalid_token (*InvalidTokenError, which also unwraps to the token package's refusal),
// *palisade.WrongLockError, *palisade.StaleTokenError, *palisade.StaleSequenceError,
// write_conflict (*ConflictError: a lost race, retry the whole transaction) and
// storage_failed (the database failed, or its fence table holds what no gate wrote).
//
// What a gate does not guarantee: it does not deduplicate retries (S9; use the sequence
// policy), it does not cancel in-flight work (S10), it protects only the writes that go
// through it (S2), it is as durable as the database (S11), and it is not access control
// (S14).
package gate

import (
	"fmt"
	"math"
	"strings"

	palisade "github.com/palisade/palisade-go"
	"github.com/palisade/palisade-go/token"
)

// Policy is how a lock's mark orders the operations it admits.
type Policy int

const (
	// Epoch admits equal or larger epochs and refuses smaller ones (S8).
	Epoch Policy = iota
	// Sequence also needs (epoch, seq) to strictly increase with every operation.
	Sequence
)

// HighWater is the largest (epoch, seq) a resource has admitted for one lock; (0, 0)
// when none.
type HighWater struct {
	Epoch uint64
	Seq   uint64
}

// Admitted is what an admitted operation may rely on, returned only once the new mark was
// written inside the caller's transaction.
type Admitted struct {
	// Claims are the verified claims of the token.
	Claims token.Claims
	// Previous is the mark before this operation.
	Previous HighWater
	// HighWater is the mark this operation commits together with the caller's writes.
	HighWater HighWater
}

// InvalidTokenError is invalid_token: the token is not genuine. It unwraps both to its
// *palisade.APIError and to the verifier's refusal (token.ErrMalformed, ErrUnknownKey,
// ErrBadSignature).
type InvalidTokenError struct {
	palisade.APIError
	Err error
}

// Unwrap gives errors.Is and errors.As both the API error and the verifier's refusal.
func (e *InvalidTokenError) Unwrap() []error { return []error{&e.APIError, e.Err} }

// ConflictError is write_conflict: another transaction changed the mark between this
// one's snapshot and its admit (a serialisation failure, a deadlock, a lock timeout).
// Nothing of the operation committed; retrying the whole transaction is safe as far as
// fencing is concerned.
type ConflictError struct {
	palisade.APIError
	Err error
}

// Unwrap gives the API error and the database's own error.
func (e *ConflictError) Unwrap() []error { return []error{&e.APIError, e.Err} }

// StorageError is storage_failed: the database failed, or holds a mark no gate wrote.
type StorageError struct {
	palisade.APIError
	Err error
}

// Unwrap gives the API error and the cause, when there is one.
func (e *StorageError) Unwrap() []error {
	if e.Err == nil {
		return []error{&e.APIError}
	}
	return []error{&e.APIError, e.Err}
}

func apiError(status int, code, message string) palisade.APIError {
	return palisade.APIError{Status: status, Code: code, Message: message}
}

// Conflict is the write_conflict refusal for a lost race with cause err.
func Conflict(err error) error {
	return &ConflictError{apiError(409, "write_conflict", "concurrent update of the fenced resource; retry"), err}
}

// StorageFailed is the storage_failed refusal, with its cause (nil when there is none).
func StorageFailed(message string, err error) error {
	return &StorageError{apiError(503, "storage_failed", message), err}
}

// VerifyForLock checks that tok is present, genuine and names lock. It touches no
// resource, so a refusal here has written nothing. A token that is empty once white
// space is trimmed (as Rust's str::trim does) is missing_token.
func VerifyForLock(verifier *token.Verifier, tok, lock string) (token.Claims, error) {
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return token.Claims{}, &palisade.APIError{Status: 400, Code: "missing_token", Message: "this operation needs a fencing token"}
	}
	claims, err := verifier.Verify(tok)
	if err != nil {
		return token.Claims{}, &InvalidTokenError{apiError(400, "invalid_token", err.Error()), err}
	}
	if claims.Lock != lock {
		return token.Claims{}, &palisade.WrongLockError{
			APIError:  apiError(403, "wrong_lock", fmt.Sprintf("token is for lock %q, not %q", claims.Lock, lock)),
			TokenLock: claims.Lock,
		}
	}
	return claims, nil
}

// Decide is the gate rule of palisade-core: the new mark to store, or the refusal. It
// refuses epoch < current.Epoch (*palisade.StaleTokenError); under the epoch policy it
// admits and raises the mark to (epoch, 0); under the sequence policy (epoch, seq) must
// also strictly exceed the mark (*palisade.StaleSequenceError). A mark past the SQL
// integer range is refused (storage_failed) rather than wrapped. Correct only when the
// caller reads current and stores the result in one transaction with the write.
func Decide(current HighWater, policy Policy, epoch, seq uint64) (HighWater, error) {
	if epoch < current.Epoch {
		return HighWater{}, &palisade.StaleTokenError{
			APIError:  apiError(409, "stale_token", fmt.Sprintf("epoch %d is older than the high-water mark %d", epoch, current.Epoch)),
			HighWater: current.Epoch,
			Epoch:     epoch,
		}
	}
	next := HighWater{Epoch: epoch}
	if policy == Sequence {
		if epoch == current.Epoch && seq <= current.Seq {
			return HighWater{}, &palisade.StaleSequenceError{
				APIError:     apiError(409, "stale_sequence", fmt.Sprintf("sequence %d is not above %d within epoch %d", seq, current.Seq, epoch)),
				HighWater:    current.Epoch,
				HighWaterSeq: current.Seq,
				Epoch:        epoch,
				Seq:          seq,
			}
		}
		next.Seq = seq
	}
	if next.Epoch > math.MaxInt64 || next.Seq > math.MaxInt64 {
		return HighWater{}, StorageFailed(fmt.Sprintf("mark (%d, %d) exceeds the SQL integer range", next.Epoch, next.Seq), nil)
	}
	return next, nil
}

// FromSQL is a stored mark read back: anything but two non-negative integers means the
// fence table was edited by hand, and the gate refuses to guess.
func FromSQL(epoch, seq int64) (HighWater, error) {
	if epoch < 0 || seq < 0 {
		return HighWater{}, StorageFailed(fmt.Sprintf("unreadable fence record: mark (%d, %d)", epoch, seq), nil)
	}
	return HighWater{Epoch: uint64(epoch), Seq: uint64(seq)}, nil
}
