#!/bin/sh
# Installs what the shared-state tests (go test ./cluster/) need on a fresh
# Debian/Ubuntu machine: Debian's redis-server and redis-sentinel (the
# Sentinel and Cluster tests also use redis-cli, which comes with them),
# when they are not already on the PATH. The tests start their own servers on free ports, so
# the service apt may start is not used (and is left as apt set it up).
# Idempotent and quiet: a second run does nothing.
set -eu

if command -v redis-server >/dev/null 2>&1 && command -v redis-sentinel >/dev/null 2>&1 &&
	command -v redis-cli >/dev/null 2>&1; then
	exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then
	SUDO="sudo"
fi

echo "redis setup: installing redis-server and redis-sentinel"
$SUDO apt-get update -qq
# env, not a prefix assignment: sudo would drop the variable.
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server redis-sentinel redis-tools >/dev/null
