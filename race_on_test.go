//go:build race

package browserfailover_test

// raceEnabled: the race detector is on (tests that send many requests
// send fewer).
const raceEnabled = true
