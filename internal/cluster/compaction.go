package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3compactor"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.uber.org/zap"
)

// Compaction modes, etcd's own: periodic keeps a window of time, revision
// a number of revisions, off keeps everything (the database then only
// grows, and etcd slows down as it does).
const (
	CompactionPeriodic = v3compactor.ModePeriodic
	CompactionRevision = v3compactor.ModeRevision
	CompactionOff      = "off"
)

// DefaultCompaction is what an embedded member does unless told otherwise:
// keep the last 10 seconds of history (compacting every 10 seconds, so
// between 10 and 20 seconds are kept). Short, because every lock and
// election hand-off leaves a deleted key in etcd's key index until it is
// compacted, and reads of a queue walk them all: in ten minutes of mixed
// traffic on one daemon (go run ./bench -only soak), lock throughput stayed
// at 526-538 cycles/s with 10 seconds kept, fell to 91 with nothing
// compacted, and halved already with one minute kept. What a short window
// costs: an election observer or a read at a revision older than it gets
// the current state or a "compacted" error.
var DefaultCompaction = Compaction{Mode: CompactionPeriodic, Retention: "10s"}

// Compaction says how much of etcd's history (its old revisions) is kept.
//
// What coordd needs from history, and what a client sees once it is gone:
//   - config watches resume from a revision out of each member's watch
//     cache, which is rebuilt from the release records, not from etcd's
//     history: compaction does not change what they get;
//   - election observers resume from a revision: within the retention they
//     replay; past it they start from the current state;
//   - config release history, rollback and diff read release records, never
//     old revisions, so compaction loses none of them;
//   - locks, fencing tokens, terms and lock-delay records live in current
//     keys and never need history.
//
// Reading at a compacted revision fails with a "compacted" error.
type Compaction struct {
	Mode string
	// Retention is a duration for periodic ("1m", "1h": compaction runs
	// every retention, at most hourly, down to the revision of one
	// retention ago) and a number of revisions for revision ("100000":
	// compaction runs every 5 minutes, keeping that many).
	Retention string
}

// Validate reports a mode or retention etcd would not take, in the words
// of coordd's flags.
func (c Compaction) Validate() error {
	_, err := c.retention()
	return err
}

// Off reports whether c keeps all history.
func (c Compaction) Off() bool { return c.Mode == CompactionOff }

// Etcd returns c as etcd's embed.Config takes it (AutoCompactionMode and
// AutoCompactionRetention); off is a retention of "0".
func (c Compaction) Etcd() (mode, retention string) {
	if c.Off() {
		return CompactionPeriodic, "0"
	}
	if c.Mode == CompactionPeriodic {
		d, _ := time.ParseDuration(c.Retention)
		return c.Mode, d.String() // never a bare number: etcd would read hours
	}
	return c.Mode, c.Retention
}

// retention is the retention as etcd's compactor takes it: a duration for
// periodic, a revision count (typed as a Duration) for revision.
func (c Compaction) retention() (time.Duration, error) {
	switch c.Mode {
	case CompactionOff:
		return 0, nil
	case CompactionPeriodic:
		d, err := time.ParseDuration(c.Retention)
		if err != nil || d < time.Second {
			return 0, fmt.Errorf("--compaction-retention %q: periodic compaction keeps a duration of at least 1s, such as 1m or 1h", c.Retention)
		}
		return d, nil
	case CompactionRevision:
		n, err := strconv.ParseInt(c.Retention, 10, 64)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("--compaction-retention %q: revision compaction keeps a number of revisions, such as 100000", c.Retention)
		}
		return time.Duration(n), nil
	default:
		return 0, fmt.Errorf("--compaction-mode %q: want periodic, revision or off", c.Mode)
	}
}

// RunCompactor compacts the etcd cluster behind cli as c says until ctx
// ends, with etcd's own compactor (the one an embedded member runs on its
// leader). It is for an external etcd cluster; several coordd daemons may
// run it against one cluster (a compaction another already did is not an
// error). It returns at once when c is off.
func RunCompactor(ctx context.Context, cli *clientv3.Client, c Compaction, lg *zap.Logger) error {
	retention, err := c.retention()
	if err != nil || c.Off() {
		return err
	}
	comp, err := v3compactor.New(lg, c.Mode, retention, &revGetter{ctx: ctx, cli: cli}, compactable{cli})
	if err != nil {
		return err
	}
	comp.Run()
	<-ctx.Done()
	comp.Stop()
	return nil
}

// revGetter reads the cluster's current revision for the compactor, which
// cannot take an error: after a failed read it gets the last one read.
type revGetter struct {
	ctx  context.Context
	cli  *clientv3.Client
	last int64
}

func (r *revGetter) Rev() int64 {
	ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	defer cancel()
	// Any key answers with the current revision in its header.
	if resp, err := r.cli.Get(ctx, "\x00", clientv3.WithCountOnly()); err == nil {
		r.last = resp.Header.Revision
	}
	return r.last
}

type compactable struct{ cli *clientv3.Client }

func (c compactable) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	resp, err := c.cli.Compact(ctx, r.Revision)
	if errors.Is(err, rpctypes.ErrCompacted) {
		return nil, mvcc.ErrCompacted // another compactor got there first
	}
	if err != nil {
		return nil, err
	}
	return (*pb.CompactionResponse)(resp), nil
}
