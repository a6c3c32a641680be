package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/zap"
)

// Defaults applied by Open to zero fields of Config.
const (
	DefaultKeyPrefix = "browser_failover:"
	DefaultLeaseTTL  = 15 * time.Second
	DefaultTimeout   = 500 * time.Millisecond
)

// TLS configures a TLS connection to Redis.
type TLS struct {
	// ServerName is the name verified in the server's certificate; default
	// the host of Config.Address.
	ServerName string
	// InsecureSkipVerify disables verification of the server's
	// certificate. For tests only.
	InsecureSkipVerify bool
	// CAFiles are PEM files of the CAs trusted for the server's
	// certificate, instead of the system roots.
	CAFiles []string
}

// Config is how a Store reaches Redis and how long its leases live.
type Config struct {
	// Address is the Redis server as host:port. Credentials go in
	// Username and Password, never here.
	Address string
	// Username is the ACL user (Redis 6+); empty for the default user.
	Username string
	// Password is the already resolved password. It is never logged nor
	// put in an error.
	Password string
	// DB is the database number.
	DB int
	// KeyPrefix is put before every key and the pub/sub channel; default
	// DefaultKeyPrefix. Nodes sharing state must use the same prefix.
	KeyPrefix string
	// TLS, when non-nil, makes the connection use TLS; nil is plain TCP.
	TLS *TLS
	// LeaseTTL is how long a lease lives without renewal: a dead node's
	// slots are free again within one LeaseTTL. Default DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Timeout bounds every Redis call (dial included); default
	// DefaultTimeout.
	Timeout time.Duration
	// Logger receives renewal and subscription trouble; nil logs nothing.
	Logger *zap.Logger
	// Clock is this node's clock, the one its cooldowns run on: the ends
	// of shared cooldowns and skips are given on it. Nil is the real one.
	// Redis' own clock keeps the shared deadlines, so the nodes' clocks
	// need not agree.
	Clock Clock
	// Hooks are told how the shared state fares (the gateway counts it in
	// its metrics). Only the Shared that Use opens calls them; Open does
	// not.
	Hooks Hooks
}

// Clock is a node's time source; tests give one that is off.
type Clock interface {
	Now() time.Time
}

// withDefaults returns cfg with zero fields set to their defaults.
func (cfg Config) withDefaults() Config {
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = DefaultKeyPrefix
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return cfg
}

// minLeaseTTL keeps the renewal period (LeaseTTL/3) meaningful.
const minLeaseTTL = 30 * time.Millisecond

// validate checks cfg (after withDefaults). Errors never repeat the
// address, which could hold credentials when mistyped as a URL, nor the
// password.
func (cfg Config) validate() error {
	var errs []error
	if cfg.Address == "" {
		errs = append(errs, errors.New("address is required"))
	} else if strings.ContainsAny(cfg.Address, "@/") {
		errs = append(errs, errors.New("address must be host:port, not a URL; give credentials as username and password"))
	} else if _, port, err := net.SplitHostPort(cfg.Address); err != nil {
		errs = append(errs, errors.New("address must be host:port"))
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		errs = append(errs, errors.New("address must be host:port with a port in 1-65535"))
	}
	if cfg.DB < 0 {
		errs = append(errs, fmt.Errorf("db must not be negative, got %d", cfg.DB))
	}
	if cfg.LeaseTTL < minLeaseTTL {
		errs = append(errs, fmt.Errorf("lease_ttl must be at least %v, got %v", minLeaseTTL, cfg.LeaseTTL))
	}
	if cfg.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout must not be negative, got %v", cfg.Timeout))
	}
	return errors.Join(errs...)
}

// tlsConfig builds the TLS configuration, reading the CA files.
func (cfg Config) tlsConfig() (*tls.Config, error) {
	if cfg.TLS == nil {
		return nil, nil
	}
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         cfg.TLS.ServerName,
		InsecureSkipVerify: cfg.TLS.InsecureSkipVerify, //nolint:gosec // explicit opt-in
	}
	if tc.ServerName == "" {
		if host, _, err := net.SplitHostPort(cfg.Address); err == nil {
			tc.ServerName = host
		}
	}
	if len(cfg.TLS.CAFiles) > 0 {
		roots := x509.NewCertPool()
		for _, f := range cfg.TLS.CAFiles {
			pem, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("tls ca file: %w", err)
			}
			if !roots.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("tls ca file %s: no PEM certificate found", f)
			}
		}
		tc.RootCAs = roots
	}
	return tc, nil
}

// options builds the go-redis options: every call bounded by Timeout
// through its context, no automatic command retries (a retried write could
// take a second slot), no background maintenance protocol.
func (cfg Config) options(tc *tls.Config) *redis.Options {
	return &redis.Options{
		Addr:                  cfg.Address,
		Username:              cfg.Username,
		Password:              cfg.Password,
		DB:                    cfg.DB,
		TLSConfig:             tc,
		DialTimeout:           cfg.Timeout,
		DialerRetries:         1,
		ReadTimeout:           cfg.Timeout,
		WriteTimeout:          cfg.Timeout,
		PoolTimeout:           cfg.Timeout,
		ContextTimeoutEnabled: true,
		// A handful of connections serve a gateway's decisions (one
		// round trip each); idle ones go after a minute.
		PoolSize:        16,
		ConnMaxIdleTime: time.Minute,
		MaxRetries:      -1,
		DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	}
}
