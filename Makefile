# Build Caddy with browser_failover as pinned in xcaddy.json, run the quick
# start, or run every test.
.PHONY: build build-dev run test bench clean

build: ## Caddy + plugin via xcaddy, versions from xcaddy.json
	go run ./internal/tools/xcaddybuild -config xcaddy.json -output bin/caddy

build-dev: ## the same modules, built from cmd/caddy with go.mod's pins (fast)
	go build -o bin/caddy ./cmd/caddy

run: ## the quick start: two local Chromium providers behind the gateway
	./scripts/quickstart.sh

test: ## every test, installing what they need
	./scripts/test.sh

bench:
	go run ./bench/compare

clean:
	rm -rf bin

.PHONY: bench-hedge
bench-hedge: ## connect time with and without hedged connects (go run ./bench/hedge -quick: ~20 s)
	go run ./bench/hedge
