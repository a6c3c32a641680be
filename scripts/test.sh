#!/usr/bin/env bash
# Every test: installs what the suites need when it is missing (Debian's
# chromium, firefox-esr, redis-server and redis-sentinel, the e2e npm packages), then vets and runs the Go tests,
# including the real-browser end-to-end suite and short fuzz runs.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -x e2e/setup.sh ]; then
	e2e/setup.sh
fi
# The shared-state tests start their own redis-server on 127.0.0.1.
if [ -x scripts/redis-setup.sh ]; then
	scripts/redis-setup.sh
fi

echo "== gofmt / go vet"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change: $unformatted"
	exit 1
fi
go vet ./...

# The relay reads sockets directly where the system allows it; it must
# still build, tests included, where Caddy runs but these tests do not (the
# packages with Caddy in them build there unchanged).
for target in windows/amd64 darwin/arm64 freebsd/amd64 linux/386; do
	GOOS=${target%/*} GOARCH=${target#*/} go vet ./upstreams ./cooldown ./queue
done

echo "== go test"
go test -count=1 -race -timeout 20m ./...

if [ -x scripts/fuzz.sh ]; then
	echo "== short fuzz runs"
	scripts/fuzz.sh
fi
