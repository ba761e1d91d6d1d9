package election

// SetBeforeCampaign makes m call f before each campaign transaction (after
// the call noted the revision it began at). Call it before m is used.
func SetBeforeCampaign(m *Manager, f func()) { m.beforeCampaign = f }
