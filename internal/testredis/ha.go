package testredis

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Sentinel is a Redis Sentinel setup of one test: a master, a replica and
// three sentinels watching them, all on 127.0.0.1, with a short
// down-after (1s) so that a failover takes a few seconds.
type Sentinel struct {
	// Master is the name the sentinels know the master by.
	Master string
	// Primary and Replica are the two servers as started (after a
	// failover the replica is the master).
	Primary, Replica *Server
	// Sentinels are the three sentinels.
	Sentinels []*Server
}

// SentinelAddrs are the sentinels' host:port.
func (s *Sentinel) SentinelAddrs() []string {
	out := make([]string, len(s.Sentinels))
	for i, sn := range s.Sentinels {
		out[i] = sn.Addr()
	}
	return out
}

// StartSentinel starts a master, its replica and three sentinels (extra
// is given to both servers, e.g. "--requirepass", "x"; then also
// masterauth). It returns once every sentinel knows the replica and the
// other sentinels.
func StartSentinel(t testing.TB, extra ...string) *Sentinel {
	t.Helper()
	Binary(t)
	primary := Start(t, extra...)
	replica := Start(t, append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(primary.port)}, extra...)...)
	WaitFor(t, 20*time.Second, "the replica in sync", func() bool {
		return strings.Contains(Cmd(t, replica.Addr(), "INFO", "replication"), "master_link_status:up")
	})
	pw := ""
	for i, a := range extra {
		if a == "--requirepass" && i+1 < len(extra) {
			pw = extra[i+1]
		}
	}
	s := &Sentinel{Master: "bfmaster", Primary: primary, Replica: replica}
	// Debian's redis-sentinel when installed (the same program as
	// redis-server, run with --sentinel).
	bin := Binary(t)
	if p, err := exec.LookPath("redis-sentinel"); err == nil {
		bin = p
	}
	for range 3 {
		port := freePort(t)
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		lines := []string{
			"port " + strconv.Itoa(port),
			"bind 127.0.0.1",
			"dir " + dir,
			"sentinel resolve-hostnames no",
			fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2", s.Master, primary.port),
			fmt.Sprintf("sentinel down-after-milliseconds %s 1000", s.Master),
			fmt.Sprintf("sentinel failover-timeout %s 5000", s.Master),
			fmt.Sprintf("sentinel parallel-syncs %s 1", s.Master),
		}
		if pw != "" {
			lines = append(lines, fmt.Sprintf("sentinel auth-pass %s %s", s.Master, pw))
		}
		if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		sn := &Server{t: t, bin: bin, dir: dir, port: port, conf: conf}
		sn.Start()
		t.Cleanup(sn.Stop)
		s.Sentinels = append(s.Sentinels, sn)
	}
	for _, sn := range s.Sentinels {
		WaitFor(t, 30*time.Second, "a sentinel knowing the replica and the other sentinels", func() bool {
			out := Cmd(t, sn.Addr(), "SENTINEL", "MASTER", s.Master)
			return field(out, "num-slaves") == "1" && field(out, "num-other-sentinels") == "2"
		})
	}
	return s
}

// MasterAddr is the master the first answering sentinel names.
func (s *Sentinel) MasterAddr(t testing.TB) string {
	t.Helper()
	for _, sn := range s.Sentinels {
		out, err := tryCmd(sn.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.Master)
		if err != nil {
			continue
		}
		if f := strings.Fields(out); len(f) == 2 {
			return net.JoinHostPort(f[0], f[1])
		}
	}
	return ""
}

// field finds name in the flat name/value lines redis-cli prints for a
// map reply.
func field(out, name string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := 0; i+1 < len(lines); i++ {
		if strings.TrimSpace(lines[i]) == name {
			return strings.TrimSpace(lines[i+1])
		}
	}
	return ""
}

// Cluster is a Redis Cluster of one test: three masters, no replicas,
// made with redis-cli --cluster create.
type Cluster struct {
	Nodes []*Server
}

// Addrs are the nodes' host:port.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr()
	}
	return out
}

