#!/bin/sh
# Installs what the real-browser e2e suite (go test ./e2e/) needs on a fresh
# Debian/Ubuntu machine: Chromium and Firefox ESR (for the WebDriver BiDi
# tests) from apt, Node.js when missing, and the npm
# packages of this folder (puppeteer-core, playwright-core, an older
# playwright-core under the alias playwright-core-old for the version
# mismatch test, browserless, run as a provider on that Chromium, and the
# WebDriver clients WebdriverIO and selenium-webdriver, with Debian's
# chromium-driver; none downloads a browser or a driver), and Debian's
# ffmpeg (with ffprobe), which makes recordings into videos. Idempotent and quiet: a second run does nothing.
set -eu

cd "$(dirname "$0")"

SUDO=""
if [ "$(id -u)" != 0 ]; then
	SUDO="sudo"
fi

apt_updated=""
apt_install() {
	if [ -z "$apt_updated" ]; then
		$SUDO apt-get update -qq
		apt_updated=1
	fi
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if [ ! -x /usr/bin/chromium ]; then
	echo "e2e setup: installing chromium"
	apt_install chromium
fi

if [ ! -x /usr/bin/chromedriver ]; then
	echo "e2e setup: installing chromium-driver"
	apt_install chromium-driver
fi

if [ ! -x /usr/bin/firefox-esr ]; then
	echo "e2e setup: installing firefox-esr"
	apt_install firefox-esr
fi

if [ ! -x /usr/bin/ffmpeg ] || [ ! -x /usr/bin/ffprobe ]; then
	echo "e2e setup: installing ffmpeg"
	apt_install ffmpeg
fi

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	echo "e2e setup: installing nodejs and npm"
	apt_install nodejs npm
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
	echo "e2e setup: warning: node $(node --version) is older than 20; puppeteer-core and playwright-core need 20 or newer" >&2
fi

# Never let an npm package fetch a browser: the suite uses /usr/bin/chromium.
export PUPPETEER_SKIP_DOWNLOAD=1 PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
missing=""
for m in puppeteer-core playwright-core playwright-core-old @browserless.io/browserless webdriverio selenium-webdriver; do
	[ -f "node_modules/$m/package.json" ] || missing=1
done
if [ -n "$missing" ] || [ ! -f node_modules/.package-lock.json ] ||
	{ [ -f package-lock.json ] && [ package-lock.json -nt node_modules/.package-lock.json ]; }; then
	echo "e2e setup: installing npm packages in e2e/"
	if [ -f package-lock.json ]; then
		npm ci --no-audit --no-fund --loglevel=error >/dev/null
	else
		npm install --no-audit --no-fund --loglevel=error >/dev/null
	fi
fi
