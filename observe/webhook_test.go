package observe

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// receiverCheck is the check docs/operating.md shows webhook receivers:
// the timestamp within five minutes of the receiver's clock, then the
// HMAC-SHA256 of "<timestamp>.<raw body>" compared in constant time. It is
// written out here, not taken from the package, so the test proves the
// documented recipe.
func receiverCheck(secret []byte, h http.Header, body []byte, now time.Time) error {
	tsText := h.Get("X-Browser-Failover-Timestamp")
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return errors.New("no timestamp")
	}
	if d := now.Sub(time.Unix(ts, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return errors.New("timestamp too old (or too far ahead)")
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(tsText + "." + string(body)))
	want := "sha256=" + hex.EncodeToString(m.Sum(nil))
	if !hmac.Equal([]byte(h.Get("X-Browser-Failover-Signature")), []byte(want)) {
		return errors.New("bad signature")
	}
	return nil
}

// TestWebhookReplayRejected: a receiver applying the documented check
// accepts a delivery, and rejects the same delivery replayed six minutes
// later, and one whose timestamp was rewritten to look fresh.
func TestWebhookReplayRejected(t *testing.T) {
	secret := []byte("rEpLaY-k3y")
	var mu sync.Mutex
	receiverNow := time.Now
	type seen struct {
		h    http.Header
		body []byte
		err  error
	}
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		err := receiverCheck(secret, r.Header, body, receiverNow())
		got = append(got, seen{r.Header.Clone(), body, err})
		mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
		}
	}))
	defer srv.Close()

	wh, err := newWebhook(&WebhookConfig{URL: srv.URL + "/hook", Secret: string(secret)}, caddy.NewReplacer(), zap.NewNop(), NewMetrics(), shortPacing())
	if err != nil {
		t.Fatal(err)
	}
	wh.start()
	defer wh.close()
	body, _ := encodeEvent(event{name: EventCooldown, at: time.Now(), data: map[string]any{"provider": "a", "until": "x", "reason": "status_429"}})
	wh.enqueue(delivery{event: EventCooldown, body: body})
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no delivery")
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	first := got[0]
	mu.Unlock()
	if first.err != nil {
		t.Fatalf("a fresh delivery was rejected: %v (headers %v)", first.err, first.h)
	}
	if !bytes.Equal(first.body, body) {
		t.Fatalf("body %q", first.body)
	}

	replay := func(h http.Header) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/hook", bytes.NewReader(first.body))
		for _, k := range []string{"Content-Type", "X-Browser-Failover-Event", "X-Browser-Failover-Timestamp", "X-Browser-Failover-Signature"} {
			req.Header.Set(k, h.Get(k))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// The very same request, at once: still within the window.
	if code := replay(first.h); code != http.StatusOK {
		t.Fatalf("the same delivery within the window: %d", code)
	}
	// Six minutes later: rejected.
	mu.Lock()
	receiverNow = func() time.Time { return time.Now().Add(6 * time.Minute) }
	mu.Unlock()
	if code := replay(first.h); code != http.StatusUnauthorized {
		t.Fatalf("a replay six minutes later: %d, want 401", code)
	}
	// With the timestamp made fresh, the signature no longer matches.
	fresh := first.h.Clone()
	fresh.Set("X-Browser-Failover-Timestamp", strconv.FormatInt(time.Now().Add(6*time.Minute).Unix(), 10))
	if code := replay(fresh); code != http.StatusUnauthorized {
		t.Fatalf("a replay with a rewritten timestamp: %d, want 401", code)
	}
	mu.Lock()
	last := got[len(got)-1]
	mu.Unlock()
	if last.err == nil || !strings.Contains(last.err.Error(), "bad signature") {
		t.Fatalf("rewritten timestamp rejected for %v", last.err)
	}
}

// TestWebhookEmptySecret: a secret that resolves to nothing is an error,
// not an unsigned delivery; no secret at all sends unsigned deliveries with
// a timestamp.
func TestWebhookEmptySecret(t *testing.T) {
	t.Setenv("BF_WEBHOOK_SECRET_SET", "s3t")
	repl := caddy.NewReplacer()
	_, err := newWebhook(&WebhookConfig{URL: "http://127.0.0.1:1/", Secret: "{env.BF_WEBHOOK_SECRET_UNSET}"}, repl, zap.NewNop(), NewMetrics(), defaultPacing())
	if err == nil || !strings.Contains(err.Error(), "secret is empty") {
		t.Fatalf("unset secret variable: %v", err)
	}
	wh, err := newWebhook(&WebhookConfig{URL: "http://127.0.0.1:1/", Secret: "{env.BF_WEBHOOK_SECRET_SET}"}, repl, zap.NewNop(), NewMetrics(), defaultPacing())
	if err != nil || string(wh.secret) != "s3t" {
		t.Fatalf("set secret variable: %v", err)
	}
	wh.close()
	if _, err := newWebhook(&WebhookConfig{URL: "http://127.0.0.1:1/"}, repl, zap.NewNop(), NewMetrics(), defaultPacing()); err != nil {
		t.Fatalf("no secret: %v", err)
	}
}

func TestSign(t *testing.T) {
	// printf '1700000000.{}' | openssl dgst -sha256 -hmac k
	const want = "sha256=c6ef4734033cee2367414a0939385eca0397754aa7a59716da7463a9298b5146"
	if got := Sign([]byte("k"), "1700000000", []byte("{}")); got != want {
		t.Fatalf("%s, want %s", got, want)
	}
	if Sign([]byte("k"), "1700000001", []byte("{}")) == want {
		t.Fatal("the timestamp is not signed")
	}
}
