package token

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The token test vectors (vectors/tokens.json, made by the Rust signer): every vector's
// outcome, and a valid one's claims. A class this test does not know fails it, so a
// vector class added to the file is run here too.
func TestEveryVector(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "vectors", "tokens.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Classes []string `json:"classes"`
		Keys    []struct {
			KeyID     string `json:"key_id"`
			PublicKey string `json:"public_key"`
			Trusted   bool   `json:"trusted"`
		} `json:"keys"`
		Vectors []struct {
			Name   string `json:"name"`
			Token  string `json:"token"`
			Lock   string `json:"lock"`
			Expect string `json:"expect"`
			Claims *struct {
				Lock   string `json:"lock"`
				Epoch  uint64 `json:"epoch"`
				Holder string `json:"holder"`
				KeyID  string `json:"key_id"`
			} `json:"claims"`
		} `json:"vectors"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	ring := NewKeyRing()
	for _, key := range file.Keys {
		if !key.Trusted {
			continue
		}
		public, err := base64.RawURLEncoding.DecodeString(key.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		id, err := ring.Add(public)
		if err != nil || id != key.KeyID {
			t.Fatalf("key %s: id %s, %v", key.KeyID, id, err)
		}
	}
	classes := map[string]error{
		"valid": nil, "malformed": ErrMalformed, "unknown_key": ErrUnknownKey,
		"bad_signature": ErrBadSignature, "wrong_lock": ErrWrongLock,
	}
	for _, class := range file.Classes {
		if _, known := classes[class]; !known {
			t.Fatalf("a class this verifier does not know: %s", class)
		}
	}
	verifier := NewVerifier(ring, 16)
	for _, v := range file.Vectors {
		want, known := classes[v.Expect]
		if !known {
			t.Fatalf("%s: unknown class %s", v.Name, v.Expect)
		}
		claims, err := verifier.VerifyFor(v.Token, v.Lock)
		if want == nil {
			if err != nil {
				t.Errorf("%s: refused: %v", v.Name, err)
				continue
			}
			got := Claims{Lock: v.Claims.Lock, Epoch: v.Claims.Epoch, Holder: v.Claims.Holder, KeyID: v.Claims.KeyID}
			if claims != got {
				t.Errorf("%s: claims %+v, want %+v", v.Name, claims, got)
			}
			continue
		}
		if !errors.Is(err, want) {
			t.Errorf("%s: got %v, want %v", v.Name, err, want)
		}
	}
}

// A token of a key the ring no longer trusts is refused, cached or not.
func TestAReplacedRingRefusesCachedTokens(t *testing.T) {
	public, private, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	ring := NewKeyRing()
	id, err := ring.Add(public)
	if err != nil {
		t.Fatal(err)
	}
	token := sign(private, Claims{Lock: "orders", Epoch: 3, Holder: "w", KeyID: id})
	verifier := NewVerifier(ring, 8)
	if _, err := verifier.Verify(token); err != nil {
		t.Fatal(err)
	}
	verifier.SetKeys(NewKeyRing())
	if _, err := verifier.Verify(token); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("got %v", err)
	}
}

// Small-order public keys are refused by the ring, and a signature with a small-order R
// by the verifier, as ed25519-dalek's verify_strict refuses them.
func TestSmallOrderPointsAreRefused(t *testing.T) {
	identity := make([]byte, 32)
	identity[0] = 1 // y = 1: the identity point
	if _, err := NewKeyRing().Add(identity); err == nil {
		t.Fatal("the identity was trusted as a key")
	}
	public, private, _ := ed25519.GenerateKey(nil)
	ring := NewKeyRing()
	id, _ := ring.Add(public)
	token := sign(private, Claims{Lock: "orders", Epoch: 1, Holder: "w", KeyID: id})
	dot := strings.LastIndexByte(token, '.')
	sig, _ := base64.RawURLEncoding.DecodeString(token[dot+1:])
	copy(sig[:32], identity)
	forged := token[:dot+1] + base64.RawURLEncoding.EncodeToString(sig)
	if _, err := NewVerifier(ring, 0).Verify(forged); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("got %v", err)
	}
}

// The escapes of the canonical form, character by character (docs/token-format.md).
func TestCanonicalStrings(t *testing.T) {
	got := string(CanonicalPayload(Claims{Lock: "a", Epoch: 18446744073709551615, Holder: "\"\\\b\t\n\f\r\x01\x1f/\x7fé", KeyID: "k"}))
	want := `{"l":"a","e":18446744073709551615,"h":"\"\\\b\t\n\f\r\u0001\u001f/` + "\x7fé" + `","k":"k"}`
	if got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
}

func sign(private ed25519.PrivateKey, c Claims) string {
	signed := Prefix + "." + base64.RawURLEncoding.EncodeToString(CanonicalPayload(c))
	return signed + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(private, []byte(signed)))
}
