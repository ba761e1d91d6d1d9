package chaos

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/coordd/coordd/clientlib"
)

// Config workers: a publisher and subscribers of one namespace.
const (
	KindPublisher  = "publisher"
	KindSubscriber = "subscriber"
	// ConfigNamespace is the namespace they use.
	ConfigNamespace = "chaos/config"
	// OpPublish is a publish: Token is the number n it wrote to both
	// keys (Result ok, or unknown when the answer was lost).
	OpPublish = "publish"
	// OpSeen is a subscriber's callback: Token is the release it saw,
	// Result "a,b" the two keys' values in that snapshot.
	OpSeen = "seen"
)

// runPublisher publishes n = 1, 2, ... to the keys a and b of
// ConfigNamespace in one release each, until ctx ends. SabotageTorn
// publishes a and b in two releases instead.
func runPublisher(ctx context.Context, c *clientlib.Client, rec *recorder, sabotage string) {
	for n := int64(1); ctx.Err() == nil; n++ {
		v := strconv.FormatInt(n, 10)
		pctx, cancel := context.WithTimeout(ctx, putTimeout)
		r := Record{Op: OpPublish, Token: n, Call: now()}
		releases := [][]clientlib.ConfigMutation{{{Key: "a", Value: v}, {Key: "b", Value: v}}}
		if sabotage == SabotageTorn {
			releases = [][]clientlib.ConfigMutation{{{Key: "a", Value: v}}, {{Key: "b", Value: v}}}
		}
		var err error
		for _, muts := range releases {
			if _, err = c.ConfigCenter().Publish(pctx, ConfigNamespace, muts, clientlib.PublishOptions{}); err != nil {
				break
			}
		}
		cancel()
		r.Return, r.Result = now(), ResultOK
		if err != nil {
			r.Result, r.Err = ResultUnknown, err.Error()
		}
		rec.add(r)
		pause(ctx, 50*time.Millisecond)
	}
}

// runSubscriber follows ConfigNamespace and records every snapshot its
// callback sees, until ctx ends.
func runSubscriber(ctx context.Context, c *clientlib.Client, rec *recorder) error {
	var sub *clientlib.Subscription
	for {
		var err error
		sub, err = c.ConfigCenter().Subscribe(ctx, []string{ConfigNamespace}, clientlib.WithStartTimeout(5*time.Second))
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		pause(ctx, 100*time.Millisecond)
	}
	defer sub.Close()
	seen := func(snap *clientlib.ConfigSnapshot) {
		a, _ := snap.Get(ConfigNamespace, "a")
		b, _ := snap.Get(ConfigNamespace, "b")
		t := now()
		rec.add(Record{Op: OpSeen, Token: snap.Release(ConfigNamespace), Result: a + "," + b, Call: t, Return: t})
	}
	seen(sub.Snapshot())
	sub.OnNamespace(ConfigNamespace, func(ch clientlib.ConfigChange) { seen(ch.Snapshot) })
	<-ctx.Done()
	return nil
}

// CheckConfig checks each subscriber's sequence of snapshots: releases
// never go back, every snapshot holds one complete publish (a == b), and
// the values never go back either nor exceed what was published.
func CheckConfig(recs []Record) []Violation {
	published := int64(0)
	for _, r := range recs {
		if r.Op == OpPublish {
			published = max(published, r.Token)
		}
	}
	type state struct{ release, n int64 }
	last := map[string]state{}
	var out []Violation
	for _, r := range recs { // in Call order: each subscriber's own order
		if r.Op != OpSeen {
			continue
		}
		a, b, _ := strings.Cut(r.Result, ",")
		if a != b {
			out = append(out, Violation{Checker: "config", What: fmt.Sprintf("%s saw half a release: release %d has a=%q, b=%q", r.Worker, r.Token, a, b)})
			continue
		}
		n, _ := strconv.ParseInt(a, 10, 64)
		prev := last[r.Worker]
		if r.Token < prev.release || n < prev.n {
			out = append(out, Violation{Checker: "config", What: fmt.Sprintf("%s went back: release %d (n=%d) after release %d (n=%d)", r.Worker, r.Token, n, prev.release, prev.n)})
		}
		if n > published {
			out = append(out, Violation{Checker: "config", What: fmt.Sprintf("%s saw n=%d, never published", r.Worker, n)})
		}
		last[r.Worker] = state{r.Token, n}
	}
	return out
}
