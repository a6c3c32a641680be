#!/usr/bin/env bash
# Short, bounded runs of every fuzz target (FUZZTIME each, default 10s).
# Longer by hand: FUZZTIME=10m scripts/fuzz.sh
# Minimizing a new interesting input may take up to -fuzzminimizetime
# (Go's default 60s) during which no new input is tried: short runs cap it
# (FUZZMINTIME, default 2s) or they do little else.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-10s}
mt=${FUZZMINTIME:-2s}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
grep -rl --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)' . | sort | while read -r file; do
	pkg="./$(dirname "${file#./}")"
	for target in $(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$file" | sed 's/^func //'); do
		echo "-- $target ($pkg, $t)"
		go test -run '^$' -fuzz "^${target}\$" -fuzztime "$t" -fuzzminimizetime "$mt" "$pkg" >"$log" 2>&1 || { cat "$log"; exit 1; }
		tail -n 3 "$log"
	done
done
