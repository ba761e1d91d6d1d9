package lock

// SetBeforeEnqueue makes m call f before each enqueue transaction of an
// acquisition (after the call noted the revision it began at). Call it
// before m is used.
func SetBeforeEnqueue(m *Manager, f func()) { m.beforeEnqueue = f }
