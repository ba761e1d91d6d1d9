package election

import "context"

// SetBeforeCampaign makes m call f before each campaign transaction (after
// the call noted the revision it began at). Call it before m is used.
func SetBeforeCampaign(m *Manager, f func()) { m.beforeCampaign = f }

// SetBeforeWait makes m call f before each campaign that waits starts its
// wait for the seat (after its candidacy is written). Call it before m is
// used.
func SetBeforeWait(m *Manager, f func()) { m.beforeWait = f }

// SetSplitTransfer makes Transfer free the seat in one commit and give it
// in another (a vacancy between), to show the tests catch it.
func SetSplitTransfer(m *Manager, on bool) { m.splitTransfer = on }

// SetUnguardedSeat drops the compares that keep a seat single from
// promotions, to show the tests catch two leaders.
func SetUnguardedSeat(m *Manager, on bool) { m.unguarded.Store(on) }

// Promote runs a promotion in name's election now.
func Promote(ctx context.Context, m *Manager, name string) error { return m.promote(ctx, name) }
