// Tests of TLS against a real server run with a certificate from a throwaway CA:
// custom CA, untrusted nodes, mutual TLS.

package palisade

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// authority is a throwaway CA that signs certificates into PEM files in a temp dir.
type authority struct {
	t    *testing.T
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// File is the CA certificate's PEM file.
	File string
}

func newAuthority(t *testing.T, name string) *authority {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	a := &authority{t: t, dir: t.TempDir(), cert: cert, key: key}
	a.File = a.write(name+"-ca.pem", "CERTIFICATE", der)
	return a
}

func (a *authority) write(name, kind string, der []byte) string {
	path := filepath.Join(a.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		a.t.Fatal(err)
	}
	return path
}

// issue signs a certificate for name (a server's, for 127.0.0.1, or a client's) and
// answers its PEM file and its key's.
func (a *authority) issue(name string, client bool) (certFile, keyFile string) {
	a.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		a.t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	template := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	if client {
		template.ExtKeyUsage, template.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil
	}
	der, err := x509.CreateCertificate(rand.Reader, template, a.cert, &key.PublicKey, a.key)
	if err != nil {
		a.t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		a.t.Fatal(err)
	}
	return a.write(name+".pem", "CERTIFICATE", der), a.write(name+".key", "PRIVATE KEY", pkcs8)
}

// serveTLS starts a server with a certificate from ca, and answers its https URL.
func serveTLS(t *testing.T, ca *authority, flags ...string) string {
	t.Helper()
	cert, key := ca.issue("server", false)
	base := serve(t, append([]string{"--tls-cert", cert, "--tls-key", key}, flags...)...)
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("a TLS server listening on %s", base)
	}
	return base
}

// A server with a certificate from a CA of our own: trusted with WithCACertFile (or
// WithTLSConfig), refused without it or with another CA (a *TransportError that says why,
// nothing sent); settings that cannot work are refused when the client is made.
func TestTLSWithACustomCA(t *testing.T) {
	ca := newAuthority(t, "palisade-test")
	base := serveTLS(t, ca)
	ctx := context.Background()
	c, err := NewClient([]string{base}, WithCACertFile(ca.File))
	if err != nil {
		t.Fatal(err)
	}
	guard := holdGuard(t, c, "orders", AcquireOptions{Holder: "a", TTL: 5 * time.Second})
	if _, err := guard.Put(ctx, "k", []byte("over TLS")); err != nil {
		t.Fatal(err)
	}
	if err := guard.Release(ctx); err != nil {
		t.Fatal(err)
	}
	other := newAuthority(t, "another")
	for name, client := range map[string]*Client{"system roots": New(base), "another CA": New(base, WithCACertFile(other.File))} {
		_, err := client.Acquire(ctx, "orders", AcquireOptions{Holder: "b", TTL: time.Second})
		var transport *TransportError
		var unknown x509.UnknownAuthorityError
		if !errors.As(err, &transport) || transport.OutcomeUnknown || !errors.As(err, &unknown) {
			t.Fatalf("%s: %#v", name, err)
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	entry, err := New(base, WithTLSConfig(&tls.Config{RootCAs: pool})).Get(ctx, "orders", "k")
	if err != nil || string(entry.Value) != "over TLS" {
		t.Fatalf("%+v %v", entry, err)
	}
	var api *APIError
	if _, err := NewClient([]string{"http://127.0.0.1:1"}, WithCACertFile(ca.File)); !errors.As(err, &api) || api.Code != "bad_request" {
		t.Fatalf("a CA with an http URL: %#v", err)
	}
	if _, err := NewClient([]string{base}, WithCACertFile(filepath.Join(t.TempDir(), "absent.pem"))); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a missing CA file: %#v", err)
	}
	if err := New(base, WithCACertFile(filepath.Join(t.TempDir(), "absent.pem"))).Health(ctx); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("New keeps the error for every call: %#v", err)
	}
}

// A node whose certificate is not trusted is passed over like one that cannot be reached
// (nothing was sent to it): even an acquire moves on to the next node.
func TestAnUntrustedNodeIsPassedOver(t *testing.T) {
	ca, stranger := newAuthority(t, "palisade-test"), newAuthority(t, "stranger")
	untrusted, trusted := serveTLS(t, stranger), serveTLS(t, ca)
	c, err := NewClient([]string{untrusted, trusted}, WithCACertFile(ca.File))
	if err != nil {
		t.Fatal(err)
	}
	lease, err := c.Acquire(context.Background(), "orders", AcquireOptions{Holder: "a", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	status, err := New(untrusted, WithCACertFile(stranger.File)).LockStatus(context.Background(), "orders")
	if err != nil || status.Holder != nil {
		t.Fatalf("the untrusted node granted: %+v %v", status, err)
	}
	if lease.Epoch == 0 {
		t.Fatal(lease)
	}
}

// Mutual TLS: a server run with --tls-client-ca refuses a client without a certificate
// from that CA (a TLS alert: nothing was read, so not an unknown outcome), and serves one
// that presents it (WithClientCertFiles).
func TestMutualTLS(t *testing.T) {
	ca := newAuthority(t, "palisade-test")
	base := serveTLS(t, ca, "--tls-client-ca", ca.File)
	ctx := context.Background()
	_, err := New(base, WithCACertFile(ca.File)).Acquire(ctx, "orders", AcquireOptions{Holder: "a", TTL: time.Second})
	var transport *TransportError
	if !errors.As(err, &transport) || transport.OutcomeUnknown || !strings.Contains(err.Error(), "certificate required") {
		t.Fatalf("without a client certificate: %#v", err)
	}
	cert, key := ca.issue("worker", true)
	c, err := NewClient([]string{base}, WithCACertFile(ca.File), WithClientCertFiles(cert, key))
	if err != nil {
		t.Fatal(err)
	}
	status, err := c.LockStatus(ctx, "orders")
	if err != nil || status.Holder != nil {
		t.Fatalf("the refused acquire took the lock: %+v %v", status, err)
	}
	lease, err := c.Acquire(ctx, "orders", AcquireOptions{Holder: "a", TTL: time.Second})
	if err != nil || lease.Holder != "a" {
		t.Fatalf("%+v %v", lease, err)
	}
}
