package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/internal/conf"
)

// Defaults applied by Open to zero fields of Config.
const (
	DefaultKeyPrefix = "browser_failover:"
	DefaultLeaseTTL  = 15 * time.Second
	DefaultTimeout   = 500 * time.Millisecond
)

// Config is how a Store reaches Redis and how long its leases live. Its
// settings are also the JSON form of the gateway's Redis block (JSON key
// "redis" under "state"), checked by Validate; Logger, Clock and Hooks are
// set by the program.
type Config struct {
	// Address is host:port of a single Redis server; in a gateway's
	// config it may hold {env.X} placeholders, resolved before Open.
	// Credentials go in Username and Password, never here. Exactly one
	// of Address, Sentinel and Cluster is required.
	Address string `json:"address,omitempty"`
	// Sentinel reaches the master that Redis Sentinel names, and follows
	// it when the sentinels promote a replica.
	Sentinel *Sentinel `json:"sentinel,omitempty"`
	// Cluster is the seed addresses (host:port) of a Redis Cluster; the
	// client learns the other nodes from them.
	Cluster []string `json:"cluster,omitempty"`
	// SentinelUsername and SentinelPassword are the sentinels' own
	// credentials, when they differ from the servers' (Sentinel only).
	// The password may hold {env.X} placeholders and is never logged.
	SentinelUsername string `json:"sentinel_username,omitempty"`
	SentinelPassword string `json:"sentinel_password,omitempty"`
	// Username is the ACL user (Redis 6+). Default: Redis's default user.
	Username string `json:"username,omitempty"`
	// Password may hold {env.X} placeholders in a gateway's config; Open
	// takes it resolved. It is never logged nor put in an error. Default:
	// none.
	Password string `json:"password,omitempty"`
	// DB is the database number, not negative. Default: 0.
	DB int `json:"db,omitempty"`
	// KeyPrefix goes before every key and the pub/sub channel; nodes
	// sharing state must use the same. Default: DefaultKeyPrefix.
	KeyPrefix string `json:"key_prefix,omitempty"`
	// TLS connects with TLS when set (empty: with the system's roots),
	// verifying the host of Address, or with Sentinel or Cluster the host
	// each server is dialed at, unless it names a server. Default: plain
	// TCP.
	TLS *conf.TLS `json:"tls,omitempty"`
	// LeaseTTL is how long a lease lives without renewal: a dead node's
	// slots are free again within one LeaseTTL; at least 30ms. Default:
	// DefaultLeaseTTL.
	LeaseTTL caddy.Duration `json:"lease_ttl,omitempty"`
	// Timeout bounds every Redis call (dial included); must be positive
	// and, when both are given, shorter than LeaseTTL. Default:
	// DefaultTimeout.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// Logger receives renewal and subscription trouble; nil logs nothing.
	Logger *zap.Logger `json:"-"`
	// Clock is this node's clock, the one its cooldowns run on: the ends
	// of shared cooldowns and skips are given on it. Nil is the real one.
	// Redis' own clock keeps the shared deadlines, so the nodes' clocks
	// need not agree.
	Clock Clock `json:"-"`
	// Hooks are told how the shared state fares (the gateway counts it in
	// its metrics). Only the Shared that Use opens calls them; Open does
	// not.
	Hooks Hooks `json:"-"`
}

// Sentinel names a Sentinel-managed master and the sentinels that know
// it (JSON key "sentinel" of the Redis settings).
type Sentinel struct {
	// Master is the master's name in the sentinels' configuration.
	Master string `json:"master"`
	// Addresses are host:port of sentinels (at least one; the others are
	// learnt from it).
	Addresses []string `json:"addresses"`
}

// The modes of reaching Redis, as Mode reports them.
const (
	ModeStandalone = "standalone"
	ModeSentinel   = "sentinel"
	ModeCluster    = "cluster"
)

// Mode tells how cfg reaches Redis: ModeStandalone, ModeSentinel or
// ModeCluster (the first one given; Validate rejects several).
func (cfg Config) Mode() string {
	switch {
	case cfg.Address != "":
		return ModeStandalone
	case cfg.Sentinel != nil:
		return ModeSentinel
	case len(cfg.Cluster) > 0:
		return ModeCluster
	}
	return ModeStandalone
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
		cfg.LeaseTTL = caddy.Duration(DefaultLeaseTTL)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = caddy.Duration(DefaultTimeout)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return cfg
}

// minLeaseTTL keeps the renewal period (LeaseTTL/3) meaningful.
const minLeaseTTL = 30 * time.Millisecond

// Validate checks the settings as configured, their placeholders not yet
// resolved (an address holding one is checked by Open, resolved); stated
// tells whether an option was written at all, since a stated zero
// duration is an error where one left out takes its default (nil: none
// stated). Its error joins *conf.Problem values; it never repeats the
// address, which could hold credentials when mistyped as a URL, nor the
// password.
func (cfg Config) Validate(stated func(option string) bool) error {
	return cfg.validate(stated, false)
}

