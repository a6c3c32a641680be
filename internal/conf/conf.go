// Package conf holds what the configurations of the gateway's parts have
// in common, so that each is modelled once: the problem a validator
// reports (with the options at fault, for the Caddyfile parser to point
// at their line), and the TLS settings of every TLS client of the gateway
// (a provider's WebSocket, its session API calls and health checks, and
// the Redis connection of the shared state). Packages upstreams and
// cluster import it; it imports no other package of the module.
package conf

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"slices"
)

// Problem is one problem with some settings and the options at fault,
// named as the Caddyfile spells them, so that the parser reports it at
// their line (the last given of them); a JSON config gets the message.
type Problem struct {
	Options []string
	Msg     string
	// Whole: the problem is judged on the whole block (an option
	// missing, or two that clash, either of which may come later); the
	// parser reports it at the block's end.
	Whole bool
}

func (p *Problem) Error() string { return p.Msg }

// Problemf is a Problem of one option.
func Problemf(option, format string, args ...any) *Problem {
	return &Problem{Options: []string{option}, Msg: fmt.Sprintf(format, args...)}
}

// TLS is the TLS settings of a connection the gateway makes (JSON key
// "tls" of a provider and of the Redis settings; Caddyfile options
// tls_*).
type TLS struct {
	// InsecureSkipVerify accepts any certificate
	// (tls_insecure_skip_verify). For tests only. Default: false.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
	// ServerName is sent in SNI and verified against the server's
	// certificate (tls_server_name). Default: the host dialed.
	ServerName string `json:"server_name,omitempty"`
	// TrustedCACertFiles are PEM files of the CAs to trust for the
	// server's certificate (tls_trusted_ca_certs). Default: the system's
	// roots.
	TrustedCACertFiles []string `json:"trusted_ca_certs,omitempty"`
}

// Validate checks the settings (nil: none given).
func (t *TLS) Validate() error {
	if t != nil && slices.Contains(t.TrustedCACertFiles, "") {
		return Problemf("tls_trusted_ca_certs", "tls_trusted_ca_certs: empty file name")
	}
	return nil
}

// Given names the settings given, as the Caddyfile spells them.
func (t *TLS) Given() []string {
	if t == nil {
		return nil
	}
	var opts []string
	if t.InsecureSkipVerify {
		opts = append(opts, "tls_insecure_skip_verify")
	}
	if t.ServerName != "" {
		opts = append(opts, "tls_server_name")
	}
	if len(t.TrustedCACertFiles) > 0 {
		opts = append(opts, "tls_trusted_ca_certs")
	}
	return opts
}

// Config builds the client TLS configuration of a connection to host, the
// name verified unless ServerName is given ("": the name each connection
// is dialed at), reading the CA files. A nil t is the defaults: the
// system's roots, the host's name.
func (t *TLS) Config(host string) (*tls.Config, error) {
	var s TLS
	if t != nil {
		s = *t
	}
	cfg := &tls.Config{
		ServerName:         host,
		InsecureSkipVerify: s.InsecureSkipVerify, //nolint:gosec // an explicit opt-in
		MinVersion:         tls.VersionTLS12,
	}
	if s.ServerName != "" {
		cfg.ServerName = s.ServerName
	}
	if len(s.TrustedCACertFiles) > 0 {
		roots := x509.NewCertPool()
		for _, f := range s.TrustedCACertFiles {
			pem, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("tls_trusted_ca_certs: %w", err)
			}
			if !roots.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("tls_trusted_ca_certs: no PEM certificate in %s", f)
			}
		}
		cfg.RootCAs = roots
	}
	return cfg, nil
}
