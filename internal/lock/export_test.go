package lock

// SetBeforeEnqueue makes m call f before each enqueue transaction of an
// acquisition (after the call noted the revision it began at). Call it
// before m is used.
func SetBeforeEnqueue(m *Manager, f func()) { m.beforeEnqueue = f }

// SetBeforeWait makes m call f before each acquisition that waits
// registers its wait (after its entry is written). Call it before m is
// used.
func SetBeforeWait(m *Manager, f func()) { m.beforeWait = f }

// Waiting returns how many acquisitions wait on m now (registered waits).
func Waiting(m *Manager) int { return m.waits.Waiting() }

// JoinsBehind counts the enqueues (and refused try-locks) that m served
// from its view of a crowded queue, reading no queue head from etcd.
func JoinsBehind(m *Manager) int64 { return m.joinsBehind.Load() }
