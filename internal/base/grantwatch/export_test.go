package grantwatch

// SetRecentDeletions makes Watchers remember n deletions per prefix until
// the returned func restores the default.
func SetRecentDeletions(n int) (restore func()) {
	old := recentDeletions
	recentDeletions = n
	return func() { recentDeletions = old }
}
