// Names in URL paths: a lock name, lease id or session id is one path segment, a key
// keeps its "/" segments; names that URL normalisation would rewrite are refused before
// anything is sent.

package palisade

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// ErrUnsendablePath is the error of a name that cannot be sent in a URL path: empty, or
// a "." or ".." segment, which URL normalisation (here, or in a proxy) would remove,
// silently addressing another key or route. Nothing is sent.
var ErrUnsendablePath = errors.New("cannot be sent in a URL path")

// segment percent-encodes a name that is exactly one path segment (a lock name, a
// lease id, a session id).
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
