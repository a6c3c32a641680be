package browserfailover

import (
	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// parseSessionAPI reads a provider's session API block:
//
//	session_api {
//		create       <METHOD> <URL>
//		header       <field> <value>    # repeatable
//		body         <json template>
//		connect_url  <JSON pointer>
//		session_id   <JSON pointer>
//		release      <METHOD> <URL with {session_id}>
//		release_body <json template>
//		connect_hosts <host>...          # repeatable
//		list         <METHOD> <URL>
//		list_ids     <JSON pointer>
//		reap_untracked [on|off]
//		insecure_connect [on|off]
//	}
//
// A JSON template is one token: quote it with backticks, like
// `{"projectId": "{env.BB_PROJECT_ID}"}`. connect_hosts names hosts the
// connect URL of a create answer may point to besides the create URL's
// host and the names under its registrable domain: host names or IP
// addresses, or *.example.com for every name under example.com.
// insecure_connect lets a create call over https answer a plain ws:// or
// http:// connect URL (dialed with the provider's headers in clear text).
func (r *reader) parseSessionAPI(prefix string) (*upstreams.SessionAPI, error) {
	d := r.d
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	c := &upstreams.SessionAPI{}
	validate := func() error { return config.Within(prefix, upstreams.ValidateSessionAPI(*c)) }
	err := r.open("header", "connect_hosts").each(prefix+"session_api", nil, validate, func(opt string) (err error) {
		switch opt {
		case "create":
			c.CreateMethod, c.CreateURL, err = twoArgs(d)
		case "release":
			c.ReleaseMethod, c.ReleaseURL, err = twoArgs(d)
		case "header":
			var f, v string
			if f, v, err = twoArgs(d); err == nil {
				c.Headers = append(c.Headers, upstreams.Header{Field: f, Value: v})
			}
		case "body":
			c.Body, err = oneArg(d)
		case "release_body":
			c.ReleaseBody, err = oneArg(d)
		case "connect_url":
			c.ConnectURL, err = oneArg(d)
		case "session_id":
			c.SessionID, err = oneArg(d)
		case "list":
			c.ListMethod, c.ListURL, err = twoArgs(d)
		case "list_ids":
			c.ListIDs, err = oneArg(d)
		case "reap_untracked":
			c.ReapUntracked, err = onOff(d, true)
		case "insecure_connect":
			c.InsecureConnect, err = onOff(d, true)
		case "connect_hosts":
			hosts := d.RemainingArgs()
			if len(hosts) == 0 {
				err = d.Errf("connect_hosts needs at least one host")
			}
			c.ConnectHosts = append(c.ConnectHosts, hosts...)
		default:
			return errUnknownOption
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}
