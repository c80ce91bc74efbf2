// TLS: the options for servers run with --tls-cert (a CA of your own, a client
// certificate for mutual TLS, or a whole tls.Config), and the HTTP transport the client
// builds from them (docs/security.md, "TLS and mutual TLS").

package palisade

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// tlsSettings are the TLS options given to the client.
type tlsSettings struct {
	caFile   string
	certFile string
	keyFile  string
	config   *tls.Config
}

func (t tlsSettings) given() bool {
	return t.caFile != "" || t.certFile != "" || t.config != nil
}

// WithCACertFile trusts the CA certificates of a PEM file, and nothing else, for the
// servers' certificates (https URLs). The file is read when the client is made.
func WithCACertFile(path string) Option { return func(c *Client) { c.tls.caFile = path } }

// WithClientCertFiles presents a client certificate (mutual TLS, a server run with
// --tls-client-ca): PEM files of the certificate chain and of its private key (keyFile
// "" when certFile holds both). With authentication on, a principal whose cert_cn is the
// certificate's common name is the caller. Read when the client is made.
func WithClientCertFiles(certFile, keyFile string) Option {
	return func(c *Client) { c.tls.certFile, c.tls.keyFile = certFile, keyFile }
}

// WithTLSConfig uses a copy of config for https connections (WithCACertFile and
// WithClientCertFiles then add to it).
func WithTLSConfig(config *tls.Config) Option { return func(c *Client) { c.tls.config = config } }

// setUpTransport builds the client's HTTP transport from its settings, unless
// WithHTTPClient gave one. A TLS option with an http:// URL is refused (a setting that
// would go unused is not protection), and so is one combined with WithHTTPClient.
func (c *Client) setUpTransport(bases []string) error {
	if c.tls.given() {
		for _, base := range bases {
			if !strings.HasPrefix(base, "https://") {
				return badRequest("a TLS option with the http URL %q would go unused", base)
			}
		}
		if c.http != nil {
			return badRequest("WithHTTPClient and a TLS option: configure TLS on your http.Client's transport")
		}
	}
	if c.http != nil {
		return nil
	}
	var config *tls.Config
	if c.tls.config != nil {
		config = c.tls.config.Clone()
	} else if c.tls.given() {
		config = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if c.tls.caFile != "" {
		pem, err := os.ReadFile(c.tls.caFile)
		if err != nil {
			return fmt.Errorf("palisade: CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return badRequest("CA file %q holds no PEM certificate", c.tls.caFile)
		}
		config.RootCAs = pool
	}
	if c.tls.certFile != "" {
		keyFile := c.tls.keyFile
		if keyFile == "" {
			keyFile = c.tls.certFile
		}
		cert, err := tls.LoadX509KeyPair(c.tls.certFile, keyFile)
		if err != nil {
			return fmt.Errorf("palisade: client certificate: %w", err)
		}
		config.Certificates = append(config.Certificates, cert)
	}
	connect := min(c.connectTimeout, c.timeout)
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.DialContext = (&net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}).DialContext
	transport.TLSHandshakeTimeout = connect
	transport.TLSClientConfig = config
	c.http = &http.Client{
		Transport: transport,
		// An answer is the server's: a redirect (from a proxy) is not followed.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return nil
}
