#!/usr/bin/env bash
# Quick start: build Caddy with browser_failover (versions pinned in
# xcaddy.json), start two local headless Chromium providers on 9222 and
# 9223, and run the gateway in front of them on 127.0.0.1:8080, with its
# dashboard on 127.0.0.1:8081.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v chromium >/dev/null 2>&1; then
	echo "== installing Debian's chromium"
	as_root apt-get update -qq
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

if [ ! -x bin/caddy ] || [ -n "$(find . -name '*.go' -newer bin/caddy -print -quit)" ] || [ xcaddy.json -nt bin/caddy ]; then
	echo "== building Caddy with browser_failover (xcaddy.json)"
	go run ./internal/tools/xcaddybuild -config xcaddy.json -output bin/caddy
fi

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

for port in 9222 9223; do
	chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
		--disable-background-networking --disable-component-update --disable-sync \
		--user-data-dir="$tmp/chrome-$port" --remote-debugging-address=127.0.0.1 \
		--remote-debugging-port="$port" about:blank >"$tmp/chrome-$port.log" 2>&1 &
	pids+=($!)
done
for port in 9222 9223; do
	for _ in $(seq 1 100); do
		curl -fsS "http://127.0.0.1:$port/json/version" >/dev/null 2>&1 && break
		sleep 0.1
	done
done

cat <<'MSG'
== browser_failover is starting on 127.0.0.1:8080, in front of Chromium on 9222 and 9223
   Puppeteer:   puppeteer.connect({ browserWSEndpoint: 'ws://127.0.0.1:8080/' })
                puppeteer.connect({ browserURL: 'http://127.0.0.1:8080' })
   Playwright:  chromium.connectOverCDP('http://127.0.0.1:8080')
   chromedp:    remote.NewAllocator(ctx, "ws://127.0.0.1:8080/")
   Dashboard:   http://127.0.0.1:8081/   (this machine only; drain, undrain, reset, end sessions)
   Status:      curl -s http://127.0.0.1:2019/browser_failover/status
   Sessions:    curl -s http://127.0.0.1:2019/browser_failover/sessions
   End one:     curl -s -X DELETE http://127.0.0.1:2019/browser_failover/sessions/<id>
   Caddy's access log lines below name each client's session_id and provider.
   Stop with Ctrl-C.
MSG
bin/caddy run --config examples/quickstart.Caddyfile --adapter caddyfile &
pids+=($!)
wait "${pids[-1]}"
