package observe

// Results of a resume, the label of resumes_total.
const (
	// ResumeOK: the client got its session back.
	ResumeOK = "resumed"
	// ResumeUnknown: no resumable session under that ID and key (never
	// parked, window over, already resumed, bound to another key).
	ResumeUnknown = "unknown"
	// ResumeUnavailable: the session's provider could not take it back
	// (drained, in cooldown, full, no longer configured).
	ResumeUnavailable = "unavailable"
	// ResumeRefused: the provider did not give the same browser back.
	ResumeRefused = "refused"
	// ResumeConflict: a held session the client cannot join (another
	// subprotocol, compression).
	ResumeConflict = "conflict"
	// ResumeNotResumable: a Playwright-protocol client, or a route
	// without resume.
	ResumeNotResumable = "not_resumable"
)
