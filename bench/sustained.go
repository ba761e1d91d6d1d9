package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"github.com/coordd/coordd/clientlib"
)

var sustainedD = flag.Duration("sustained-duration", 20*time.Second, "how long -only sustained cycles one lock per peer")

// benchSustained cycles one lock with one client for a while on each peer,
// each on a fresh daemon, and compares the cycle's p50 in the first and
// the last two seconds. Between compactions (every 10 s by default) etcd's
// index keeps every key written: a lock whose every acquisition writes a
// new key gets slower as they pile up, one whose holders write the same
// keys again does not.
func benchSustained(bin, tmp string) error {
	const window = 2 * time.Second
	fmt.Printf("sustained: one client takes and releases one lock for %s (fresh daemon per peer; p50 of the cycle in the first and last %s)\n", *sustainedD, window)
	fmt.Printf("%-44s %12s %12s %8s %8s\n", "peer", "first p50", "last p50", "last/first", "cycles")
	peers := []struct {
		name  string
		fresh bool // a new request id per acquisition (the SDK before it used ids again)
		mutex bool
	}{
		{name: "coordd SDK"},
		{name: "coordd SDK, a new request id per acquisition", fresh: true},
		{name: "etcd concurrency.Mutex", mutex: true},
	}
	for i, p := range peers {
		d, err := startDaemon(bin, filepath.Join(tmp, fmt.Sprintf("sustained-%d", i)))
		if err != nil {
			return err
		}
		ctx := context.Background()
		var l locker
		if p.mutex {
			l, err = peerNamed(lockPeers(d.grpcAddr, d.etcdURL), etcdMutex).newClient(ctx, "sustained")
		} else {
			var cl locker
			cl, err = coorddPeer(p.name, d.grpcAddr, nil, false).newClient(ctx, "sustained")
			if cl != nil {
				cl.(*coorddLocker).freshIDs = p.fresh
			}
			l = cl
		}
		if err != nil {
			d.stop()
			return err
		}
		var first, last []float64
		var at []time.Duration
		var lat []float64
		start := time.Now()
		for time.Since(start) < *sustainedD {
			t0 := time.Now()
			release, err := l.acquire(ctx)
			if err != nil {
				l.close()
				d.stop()
				return fmt.Errorf("%s: %w", p.name, err)
			}
			if err := release(ctx); err != nil {
				l.close()
				d.stop()
				return fmt.Errorf("%s: release: %w", p.name, err)
			}
			at = append(at, t0.Sub(start))
			lat = append(lat, float64(time.Since(t0).Microseconds()))
		}
		l.close()
		d.stop()
		end := time.Since(start)
		for j, t := range at {
			switch {
			case t < window:
				first = append(first, lat[j])
			case t >= end-window:
				last = append(last, lat[j])
			}
		}
		f, z := percentile(first, 50), percentile(last, 50)
		fmt.Printf("%-44s %10.0fus %10.0fus %8.2f %8d\n", p.name, f, z, z/f, len(lat))
	}
	return nil
}

func freshRequestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// lockOpts are the options of a coordd acquisition.
func (l *coorddLocker) lockOpts() []clientlib.LockOption {
	if l.freshIDs {
		return []clientlib.LockOption{clientlib.WithRequestID(freshRequestID())}
	}
	return nil
}