// StartCluster starts three cluster-enabled servers (extra is given to
// each) and joins them in one cluster; it returns once the cluster's
// state is ok on every node.
func StartCluster(t testing.TB, extra ...string) *Cluster {
	t.Helper()
	return startCluster(t, 0, extra)
}

// StartClusterWithReplicas is StartCluster with one replica per master
// (six servers): a master that dies is replaced by its replica.
func StartClusterWithReplicas(t testing.TB, extra ...string) *Cluster {
	t.Helper()
	return startCluster(t, 1, extra)
}

func startCluster(t testing.TB, replicas int, extra []string) *Cluster {
	t.Helper()
	Binary(t)
	cli := cliBinary(t)
	c := &Cluster{}
	for range 3 * (1 + replicas) {
		c.Nodes = append(c.Nodes, Start(t, append([]string{
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000",
		}, extra...)...))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	for i, a := range extra {
		if a == "--requirepass" && i+1 < len(extra) {
			args = append(args, "-a", extra[i+1], "--no-auth-warning")
		}
	}
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v: %s", err, out)
	}
	for _, n := range c.Nodes {
		WaitFor(t, 30*time.Second, "the cluster's state ok", func() bool {
			out, err := tryCmd(n.Addr(), append(authArgs(extra), "CLUSTER", "INFO")...)
			return err == nil && strings.Contains(out, "cluster_state:ok")
		})
		// A replica takes over only once it has synced with its master.
		WaitFor(t, 30*time.Second, "each replica in sync", func() bool {
			out, err := tryCmd(n.Addr(), append(authArgs(extra), "INFO", "replication")...)
			return err == nil && (strings.Contains(out, "role:master") || strings.Contains(out, "master_link_status:up"))
		})
	}
	return c
}

func authArgs(extra []string) []string {
	for i, a := range extra {
		if a == "--requirepass" && i+1 < len(extra) {
			return []string{"-a", extra[i+1], "--no-auth-warning"}
		}
	}
	return nil
}

// cliBinary returns the path of redis-cli (skipping or failing as Binary).
func cliBinary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-cli")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-cli not found; run scripts/redis-setup.sh")
		}
		t.Skip("redis-cli not installed; skipping")
	}
	return bin
}

// Cmd runs one redis-cli command against addr and returns its output;
// args may start with "-a", password, "--no-auth-warning".
func Cmd(t testing.TB, addr string, args ...string) string {
	t.Helper()
	out, err := tryCmd(addr, args...)
	if err != nil {
		t.Fatalf("redis-cli %v: %v: %s", args, err, out)
	}
	return out
}

func tryCmd(addr string, args ...string) (string, error) {
	host, port, _ := net.SplitHostPort(addr)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return "", err
	}
	out, err := exec.Command(cli, append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	return string(out), err
}

// WaitFor polls ok every 50ms until it holds, failing the test after
// limit.
func WaitFor(t testing.TB, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ErrorStats is the server's INFO errorstats: one errorstat_<PREFIX> line
// per kind of error it answered (CROSSSLOT, MOVED...), with its count.
func (r *Server) ErrorStats(t testing.TB, args ...string) string {
	t.Helper()
	return Cmd(t, r.Addr(), append(args, "INFO", "errorstats")...)
}

// MasterOf returns the server that is the master of key's slot now, by
// CLUSTER NODES as a live server sees it; nil while none is (a master
// failed and no replica has taken over yet).
func (c *Cluster) MasterOf(t testing.TB, key string, live *Server) *Server {
	t.Helper()
	slot, err := strconv.Atoi(strings.TrimSpace(Cmd(t, live.Addr(), "CLUSTER", "KEYSLOT", key)))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(Cmd(t, live.Addr(), "CLUSTER", "NODES"), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		for _, r := range f[8:] {
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 == nil && err2 == nil && a <= slot && slot <= b {
				for _, n := range c.Nodes {
					if n.Addr() == addr {
						return n
					}
				}
			}
		}
	}
	return nil
}
