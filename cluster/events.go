package cluster

import (
	"encoding/json"
	"time"
)

// The kinds of Event.
const (
	// EventReleased: slots of the provider were freed (a lease released,
	// or dead leases dropped), or a start of its create_rate window was
	// given back; a node waiting for room may try again.
	EventReleased = "released"
	// EventCooldown: a shared failure cooldown of the provider was set,
	// until Event.Until, with doubling count Event.Streak.
	EventCooldown = "cooldown"
	// EventSkip: a shared 408/429 skip of the provider was set, until
	// Event.Until: a skip on every node, with no trial after it.
	EventSkip = "skip"
	// EventRecovered: the provider's shared cooldown and skip were cleared.
	EventRecovered = "recovered"
	// EventResumed: the parked session named by Event.Session (the
	// caller's key of it, such as a keyed hash of its resume token) was
	// taken back (through the node that published it), or ended by an
	// operator: other nodes forget their own entry of it.
	EventResumed = "resumed"
	// EventWanted: a node found the provider full; nodes keeping spare
	// slots of it (see Lease.Release) give them back at once.
	EventWanted = "wanted"
	// EventWebDriverEnd: a node that does not own the WebDriver session
	// named by Event.Session (its route's key) saw it end (the
	// client's DELETE, or the provider's "invalid session id"); the
	// owner (Route.Node) ends it. Event.Provider is empty.
	EventWebDriverEnd = "webdriver_end"
	// EventWebDriverEnded: the owner of the WebDriver session named by
	// Event.Session ended it; the nodes serving its sockets close them.
	// Event.Provider is empty.
	EventWebDriverEnded = "webdriver_ended"
	// EventProfileFree: the profile named by Event.Session (its scope's
	// hash and ID, as the caller names it) was given back; a node whose
	// client waits for it may take it. Event.Provider is empty.
	EventProfileFree = "profile_free"
)

// Event is a change of the shared state, as announced by a node.
type Event struct {
	// Kind is one of the Event kinds above.
	Kind string
	// Provider is the provider's name; empty for the WebDriver kinds.
	Provider string
	// Until is the end of the cooldown or skip on the receiving node's
	// clock; zero for other kinds.
	Until time.Time
	// Streak is the cooldown's doubling count.
	Streak int
	// Node is the node that published the event.
	Node string
	// Session names the parked session of an EventResumed, as the
	// caller keyed it in ParkResume, the WebDriver session of an
	// EventWebDriverEnd or EventWebDriverEnded, or the profile of an
	// EventProfileFree.
	Session string
}

// wireEvent is Event on the channel. A cooldown or skip travels as its
// length from the moment it was published, never as a time of the
// publishing node's clock: the receiver adds it to its own.
type wireEvent struct {
	Kind     string `json:"kind"`
	Provider string `json:"provider"`
	ForMS    int64  `json:"for_ms,omitempty"`
	Streak   int    `json:"streak,omitempty"`
	Node     string `json:"node"`
	Session  string `json:"session,omitempty"`
}

// decodeEvent parses a message of the channel received at now (this
// node's clock).
func decodeEvent(payload string, now time.Time) (Event, bool) {
	var w wireEvent
	if err := json.Unmarshal([]byte(payload), &w); err != nil || w.Kind == "" {
		return Event{}, false
	}
	switch w.Kind {
	case EventWebDriverEnd, EventWebDriverEnded:
		// Of a session, not of a provider.
		if checkRouteID(w.Session) != nil {
			return Event{}, false
		}
	case EventProfileFree:
		// Of a profile.
		if !ValidProfileName(w.Session) {
			return Event{}, false
		}
	default:
		if w.Provider == "" {
			return Event{}, false
		}
	}
	ev := Event{Kind: w.Kind, Provider: w.Provider, Node: w.Node, Streak: w.Streak, Session: w.Session}
	if w.ForMS > 0 {
		ev.Until = now.Add(time.Duration(w.ForMS) * time.Millisecond)
	}
	return ev, true
}
