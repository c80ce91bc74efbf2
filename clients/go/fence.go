// The barrier and what the issuer says about tokens: POST /v1/fences/{lock} (advance a
// namespace's mark without data), GET /v1/fences/{lock} (read it), POST /v1/tokens/check
// (the online token check) and GET /v1/keys (the public keys, for offline checks).

package palisade

import (
	"context"
	"net/http"

	tokens "github.com/palisade/palisade-go/token"
)

// Fenced is the answer to a barrier: the namespace's mark after it (HighWater) and the
// epoch the barrier carried.
type Fenced struct {
	Lock      string `json:"lock"`
	HighWater uint64 `json:"high_water"`
	Epoch     uint64 `json:"epoch"`
}

// Fence is the barrier (POST /v1/fences/{lock}): it advances lock's namespace's mark to
// token's epoch without writing data, so that from this answer on the namespace refuses
// every older holder's writes (*StaleTokenError), in flight or not. A new holder calls it
// before it acts. Options: Seq (sequence namespaces), IdempotencyKey.
func (c *Client) Fence(ctx context.Context, lock, token string, opts ...WriteOption) (*Fenced, error) {
	name, err := segment("lock name", lock)
	if err != nil {
		return nil, err
	}
	k, err := c.mutation(http.MethodPost, "/v1/fences/"+name, token, opts, nil, "barrier")
	if err != nil {
		return nil, err
	}
	return into[Fenced](ctx, c, k, "lock", "high_water", "epoch")
}

// FenceStatus is a namespace's mark: the largest epoch admitted (0 if none ever was), the
// sequence number admitted with it (nil from a server that does not send it) and the
// namespace's policy ("epoch" or "sequence").
type FenceStatus struct {
	Lock      string  `json:"lock"`
	HighWater uint64  `json:"high_water"`
	Seq       *uint64 `json:"seq"`
	Policy    string  `json:"policy"`
}

// HighWater reads lock's namespace's mark (GET /v1/fences/{lock}); no token needed.
func (c *Client) HighWater(ctx context.Context, lock string) (*FenceStatus, error) {
	name, err := segment("lock name", lock)
	if err != nil {
		return nil, err
	}
	k, _ := c.jsonCall(http.MethodGet, "/v1/fences/"+name, nil, retrySafe)
	return into[FenceStatus](ctx, c, k, "lock", "high_water", "policy")
}

// TokenCheck is the issuer's online verdict on a token (POST /v1/tokens/check). When
// Genuine is false only Reason is set. Current means the token's epoch is the lock's
// (CurrentEpoch) and no grant above it can have gone unrecorded; LeaseAlive means the
// lock's live lease has this epoch. A snapshot: only a resource's high-water check at the
// moment of the write fences.
type TokenCheck struct {
	Genuine      bool   `json:"genuine"`
	Lock         string `json:"lock"`
	Epoch        uint64 `json:"epoch"`
	Holder       string `json:"holder"`
	KeyID        string `json:"key_id"`
	CurrentEpoch uint64 `json:"current_epoch"`
	Current      bool   `json:"current"`
	LeaseAlive   bool   `json:"lease_alive"`
	Reason       string `json:"reason"`
}

// CheckToken asks the issuer whether token is genuine, current and its lease alive.
func (c *Client) CheckToken(ctx context.Context, token string) (*TokenCheck, error) {
	k, err := c.jsonCall(http.MethodPost, "/v1/tokens/check", map[string]string{"token": token}, retrySafe)
	if err != nil {
		return nil, err
	}
	answer, _, err := c.raw(ctx, k)
	if err != nil {
		return nil, err
	}
	var check TokenCheck
	required := []string{"genuine"}
	if err := decode(http.StatusOK, answer, &check, required); err != nil {
		return nil, err
	}
	if check.Genuine {
		// A genuine verdict carries every field.
		required = append(required, "lock", "epoch", "holder", "key_id", "current_epoch", "current", "lease_alive")
		if err := decode(http.StatusOK, answer, &check, required); err != nil {
			return nil, err
		}
	}
	return &check, nil
}

// Keys reads the issuer's public keys (GET /v1/keys, public), for verifying tokens
// offline: token.RingFromListing(listing).
func (c *Client) Keys(ctx context.Context) (tokens.Listing, error) {
	k, _ := c.jsonCall(http.MethodGet, "/v1/keys", nil, retrySafe)
	var listing tokens.Listing
	_, err := c.do(ctx, k, &listing, "keys")
	return listing, err
}
