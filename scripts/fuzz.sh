#!/usr/bin/env bash
# Short, bounded runs of every fuzz target (FUZZTIME each, default 10s).
# Longer by hand: FUZZTIME=10m scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-10s}
grep -rl --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)' . | sort | while read -r file; do
	pkg="./$(dirname "${file#./}")"
	for target in $(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$file" | sed 's/^func //'); do
		echo "-- $target ($pkg, $t)"
		go test -run '^$' -fuzz "^${target}\$" -fuzztime "$t" "$pkg" 2>&1 | tail -n 3
	done
done
