package daemon

// Config is the configuration d runs with (defaults filled in), for tests
// that restart a member from its data.
func (d *Daemon) Config() Config { return d.cfg }
