package cluster

import (
	"context"
	"fmt"
	"strings"
)

// Share is a provider's state across the cluster.
type Share struct {
	// Active is the number of live leases, all nodes together.
	Active int
	// Nodes maps each node holding live leases to their number.
	Nodes map[string]int
	// Hold is the shared cooldown and skip, ends on this node's clock.
	Hold Hold
}

// ProviderState is a provider's state across the cluster as one node read
// it for the status (Shared.ClusterStates): what the provider's "cluster"
// object shows.
type ProviderState struct {
	// Node is the name of the node that read it.
	Node string
	// Up tells whether the shared state answered; when false, Node is
	// all there is.
	Up bool
	// Share is what the shared state holds of the provider: its live
	// leases over every node and per node, its shared cooldown and skip.
	Share
}

// OverLimit is how many live sessions are above max, a provider's
// max_concurrent (0 when within it, and for max 0, unlimited). Live
// leases are above max only after a node was cut off from the shared
// state longer than its LeaseTTL and put its sessions' leases back.
func OverLimit(live int, max int64) int {
	if max <= 0 || int64(live) <= max {
		return 0
	}
	return int(int64(live) - max)
}

// Snapshot returns the Share of each provider, its live leases and its
// hold, read in one round trip (in Cluster mode, one per provider).
// Expired leases are not counted. Errors wrap ErrUnavailable.
func (ls *Leases) Snapshot(ctx context.Context, providers []string) (map[string]Share, error) {
	out := make(map[string]Share, len(providers))
	if len(providers) == 0 {
		return out, nil
	}
	const op = "read the shared state"
	if ls.c.closed.Load() {
		return nil, ls.c.fail(op, errClosed)
	}
	// Back after an outage or a failover: this node's leases count again
	// before the status shows the shared state up.
	if err := ls.reassert(ctx); err != nil {
		return nil, err
	}
	for _, group := range ls.c.slotGroups(providers) {
		if err := ls.snapshotGroup(ctx, group, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// memberNode returns the node of a lease member (node + "|" + id).
func memberNode(member string) string {
	if i := strings.LastIndexByte(member, '|'); i >= 0 {
		return member[:i]
	}
	return member
}

// snapshotGroup reads the Share of providers (one slot group) into out.
func (ls *Leases) snapshotGroup(ctx context.Context, providers []string, out map[string]Share) error {
	const op = "read the shared state"
	c := ls.c
	keys := make([]string, 0, 2*len(providers))
	for _, p := range providers {
		keys = append(keys, c.leaseKey(p), c.cooldownKey(p))
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	res, err := snapshotScript.Run(ctx, c.rdb, keys).Slice()
	if err != nil {
		return c.fail(op, err)
	}
	if len(res) != 3*len(providers) {
		return c.fail(op, fmt.Errorf("unexpected reply of %d elements", len(res)))
	}
	for i, p := range providers {
		members, _ := res[3*i].([]any)
		sh := Share{Nodes: map[string]int{}}
		for _, m := range members {
			str, ok := m.(string)
			if !ok {
				continue
			}
			sh.Active++
			sh.Nodes[memberNode(str)]++
		}
		cdLeft, _ := parseInt(res[3*i+1])
		skLeft, _ := parseInt(res[3*i+2])
		sh.Hold = c.hold(cdLeft, 0, skLeft)
		out[p] = sh
		ls.sawLive(p, sh.Active)
	}
	return nil
}