func (cfg Config) validate(stated func(option string) bool, resolved bool) error {
	given := func(o string) bool { return stated != nil && stated(o) }
	var errs []error
	checkAddr := func(option, what, addr string) {
		switch {
		case addr == "":
			errs = append(errs, conf.Problemf(option, "redis %s: empty address", what))
		case !resolved && strings.Contains(addr, "{"):
			// A placeholder: its value is checked once resolved.
		default:
			if err := checkAddress(addr); err != "" {
				errs = append(errs, conf.Problemf(option, "redis %s %s", what, err))
			}
		}
	}
	var modes []string
	if cfg.Address != "" || given("address") {
		modes = append(modes, "address")
		checkAddr("address", "address", cfg.Address)
	}
	if sn := cfg.Sentinel; sn != nil {
		modes = append(modes, "sentinel")
		if sn.Master == "" {
			errs = append(errs, conf.Problemf("sentinel", "redis sentinel needs the master's name then at least one sentinel address"))
		}
		if len(sn.Addresses) == 0 {
			errs = append(errs, conf.Problemf("sentinel", "redis sentinel needs at least one sentinel address (host:port)"))
		}
		for _, a := range sn.Addresses {
			checkAddr("sentinel", "sentinel address", a)
		}
	}
	if len(cfg.Cluster) > 0 || given("cluster") {
		modes = append(modes, "cluster")
		if len(cfg.Cluster) == 0 {
			errs = append(errs, conf.Problemf("cluster", "redis cluster needs at least one seed address (host:port)"))
		}
		for _, a := range cfg.Cluster {
			checkAddr("cluster", "cluster address", a)
		}
		if cfg.DB != 0 {
			errs = append(errs, &conf.Problem{Options: []string{"db", "cluster"},
				Msg: fmt.Sprintf("redis db must be 0 with cluster (Redis Cluster has one database), got %d", cfg.DB)})
		}
	}
	switch {
	case len(modes) == 0:
		errs = append(errs, &conf.Problem{Options: []string{"address", "sentinel", "cluster"}, Whole: true,
			Msg: "redis needs one of address (host:port), sentinel <master> <host:port>... or cluster <host:port>..."})
	case len(modes) > 1:
		errs = append(errs, &conf.Problem{Options: modes,
			Msg: "redis takes exactly one of address, sentinel and cluster, got " + strings.Join(modes, " and ")})
	}
	if cfg.Sentinel == nil {
		for o, v := range map[string]string{"sentinel_username": cfg.SentinelUsername, "sentinel_password": cfg.SentinelPassword} {
			if v != "" {
				errs = append(errs, conf.Problemf(o, "redis %s applies to sentinel only", o))
			}
		}
	}
	if cfg.DB < 0 {
		errs = append(errs, conf.Problemf("db", "redis db must not be negative, got %d", cfg.DB))
	}
	switch ttl := time.Duration(cfg.LeaseTTL); {
	case ttl < 0 || (ttl == 0 && given("lease_ttl")):
		errs = append(errs, conf.Problemf("lease_ttl", "redis lease_ttl must be positive, got %v", ttl))
	case ttl > 0 && ttl < minLeaseTTL:
		errs = append(errs, conf.Problemf("lease_ttl", "redis lease_ttl must be at least %v, got %v", minLeaseTTL, ttl))
	}
	if t := time.Duration(cfg.Timeout); t < 0 || (t == 0 && given("timeout")) {
		errs = append(errs, conf.Problemf("timeout", "redis timeout must be positive, got %v", t))
	}
	if cfg.LeaseTTL > 0 && cfg.Timeout > 0 && cfg.Timeout >= cfg.LeaseTTL {
		errs = append(errs, &conf.Problem{Options: []string{"lease_ttl", "timeout"},
			Msg: fmt.Sprintf("redis timeout must be shorter than lease_ttl, got %v and %v", time.Duration(cfg.Timeout), time.Duration(cfg.LeaseTTL))})
	}
	errs = append(errs, cfg.TLS.Validate())
	return errors.Join(errs...)
}

// checkAddress tells what is wrong with a host:port ("" when nothing).
func checkAddress(addr string) string {
	if strings.ContainsAny(addr, "@/") {
		return "must be host:port, not a URL; give credentials as username and password"
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "must be host:port"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "must be host:port with a port in 1-65535"
	}
	return ""
}

// tlsConfig builds the TLS configuration (nil: plain TCP), reading the CA
// files.
func (cfg Config) tlsConfig() (*tls.Config, error) {
	if cfg.TLS == nil {
		return nil, nil
	}
	// The host of a single server; with Sentinel or Cluster the servers
	// are learnt, and each is verified by the name it is dialled at
	// unless a name is given.
	host := ""
	if cfg.Address != "" {
		host, _, _ = net.SplitHostPort(cfg.Address)
	}
	return cfg.TLS.Config(host)
}

