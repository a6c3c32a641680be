#!/usr/bin/env bash
# Short, bounded runs of every fuzz target (FUZZTIME each, default 10s).
# Longer by hand: FUZZTIME=10m scripts/fuzz.sh
# Minimizing a new interesting input may take up to -fuzzminimizetime
# (Go's default 60s) during which no new input is tried: short runs cap it
# (FUZZMINTIME, default 2s) or they do little else.
#
# Go before 1.27 can end a run that found nothing with a bare "context
# deadline exceeded" failure at the -fuzztime boundary: a race in its fuzz
# coordinator between the run's deadline and its workers' shutdown
# (go.dev/issue/75804). Such a run wrote no failing input, so it is run
# again, at most FUZZRETRIES times (default 4). A run that writes a failing
# input, or fails any other way, fails at once.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-10s}
mt=${FUZZMINTIME:-2s}
retries=${FUZZRETRIES:-4}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# coordinator_race: the failed run in $log found nothing, and its only
# failure is the deadline the coordinator itself set.
coordinator_race() {
	! grep -q 'Failing input written to' "$log" &&
		[ "$(grep -c -- '--- FAIL' "$log")" = 1 ] &&
		grep -A1 -- '--- FAIL' "$log" | tail -n 1 | grep -qx '[[:space:]]*context deadline exceeded'
}

grep -rl --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)' . | sort | while read -r file; do
	pkg="./$(dirname "${file#./}")"
	for target in $(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$file" | sed 's/^func //'); do
		tries=0
		while :; do
			echo "-- $target ($pkg, $t)"
			if go test -run '^$' -fuzz "^${target}\$" -fuzztime "$t" -fuzzminimizetime "$mt" "$pkg" >"$log" 2>&1; then
				tail -n 3 "$log"
				break
			fi
			if [ "$tries" -lt "$retries" ] && coordinator_race; then
				tries=$((tries + 1))
				tail -n 4 "$log"
				echo "   (no failing input written: Go's fuzz coordinator ended the run on its own deadline; again, $tries of $retries)"
				continue
			fi
			cat "$log"
			exit 1
		done
	done
done
