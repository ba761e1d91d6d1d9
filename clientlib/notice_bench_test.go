package clientlib_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
)

// BenchmarkOutsideReleaseNotice measures how soon a holder learns that its
// lock was released by someone else (an admin, coordctl): from sending the
// outside Release to the holder's Lock.Context being done, against the
// in-process daemon on loopback. It reports the p50 and p99 in ms.
//
//	go test -run '^$' -bench OutsideReleaseNotice -benchtime 500x ./clientlib
func BenchmarkOutsideReleaseNotice(b *testing.B) {
	ctx := b.Context()
	holder, err := clientlib.New(ctx, clientlib.Config{Endpoints: endpoints})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = holder.Close() }()
	admin, err := clientlib.New(ctx, clientlib.Config{Endpoints: endpoints})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = admin.Close() }()
	s, err := holder.NewSession(ctx, clientlib.WithTTL(time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()

	took := make([]time.Duration, 0, b.N)
	for b.Loop() {
		l, err := s.Lock(ctx, "bench/notice")
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := admin.Admin().Release(ctx, "bench/notice", l.Token()); err != nil {
			b.Fatal(err)
		}
		select {
		case <-l.Context().Done():
			took = append(took, time.Since(start))
		case <-time.After(10 * time.Second):
			b.Fatal("the holder was not told of the release within 10s")
		}
	}
	slices.Sort(took)
	ms := func(q float64) float64 {
		return float64(took[min(len(took)-1, int(q*float64(len(took))))].Microseconds()) / 1000
	}
	b.ReportMetric(ms(0.50), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
}
