// Command caddy is Caddy with the standard modules and browser_failover,
// pinned to the versions in go.mod (the same as xcaddy.json).
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/browserfailover/caddy-browser-failover"
)

func main() {
	caddycmd.Main()
}
