// Package token verifies Palisade fencing tokens offline, with the issuer's public keys
// and no call to the issuer: byte for byte the rules of the Rust palisade-token crate
// and of the Python client (docs/token-format.md).
//
// A token is pal1.<payload>.<signature>: base64url without padding of the claims JSON
// {"l":<lock>,"e":<epoch>,"h":<holder>,"k":<key id>} and of an Ed25519 signature over the
// ASCII bytes pal1.<payload>. A Verifier checks, in the Rust verifier's order:
//
//  1. at most 4096 bytes; exactly three parts; the prefix pal1;
//  2. the payload is strict base64url of JSON with the four claims, of the right types;
//  3. a legal lock name, an epoch from 1 to 2^64-1, a holder of at most 256 bytes;
//  4. canonical form: the claims re-encoded as the issuer writes them are the payload's
//     bytes exactly;
//  5. the key id names a trusted key; the signature is 64 bytes and verifies under the
//     rules of ed25519-dalek's verify_strict: crypto/ed25519 refuses a non-canonical s,
//     and this package refuses a small-order R or public key (filippo.io/edwards25519,
//     the curve library crypto/ed25519 is built on).
//
// Every refusal is one of ErrMalformed, ErrUnknownKey, ErrBadSignature or ErrWrongLock
// (test with errors.Is). What this package does not do: it does not know whether an
// epoch is still current (a genuine token stays genuine forever; staleness is the
// resource's high-water decision), and it is not access control.
package token

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"filippo.io/edwards25519"
)

// Prefix is the version part of every token of this format.
const Prefix = "pal1"

// MaxTokenLen is the longest token text accepted, in bytes.
const MaxTokenLen = 4096

// MaxHolderLen is the longest holder accepted, in bytes of UTF-8.
const MaxHolderLen = 256

// The refusal classes of docs/token-format.md. A refusal wraps one of them with its
// reason.
var (
	ErrMalformed    = errors.New("malformed token")
	ErrUnknownKey   = errors.New("token signed by a key not trusted")
	ErrBadSignature = errors.New("token signature does not verify")
	ErrWrongLock    = errors.New("token is for another lock")
)

// Claims is what a token says: holder Holder acquired lock Lock and was given epoch
// Epoch; KeyID names the key that signed it.
type Claims struct {
	Lock   string
	Epoch  uint64
	Holder string
	KeyID  string
}

func malformed(why string) error { return fmt.Errorf("%w: %s", ErrMalformed, why) }

// ValidLockName reports whether name is a legal lock name: 1 to 128 characters from
// [A-Za-z0-9._-], not "." or "..".
func ValidLockName(name string) bool {
	if len(name) == 0 || len(name) > 128 || name == "." || name == ".." {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

// KeyIDOf is a public key's id: the first 8 bytes of its SHA-256, in lowercase hex.
func KeyIDOf(public ed25519.PublicKey) string {
	sum := sha256.Sum256(public)
	return hex.EncodeToString(sum[:8])
}

// KeyRing holds the public keys a resource trusts, by key id.
type KeyRing struct {
	keys map[string]ed25519.PublicKey
}

// NewKeyRing is an empty ring: it trusts nothing.
func NewKeyRing() *KeyRing {
	return &KeyRing{keys: map[string]ed25519.PublicKey{}}
}

// Add trusts a 32-byte Ed25519 public key and returns its id. A key that is not a valid
// point, or of small order, is refused.
func (r *KeyRing) Add(public []byte) (string, error) {
	if len(public) != ed25519.PublicKeySize {
		return "", fmt.Errorf("a public key is %d bytes, not %d", ed25519.PublicKeySize, len(public))
	}
	if smallOrder(public) {
		return "", errors.New("the public key is not a point of large order")
	}
	key := ed25519.PublicKey(bytes.Clone(public))
	id := KeyIDOf(key)
	r.keys[id] = key
	return id, nil
}

// Len is how many keys are trusted.
func (r *KeyRing) Len() int { return len(r.keys) }

// Listing is the body of GET /v1/keys.
type Listing struct {
	Keys []ListedKey `json:"keys"`
}

// ListedKey is one key of a Listing.
type ListedKey struct {
	KeyID     string `json:"key_id"`
	Alg       string `json:"alg"`
	PublicKey string `json:"public_key"`
	// Status is "active", "verifying" or "retired"; absent from older servers.
	Status *string `json:"status"`
}

// RingFromListing is the ring GET /v1/keys describes: every Ed25519 key whose status is
// active or verifying (or absent), each checked against its listed id. A retired key, or
// a status or algorithm this version does not know, is left out: unknown fails closed.
func RingFromListing(listing Listing) (*KeyRing, error) {
	ring := NewKeyRing()
	for _, key := range listing.Keys {
		trusted := key.Status == nil || *key.Status == "active" || *key.Status == "verifying"
		if !trusted || key.Alg != "Ed25519" {
			continue
		}
		raw, err := base64.RawURLEncoding.Strict().DecodeString(key.PublicKey)
		if err != nil || len(raw) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("key %q: not 32 bytes of base64url", key.KeyID)
		}
		id, err := ring.Add(raw)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", key.KeyID, err)
		}
		if id != key.KeyID {
			return nil, fmt.Errorf("key %q is listed under the wrong id (its id is %q)", key.KeyID, id)
		}
	}
	return ring, nil
}

// Verifier verifies tokens against a key ring, caching the tokens it verified by their
// whole text (signature included), so that an edited token can never hit an entry made
// for the genuine one. Safe for concurrent use.
type Verifier struct {
	mu       sync.RWMutex
	ring     *KeyRing
	cache    map[string]Claims
	capacity int
}

