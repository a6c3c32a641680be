package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/browserfailover/caddy-browser-failover/internal/conf"
)

// ProvidersConfig is a providers block (JSON key "dynamic_providers"):
// providers found at run time. Its source is one of Caddy's dynamic
// upstream modules (namespace http.reverse_proxy.upstreams: srv, a, multi,
// or a third party's, such as a Docker or Consul source), used as
// reverse_proxy uses it; each address it gives is a provider named
// <name>/<host>:<port>, reached at <scheme>://<host>:<port><path>, with
// the block's provider options. Its JSON object is a provider's (name and
// every provider option; no url) with dynamic, scheme and path besides.
type ProvidersConfig struct {
	// The provider options of every provider found; Name is the block's
	// name (required; no "/"), and URL must be empty: each found
	// provider's URL is made from its address.
	ProviderConfig
	// SourceRaw is the source of addresses, a module of namespace
	// http.reverse_proxy.upstreams named by its "source" key, with its
	// own options (refresh, resolvers, …). Required.
	SourceRaw json.RawMessage `json:"dynamic,omitempty" caddy:"namespace=http.reverse_proxy.upstreams inline_key=source"`
	// Scheme is how each address is reached: "ws", "wss", "http" or
	// "https" (http(s) addresses are discovered at /json/version, as a
	// configured provider's). Default: "http".
	Scheme string `json:"scheme,omitempty"`
	// Path is the path (and query, if any) after each address, starting
	// with "/". Default: "/".
	Path string `json:"path,omitempty"`
}

// DefaultScheme is the scheme of found providers when the block names
// none: CDP discovery at each address.
const DefaultScheme = "http"

// TemplateAddress is the address a block's options are checked at, and
// its providers' template made at (never dialed: TEST-NET-1): the form of
// each found provider's URL is known only once its address is.
const TemplateAddress = "192.0.2.1:9222"

// FoundName is the name of the provider found by block at address (a
// host:port, its host's trailing dot already dropped).
func FoundName(block, address string) string { return block + "/" + address }

// At is the provider the block makes of address, a host:port whose host
// has no trailing dot: its name, its URL, and the block's options (shared
// with the block: read them, never change them).
func (b *ProvidersConfig) At(address string) *ProviderConfig {
	p := b.ProviderConfig
	p.Name = FoundName(b.Name, address)
	scheme, path := b.Scheme, b.Path
	if scheme == "" {
		scheme = DefaultScheme
	}
	if path == "" {
		path = "/"
	}
	p.URL = scheme + "://" + address + path
	return &p
}

// Address is a found address as a provider uses it: the host:port of
// dial (what a source gives, maybe with a network before a slash, such
// as tcp4/host:port), its host's trailing dot dropped (an SRV target
// browser-0.browsers.example. is browser-0.browsers.example); ok is false
// for what is not a TCP host:port (a Unix socket, a port range).
func Address(dial string) (string, bool) {
	addr, err := caddy.ParseNetworkAddress(dial)
	if err != nil || addr.IsUnixNetwork() || addr.PortRangeSize() != 1 || addr.StartPort == 0 || addr.Host == "" {
		return "", false
	}
	host := strings.TrimSuffix(addr.Host, ".")
	if host == "" {
		return "", false
	}
	return net.JoinHostPort(host, fmt.Sprint(addr.StartPort)), true
}

// Validate checks the block: its name, source, scheme and path, and its
// provider options with the provider's own validators (at an example
// address). Every message starts with the block's name.
func (b *ProvidersConfig) Validate() error {
	if b.Name == "" {
		return conf.Problemf("providers", "providers needs a name")
	}
	var errs []error
	if strings.Contains(b.Name, "/") {
		errs = append(errs, conf.Problemf("providers", "the name must not hold \"/\": each provider found is named <name>/<host>:<port>"))
	}
	if b.URL != "" {
		errs = append(errs, conf.Problemf("url", "a found provider's URL is made from its address: give scheme and path, not url"))
	}
	if len(b.SourceRaw) == 0 {
		errs = append(errs, &conf.Problem{Options: []string{"dynamic"}, Whole: true,
			Msg: "no source: dynamic srv|a|multi|<module> says where the providers are found"})
	} else if err := CheckSource(b.SourceRaw); err != nil {
		errs = append(errs, conf.Problemf("dynamic", "dynamic: %v", err))
	}
	schemeOK := true
	switch b.Scheme {
	case "", "ws", "wss", "http", "https":
	default:
		schemeOK = false
		errs = append(errs, conf.Problemf("scheme", "scheme %q: want ws, wss, http or https", b.Scheme))
	}
	pathOK := b.Path == "" || strings.HasPrefix(b.Path, "/") && !strings.Contains(b.Path, "#")
	if !pathOK {
		errs = append(errs, conf.Problemf("path", "path %q must start with / and hold no fragment", b.Path))
	}
	if schemeOK && pathOK && b.URL == "" {
		// The provider options, as a provider at an address has them.
		errs = append(errs, b.At(TemplateAddress).validateOptions())
	}
	return Within(fmt.Sprintf("providers %q: ", b.Name), errors.Join(errs...))
}

// CheckProbeTarget checks the merged health check hc (nil: none) of the
// block's providers as CheckProbeTarget checks a provider's.
func (b *ProvidersConfig) CheckProbeTarget(hc *HealthCheckConfig) error {
	return Within(fmt.Sprintf("providers %q: ", b.Name), probeTarget(b.At(TemplateAddress), hc))
}

// CheckSource checks a dynamic source's JSON as Caddy will load it: its
// "source" names a module of namespace http.reverse_proxy.upstreams that
// gives upstreams, and the rest are that module's fields (strictly).
func CheckSource(raw json.RawMessage) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return errors.New("want a JSON object naming its module in \"source\"")
	}
	var name string
	if err := json.Unmarshal(obj["source"], &name); err != nil || name == "" {
		return errors.New("no module named: \"source\" names one (srv, a, multi, …)")
	}
	id := "http.reverse_proxy.upstreams." + name
	mod, err := caddy.GetModule(id)
	if err != nil {
		return fmt.Errorf("unknown source module %q", name)
	}
	inst := mod.New()
	if _, ok := inst.(reverseproxy.UpstreamSource); !ok {
		return fmt.Errorf("module %s is not a source of upstreams", id)
	}
	delete(obj, "source")
	rest, _ := json.Marshal(obj)
	if err := caddy.StrictUnmarshalJSON(rest, inst); err != nil {
		return fmt.Errorf("%s: %v", name, err)
	}
	return nil
}

// MarshalJSON writes the block as one object: its provider options (as a
// provider writes them; the empty url left out) with dynamic, scheme and
// path.
func (b *ProvidersConfig) MarshalJSON() ([]byte, error) {
	opts, err := b.ProviderConfig.MarshalJSON()
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(opts, &m); err != nil {
		return nil, err
	}
	if bytes.Equal(m["url"], []byte(`""`)) {
		delete(m, "url")
	}
	own, err := json.Marshal(struct {
		SourceRaw json.RawMessage `json:"dynamic,omitempty"`
		Scheme    string          `json:"scheme,omitempty"`
		Path      string          `json:"path,omitempty"`
	}{b.SourceRaw, b.Scheme, b.Path})
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(own, &m); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}
