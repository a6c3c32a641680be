package browserfailover

import "github.com/browserfailover/caddy-browser-failover/config"

// The configuration's types are package config's, where each has its one
// validator; these names keep them reachable from this package, where the
// Caddyfile fills them.
type (
	ProviderConfig     = config.ProviderConfig
	ProvidersConfig    = config.ProvidersConfig
	CreateRateConfig   = config.CreateRateConfig
	ClientLimitConfig  = config.ClientLimitConfig
	ClientBudgetConfig = config.ClientBudgetConfig
	Concurrency        = config.Concurrency
	StateConfig        = config.StateConfig
	RedisConfig        = config.RedisConfig
	CooldownConfig     = config.CooldownConfig
	QueueConfig        = config.QueueConfig
	SessionConfig      = config.SessionConfig
	AffinityConfig     = config.AffinityConfig
	HealthCheckConfig  = config.HealthCheckConfig
	ResumeConfig       = config.ResumeConfig
	RecordingConfig    = config.RecordingConfig
	ProfilesConfig     = config.ProfilesConfig
)
