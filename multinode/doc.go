// Package multinode holds the multi-node tests of browser_failover's shared
// state (package cluster wired into the handler): real Caddy processes built
// from ./cmd/caddy, sharing one throwaway redis-server, in front of fake
// providers run by the test; and a single gateway process where what a
// test measures is the process itself (its memory under slow WebDriver
// command bodies). Everything listens on 127.0.0.1 only, and every
// process is killed when its test ends.
//
//	go test -count=1 -race ./multinode/ -v
//
// The tests need redis-server (scripts/redis-setup.sh installs it): without
// it they skip, except under CI=true where they fail. The package has no
// code of its own; the tests are in package multinode_test.
package multinode