// NewVerifier trusts ring and remembers up to capacity verified tokens.
func NewVerifier(ring *KeyRing, capacity int) *Verifier {
	return &Verifier{ring: ring, cache: map[string]Claims{}, capacity: capacity}
}

// SetKeys trusts exactly ring from now on: tokens of a key not in it are refused from
// the moment SetKeys returns, cached or not.
func (v *Verifier) SetKeys(ring *KeyRing) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.ring = ring
}

// Verify checks token and returns its claims.
func (v *Verifier) Verify(token string) (Claims, error) {
	v.mu.RLock()
	claims, hit := v.cache[token]
	ring := v.ring
	v.mu.RUnlock()
	if hit {
		if _, trusted := ring.keys[claims.KeyID]; trusted {
			return claims, nil
		}
	}
	claims, err := verify(ring, token)
	if err != nil {
		return Claims{}, err
	}
	v.mu.Lock()
	if len(v.cache) >= v.capacity {
		clear(v.cache) // a bounded cache; verifying again is only slower
	}
	if v.capacity > 0 {
		v.cache[token] = claims
	}
	v.mu.Unlock()
	return claims, nil
}

// VerifyFor checks token as Verify does, and that it is for lock (ErrWrongLock if not).
func (v *Verifier) VerifyFor(token, lock string) (Claims, error) {
	claims, err := v.Verify(token)
	if err != nil {
		return Claims{}, err
	}
	if claims.Lock != lock {
		return Claims{}, fmt.Errorf("%w: token is for lock %q, not %q", ErrWrongLock, claims.Lock, lock)
	}
	return claims, nil
}

func verify(ring *KeyRing, token string) (Claims, error) {
	if len(token) > MaxTokenLen {
		return Claims{}, malformed("token too long")
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return Claims{}, malformed("expected pal1.<payload>.<signature>")
	}
	if parts[0] != Prefix {
		return Claims{}, malformed("unknown token version")
	}
	payload, err := decodePart(parts[1], "payload")
	if err != nil {
		return Claims{}, err
	}
	claims, err := parseClaims(payload)
	if err != nil {
		return Claims{}, err
	}
	if !bytes.Equal(CanonicalPayload(claims), payload) {
		return Claims{}, malformed("payload is not in canonical form")
	}
	key, ok := ring.keys[claims.KeyID]
	if !ok {
		return Claims{}, fmt.Errorf("%w: %q", ErrUnknownKey, claims.KeyID)
	}
	signature, err := decodePart(parts[2], "signature")
	if err != nil {
		return Claims{}, err
	}
	if len(signature) != ed25519.SignatureSize {
		return Claims{}, malformed("signature has the wrong length")
	}
	signed := token[:len(parts[0])+1+len(parts[1])]
	if smallOrder(signature[:32]) || !ed25519.Verify(key, []byte(signed), signature) {
		return Claims{}, ErrBadSignature
	}
	return claims, nil
}

// decodePart decodes strict base64url without padding. Go's decoder skips line breaks,
// which the format does not allow, so every character is checked first.
func decodePart(text, what string) ([]byte, error) {
	for i := 0; i < len(text); i++ {
		c := text[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '_'
		if !ok {
			return nil, malformed(what + " is not base64url without padding")
		}
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(text)
	if err != nil {
		return nil, malformed(what + " is not base64url without padding")
	}
	return raw, nil
}

// parseClaims reads the four claims and checks their shape. Spelling (order, white
// space, escapes, extra or repeated fields) is left to the canonical check.
func parseClaims(payload []byte) (Claims, error) {
	var raw struct {
		L *string      `json:"l"`
		E *json.Number `json:"e"`
		H *string      `json:"h"`
		K *string      `json:"k"`
	}
	if err := json.Unmarshal(payload, &raw); err != nil {
		return Claims{}, malformed("payload is not the JSON of the claims")
	}
	if raw.L == nil || raw.E == nil || raw.H == nil || raw.K == nil {
		return Claims{}, malformed("a claim is missing")
	}
	epoch, err := strconv.ParseUint(raw.E.String(), 10, 64)
	if err != nil || epoch == 0 {
		return Claims{}, malformed("the epoch is not an integer from 1 to 2^64-1")
	}
	claims := Claims{Lock: *raw.L, Epoch: epoch, Holder: *raw.H, KeyID: *raw.K}
	if !ValidLockName(claims.Lock) {
		return Claims{}, malformed("illegal lock name")
	}
	if len(claims.Holder) > MaxHolderLen {
		return Claims{}, malformed("holder longer than 256 bytes")
	}
	return claims, nil
}

// CanonicalPayload is the payload the issuer writes for claims: {"l":…,"e":…,"h":…,"k":…}
// with no white space, strings escaped exactly as docs/token-format.md says.
func CanonicalPayload(c Claims) []byte {
	var b bytes.Buffer
	b.WriteString(`{"l":`)
	writeString(&b, c.Lock)
	b.WriteString(`,"e":`)
	b.WriteString(strconv.FormatUint(c.Epoch, 10))
	b.WriteString(`,"h":`)
	writeString(&b, c.Holder)
	b.WriteString(`,"k":`)
	writeString(&b, c.KeyID)
	b.WriteByte('}')
	return b.Bytes()
}

func writeString(b *bytes.Buffer, s string) {
	const hexDigits = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if c < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte(hexDigits[c>>4])
				b.WriteByte(hexDigits[c&0xf])
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
}

// smallOrder reports whether an encoded point is not a point, or is of small order
// (its multiple by the cofactor is the identity), as ed25519-dalek's verify_strict
// refuses for the public key and for R.
func smallOrder(encoded []byte) bool {
	p, err := new(edwards25519.Point).SetBytes(encoded)
	if err != nil {
		return true
	}
	return new(edwards25519.Point).MultByCofactor(p).Equal(edwards25519.NewIdentityPoint()) == 1
}
