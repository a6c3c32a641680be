package browserfailover

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/browserfailover/caddy-browser-failover/spend"
)

// The Caddyfile's spend options: a provider's cost, budget,
// max_concurrent (a number or auto) and create_rate, and the handler's
// client_budget.
// Their values are checked by the validators of config.go.

// parseCost reads `cost <amount> per session|minute|hour [minimum <duration>]`.
func parseCost(d *caddyfile.Dispenser) (*spend.Cost, error) {
	args := d.RemainingArgs()
	if (len(args) != 3 && len(args) != 5) || args[1] != "per" || (len(args) == 5 && args[3] != "minimum") {
		return nil, d.Errf("cost takes an amount and its unit, and optionally a minimum: cost <amount> per session|minute|hour [minimum <duration>]")
	}
	amount, err := spend.ParseAmount(args[0])
	if err != nil {
		return nil, d.Errf("cost: %v", err)
	}
	c := &spend.Cost{Amount: amount, Per: args[2]}
	if len(args) == 5 {
		m, err := caddy.ParseDuration(args[4])
		if err != nil {
			return nil, d.Errf("cost: invalid minimum %q", args[4])
		}
		c.Minimum = caddy.Duration(m)
	}
	return c, nil
}

// parseBudget reads the `<amount> per hour|day|month` of a budget from
// args (those after the option's name, and after client_budget's key).
func parseBudget(d *caddyfile.Dispenser, opt string, args []string) (spend.Budget, error) {
	if len(args) != 3 || args[1] != "per" {
		return spend.Budget{}, d.Errf("%s takes an amount and its window: <amount> per hour|day|month", opt)
	}
	amount, err := spend.ParseAmount(args[0])
	if err != nil {
		return spend.Budget{}, d.Errf("%s: %v", opt, err)
	}
	return spend.Budget{Amount: amount, Per: args[2]}, nil
}

// parseClientBudget reads `client_budget <placeholder> <amount> per hour|day|month`.
func parseClientBudget(d *caddyfile.Dispenser) (*ClientBudgetConfig, error) {
	args := d.RemainingArgs()
	if len(args) != 4 {
		return nil, d.Errf("client_budget takes a key placeholder, an amount and its window: client_budget {http.auth.user.id} 20 per day")
	}
	b, err := parseBudget(d, "client_budget", args[1:])
	if err != nil {
		return nil, err
	}
	return &ClientBudgetConfig{Key: args[0], Budget: b}, nil
}

// parseConcurrency reads `max_concurrent <n>|auto`.
func parseConcurrency(d *caddyfile.Dispenser) (Concurrency, error) {
	v, err := oneArg(d)
	if err != nil {
		return Concurrency{}, err
	}
	if v == "auto" {
		return Concurrency{Auto: true}, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return Concurrency{}, d.Errf("max_concurrent must be an integer or auto, got %q", v)
	}
	return Concurrency{Limit: n}, nil
}

// parseCreateRate reads `create_rate <n> per second|minute`.
func parseCreateRate(d *caddyfile.Dispenser) (*CreateRateConfig, error) {
	args := d.RemainingArgs()
	if len(args) != 3 || args[1] != "per" {
		return nil, d.Errf("create_rate takes a number of sessions and its window: create_rate <n> per second|minute")
	}
	n, err := strconv.Atoi(args[0])
	if err != nil {
		return nil, d.Errf("create_rate: the number of sessions must be an integer, got %q", args[0])
	}
	return &CreateRateConfig{N: n, Per: args[2]}, nil
}
