package browserfailover_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/coder/websocket"
	"golang.org/x/net/http2"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

// TestResumeTokenNotLogged: with Caddy's access log on, a resume token
// shows in no log: a token the gateway hands out on the 101 (HTTP/1.1) or
// on the 200 (HTTP/2) is not among the logged response headers, and a
// token the client brings in its URL, or presents to resume, is taken out
// of the logged URI by the access log filter the docs give
// (docs/securing.md). The gateway's own log, the status and the sessions
// list never hold one either.
func TestResumeTokenNotLogged(t *testing.T) {
	var contacts fakes.Contacts
	a := startFakeBrowser(t, "tl-a", &contacts, false)
	dir := t.TempDir()
	access, gwLog, storage := filepath.Join(dir, "access.log"), filepath.Join(dir, "caddy.log"), filepath.Join(dir, "storage")
	plain, secure, admin := testgw.FreePort(t), testgw.FreePort(t), testgw.FreePort(t)
	site := func(addr string) string {
		return fmt.Sprintf(`%s {
	log {
		output file %s
		format filter {
			wrap json
			request>uri query {
				delete bf_resume_token
				delete bf_resume
			}
			request>headers>Browser-Failover-Resume-Token delete
			request>headers>Browser-Failover-Resume delete
		}
	}
	browser_failover {
		resume 1m
		provider tl-a %s
	}
}
`, addr, access, a.url())
	}
	// A certificate the test makes (no certificate automation: see
	// h2Gateway).
	certPEM, keyPEM := selfSigned(t)
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cf := fmt.Sprintf(`{
	admin %s
	persist_config off
	skip_install_trust
	storage file_system %s
	auto_https disable_redirects
	log {
		output file %s
		format json
		level DEBUG
	}
}

`, admin, storage, gwLog) + site("http://"+plain) + strings.Replace(site("https://"+secure), "\tbrowser_failover {", "\ttls "+certFile+" "+keyFile+"\n\tbrowser_failover {", 1)
	out, err := adapt(t, cf)
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(out, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })
	g := &testgw.Gateway{Addr: plain, Admin: admin, LogPath: gwLog}

	var tokens []string
	// Handed out over HTTP/1.1, then presented to resume.
	c, id, tok := resumeConnect(t, "ws://"+plain+"/", nil)
	if tok == "" {
		t.Fatal("no token handed out")
	}
	tokens = append(tokens, tok)
	ask(t, c, "set 1")
	c.CloseNow()
	waitParked(t, g, id)
	c, _, _ = resumeConnect(t, "ws://"+plain+"/?bf_resume="+tok, nil)
	c.Close(websocket.StatusNormalClosure, "")

	// Brought by the client in its URL, and in a header.
	own := "client-own-token-0123456789abc"
	c, _, got := resumeConnect(t, "ws://"+plain+"/?x=1&bf_resume_token="+own, nil)
	if got != "" {
		t.Fatalf("a client that brought its token was handed %q", got)
	}
	c.Close(websocket.StatusNormalClosure, "")
	tokens = append(tokens, own)
	own2 := "client-header-token-0123456789"
	c, _, _ = resumeConnect(t, "ws://"+plain+"/", map[string][]string{"Browser-Failover-Resume-Token": {own2}})
	c.Close(websocket.StatusNormalClosure, "")
	tokens = append(tokens, own2)

	// Handed out over HTTP/2.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certPEM)
	tr := &http2.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var h2 *h2WS
	testgw.Eventually(t, 20*time.Second, "the gateway over HTTP/2", func() bool {
		h2, err = dialH2(ctx, tr, "https://"+secure+"/", nil)
		return err == nil
	})
	h2tok := h2.resp.Header.Get("Browser-Failover-Resume-Token")
	if h2tok == "" {
		t.Fatal("no token handed out over HTTP/2")
	}
	tokens = append(tokens, h2tok)
	if err := h2.writeFrame(0x1, []byte("who")); err != nil {
		t.Fatal(err)
	}
	if _, p, err := h2.readFrame(); err != nil || string(p) != "tl-a" {
		t.Fatalf("over HTTP/2: %q %v", p, err)
	}
	h2.closeFrame(1000, "")
	h2.close()

	// The status and the sessions list, while sessions are parked.
	_, st, _ := g.AdminDo("GET", "/browser_failover/status", nil)
	_, ss, _ := g.AdminDo("GET", "/browser_failover/sessions", nil)
	time.Sleep(200 * time.Millisecond) // the access log entries of the last requests
	accessLog, _ := os.ReadFile(access)
	gatewayLog, _ := os.ReadFile(gwLog)
	if !strings.Contains(string(accessLog), `"uri":"/?x=1"`) {
		t.Fatalf("the access log lacks the filtered URI:\n%s", accessLog)
	}
	for _, tk := range tokens {
		for name, b := range map[string][]byte{"access log": accessLog, "gateway log": gatewayLog, "status": st, "sessions list": ss} {
			if strings.Contains(string(b), tk) {
				t.Errorf("the %s shows the resume token %s", name, tk)
			}
		}
	}
}
