// Command caddy is the benchmarks' Caddy: the standard modules,
// browser_failover, and the baseline handler bench_floor (../floor), so
// that every proxy the benchmarks compare runs from one binary.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/browserfailover/caddy-browser-failover"
	_ "github.com/browserfailover/caddy-browser-failover/bench/floor"
)

func main() {
	caddycmd.Main()
}
