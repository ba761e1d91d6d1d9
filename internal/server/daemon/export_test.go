package daemon

// Config is the configuration d runs with (defaults filled in), for tests
// that restart a member from its data.
func (d *Daemon) Config() Config { return d.cfg }

// Metric is the value of one of coordd's own unlabelled counters or gauges
// on d, read from its registry: /metrics in a test process also carries
// etcd's and gRPC's for every daemon in it (half a megabyte, half a second
// to fetch and parse under the race detector). -1 when absent.
func (d *Daemon) Metric(name string) float64 {
	fams, _ := d.registry.Gather() // what failed to gather is absent
	for _, f := range fams {
		if f.GetName() != name || len(f.GetMetric()) == 0 {
			continue
		}
		switch m := f.GetMetric()[0]; {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		}
	}
	return -1
}
