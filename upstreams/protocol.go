package upstreams

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Protocol is what a client speaks over its WebSocket, and what a provider
// serves.
type Protocol string

const (
	// ProtocolAny is a provider that serves every client (the default).
	ProtocolAny Protocol = "any"
	// ProtocolCDP is the Chrome DevTools Protocol: Puppeteer, chromedp,
	// Playwright's connectOverCDP.
	ProtocolCDP Protocol = "cdp"
	// ProtocolPlaywright is Playwright's own protocol: chromium.connect()
	// to a launchServer / run-server endpoint.
	ProtocolPlaywright Protocol = "playwright"
	// ProtocolBiDi is WebDriver BiDi over a socket of its own: Firefox's
	// remote agent, Puppeteer's protocol 'webDriverBiDi'. (WebdriverIO and
	// Selenium create their session over HTTP first: ProtocolWebDriver.)
	ProtocolBiDi Protocol = "bidi"
	// ProtocolWebDriver is classic WebDriver over HTTP (Selenium,
	// WebdriverIO): a session created with POST <base>/session, commands
	// sent to <base>/session/<id>/…, and the BiDi or CDP socket its create
	// answer names. Its providers are chromedriver, geckodriver, Selenium
	// Grid and cloud hubs.
	ProtocolWebDriver Protocol = "webdriver"
)

// ParseProtocol reads a provider's protocol option ("" is any).
func ParseProtocol(s string) (Protocol, error) {
	switch p := Protocol(strings.ToLower(strings.TrimSpace(s))); p {
	case "":
		return ProtocolAny, nil
	case ProtocolAny, ProtocolCDP, ProtocolPlaywright, ProtocolBiDi, ProtocolWebDriver:
		return p, nil
	}
	return "", fmt.Errorf("protocol %q: want cdp, playwright, bidi, webdriver or any", s)
}

// Resumable reports whether a session of a client speaking p may be
// parked and taken back: CDP ones only. A Playwright client's protocol
// state lives in its connection, and a WebDriver BiDi session is ended
// with its client.
func (p Protocol) Resumable() bool { return p == ProtocolCDP }

// ParsePlaywrightVersion checks a playwright_version option: major.minor,
// both non-negative integers ("1.65"). It returns the canonical form.
func ParsePlaywrightVersion(s string) (string, error) {
	v, ok := majorMinor(s)
	if !ok || strings.Count(s, ".") != 1 {
		return "", fmt.Errorf("playwright_version %q: want <major>.<minor>, like 1.65", s)
	}
	return v, nil
}

// majorMinor returns "x.y" from "x.y" or "x.y.z…" (the rest ignored), with
// x and y decimal integers.
func majorMinor(s string) (string, bool) {
	parts := strings.SplitN(s, ".", 3)
	if len(parts) < 2 {
		return "", false
	}
	major, err1 := strconv.ParseUint(parts[0], 10, 32)
	minor, err2 := strconv.ParseUint(parts[1], 10, 32)
	if err1 != nil || err2 != nil {
		return "", false
	}
	return strconv.FormatUint(major, 10) + "." + strconv.FormatUint(minor, 10), true
}

// ClientProtocol recognises what a client speaks from its upgrade request:
// its header h and the path of its request URI (without the query).
//
// A handshake that carries an x-playwright-browser header speaks
// Playwright's protocol (chromium.connect() sends it; connectOverCDP does
// not), and its version is the major.minor of the first
// "Playwright/x.y.z" product in its User-Agent ("" when there is none).
// One whose path is a WebDriver BiDi endpoint (see IsBiDiPath) speaks
// BiDi. Everything else speaks CDP: a Playwright User-Agent alone does
// not count, because connectOverCDP sends it too.
func ClientProtocol(h http.Header, path string) (p Protocol, version string) {
	if _, ok := h["X-Playwright-Browser"]; ok {
		return ProtocolPlaywright, playwrightUAVersion(h.Get("User-Agent"))
	}
	if IsBiDiPath(path) {
		return ProtocolBiDi, ""
	}
	return ProtocolCDP, ""
}

// IsBiDiPath reports whether an upgrade's path names a WebDriver BiDi
// endpoint: its last segment is "session" (Firefox's /session, also
// behind a prefix), or its last two are "session/<id>" (a session's own
// endpoint). Case is ignored, and so is one trailing slash; path holds no
// query.
func IsBiDiPath(path string) bool {
	path = strings.TrimSuffix(path, "/")
	dir, last := path, ""
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		dir, last = path[:i], path[i+1:]
	} else {
		return false // not an absolute path
	}
	if isSessionSegment(last) {
		return true
	}
	if last == "" {
		return false
	}
	j := strings.LastIndexByte(dir, '/')
	return j >= 0 && isSessionSegment(dir[j+1:])
}

// isSessionSegment reports whether a path segment is "session" in any
// ASCII case (no Unicode folding: "ſession" is not one).
func isSessionSegment(s string) bool {
	return len(s) == len("session") && strings.ToLower(s) == "session"
}

// playwrightUAVersion finds "Playwright/x.y…" in a User-Agent.
func playwrightUAVersion(ua string) string {
	for _, product := range strings.Fields(ua) {
		name, ver, ok := strings.Cut(product, "/")
		if !ok || !strings.EqualFold(name, "Playwright") {
			continue
		}
		if v, ok := majorMinor(ver); ok {
			return v
		}
	}
	return ""
}

// Serves tells whether a provider of protocol p (and, for playwright, of
// version pv, "" for any version) can ever serve a client speaking cp at
// version cv. WebDriver clients are served by webdriver providers only,
// and those serve no other client: an "any" provider speaks WebSocket
// protocols, not WebDriver's HTTP.
func Serves(p Protocol, pv string, cp Protocol, cv string) bool {
	switch p {
	case ProtocolAny, "":
		return cp != ProtocolWebDriver
	case ProtocolWebDriver:
		return cp == ProtocolWebDriver
	case ProtocolCDP:
		return cp == ProtocolCDP
	case ProtocolBiDi:
		return cp == ProtocolBiDi
	case ProtocolPlaywright:
		if cp != ProtocolPlaywright {
			return false
		}
		return pv == "" || cv == "" || pv == cv
	}
	return false
}

// Prefers tells whether a provider is an exact version match for a
// Playwright client (a playwright provider declaring the client's version):
// such providers are tried before the others that may serve it.
func Prefers(p Protocol, pv string, cp Protocol, cv string) bool {
	return cp == ProtocolPlaywright && p == ProtocolPlaywright && pv != "" && pv == cv
}