// Resolved returns a copy of cfg whose addresses, master name, user names
// and passwords have the placeholders known when the config loads (a
// gateway's {env.X}) resolved by known: what the gateway opens its store
// with.
func (cfg Config) Resolved(known func(string) string) Config {
	cfg.Address = known(cfg.Address)
	cfg.Username, cfg.Password = known(cfg.Username), known(cfg.Password)
	cfg.SentinelUsername, cfg.SentinelPassword = known(cfg.SentinelUsername), known(cfg.SentinelPassword)
	if sn := cfg.Sentinel; sn != nil {
		cfg.Sentinel = &Sentinel{Master: known(sn.Master), Addresses: resolvedAll(sn.Addresses, known)}
	}
	cfg.Cluster = resolvedAll(cfg.Cluster, known)
	return cfg
}

// resolvedAll is a copy of list with known applied to each item (nil for
// none).
func resolvedAll(list []string, known func(string) string) []string {
	var out []string
	for _, s := range list {
		out = append(out, known(s))
	}
	return out
}

// The go-redis settings common to the three modes: every call bounded by
// Timeout through its context, no automatic command retries (a retried
// write could take a second slot), no background maintenance protocol.
const (
	// A handful of connections serve a gateway's decisions (one round
	// trip each); idle ones go after a minute.
	poolSize    = 16
	connMaxIdle = time.Minute
)

// options builds the go-redis options of a single server.
func (cfg Config) options(tc *tls.Config) *redis.Options {
	return &redis.Options{
		Addr:                  cfg.Address,
		Username:              cfg.Username,
		Password:              cfg.Password,
		DB:                    cfg.DB,
		TLSConfig:             tc,
		DialTimeout:           time.Duration(cfg.Timeout),
		DialerRetries:         1,
		ReadTimeout:           time.Duration(cfg.Timeout),
		WriteTimeout:          time.Duration(cfg.Timeout),
		PoolTimeout:           time.Duration(cfg.Timeout),
		ContextTimeoutEnabled: true,
		PoolSize:              poolSize,
		ConnMaxIdleTime:       connMaxIdle,
		MaxRetries:            -1,
		DisableIdentity:       true,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	}
}

// failoverOptions builds the go-redis options of a Sentinel-managed
// master. dialed is told the address of every new connection to the
// master (the one the sentinels name at the time).
func (cfg Config) failoverOptions(tc *tls.Config, dialed func(addr string)) *redis.FailoverOptions {
	timeout := time.Duration(cfg.Timeout)
	return &redis.FailoverOptions{
		MasterName:       cfg.Sentinel.Master,
		SentinelAddrs:    cfg.Sentinel.Addresses,
		SentinelUsername: cfg.SentinelUsername,
		SentinelPassword: cfg.SentinelPassword,
		Username:         cfg.Username,
		Password:         cfg.Password,
		DB:               cfg.DB,
		TLSConfig:        tc,
		// Every new connection, to a sentinel or to the master, runs
		// this; one to the master (the library names its client
		// "FailoverClient") asks the server its own address.
		OnConnect: func(ctx context.Context, cn *redis.Conn) error {
			if !strings.Contains(cn.String(), "FailoverClient") {
				return nil
			}
			info, err := cn.ClientInfo(ctx).Result()
			if err == nil && info != nil && info.LAddr != "" {
				dialed(info.LAddr)
			}
			// Not known (an ACL without CLIENT INFO): the connection
			// serves all the same.
			return nil
		},
		DialTimeout:           timeout,
		DialerRetries:         1,
		ReadTimeout:           timeout,
		WriteTimeout:          timeout,
		PoolTimeout:           timeout,
		ContextTimeoutEnabled: true,
		PoolSize:              poolSize,
		ConnMaxIdleTime:       connMaxIdle,
		MaxRetries:            -1,
		DisableIdentity:       true,
	}
}

// clusterOptions builds the go-redis options of a Redis Cluster. Redirects
// (MOVED, ASK) are followed: the command did not run where it was sent.
func (cfg Config) clusterOptions(tc *tls.Config) *redis.ClusterOptions {
	timeout := time.Duration(cfg.Timeout)
	return &redis.ClusterOptions{
		Addrs:                 cfg.Cluster,
		Username:              cfg.Username,
		Password:              cfg.Password,
		TLSConfig:             tc,
		MaxRedirects:          3,
		DialTimeout:           timeout,
		DialerRetries:         1,
		ReadTimeout:           timeout,
		WriteTimeout:          timeout,
		PoolTimeout:           timeout,
		ContextTimeoutEnabled: true,
		PoolSize:              poolSize,
		ConnMaxIdleTime:       connMaxIdle,
		MaxRetries:            -1,
		DisableIdentity:       true,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	}
}
