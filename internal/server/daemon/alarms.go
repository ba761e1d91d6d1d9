package daemon

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/coordd/coordd/internal/cluster"
)

// How often the daemon reads etcd's alarms: its embedded member's own copy
// every second (no raft round), an external cluster's list (a raft request,
// so a WAL write on every member) every 10 seconds.
const (
	alarmEvery         = time.Second
	externalAlarmEvery = 10 * time.Second
)

// watchAlarms keeps d.alarms current until ctx ends: the embedded member's
// own copy (no raft round), or etcd's list over an external cluster. It
// logs each alarm raised and cleared (coordd_etcd_alarm reads d.alarms).
func (d *Daemon) watchAlarms(ctx context.Context) {
	every := alarmEvery
	if d.etcd == nil {
		every = externalAlarmEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var last []cluster.Alarm
	for {
		var now []cluster.Alarm
		if d.etcd != nil {
			now = cluster.AlarmsFrom(d.etcd.Server.Alarms())
		} else {
			actx, cancel := context.WithTimeout(ctx, alarmEvery) // a late answer waits for the next read
			resp, err := d.cli.AlarmList(actx)
			cancel()
			if err != nil {
				now = last // keep what was known
			} else {
				now = cluster.AlarmsFrom(resp.Alarms)
			}
		}
		for _, a := range now {
			if !slices.Contains(last, a) {
				d.lg.Error("etcd raised an alarm", zap.String("alarm", string(a.Type)), zap.String("member", fmt.Sprintf("%x", a.MemberID)), zap.String("what to do", alarmAdvice(a.Type)))
			}
		}
		for _, a := range last {
			if !slices.Contains(now, a) {
				d.lg.Info("etcd alarm cleared", zap.String("alarm", string(a.Type)), zap.String("member", fmt.Sprintf("%x", a.MemberID)))
			}
		}
		d.alarmMu.Lock()
		d.alarms = now
		d.alarmMu.Unlock()
		last = now
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// currentAlarms returns the alarms watchAlarms last read.
func (d *Daemon) currentAlarms() []cluster.Alarm {
	d.alarmMu.Lock()
	defer d.alarmMu.Unlock()
	return slices.Clone(d.alarms)
}

// alarmError says why the daemon is not ready while alarms are raised, or
// nil.
func (d *Daemon) alarmError() error {
	d.alarmMu.Lock()
	defer d.alarmMu.Unlock()
	if len(d.alarms) == 0 {
		return nil
	}
	var parts []string
	for _, a := range d.alarms {
		parts = append(parts, fmt.Sprintf("%s raised by member %x (%s)", a.Type, a.MemberID, alarmAdvice(a.Type)))
	}
	return fmt.Errorf("etcd alarm: %s", strings.Join(parts, "; "))
}

func alarmAdvice(t cluster.AlarmType) string {
	switch t {
	case cluster.AlarmNoSpace:
		return "the database reached --quota-backend-bytes; writes fail, reads and releases work: compact, run coordctl cluster defrag, then coordctl cluster alarms --disarm"
	case cluster.AlarmCorrupt:
		return "a member's data differs from the others'; writes fail: replace that member from a healthy one"
	}
	return "see etcd's documentation"
}
