package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"regexp/syntax"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coordd/coordd/clientlib"
)

var (
	bombPhase   = flag.Duration("bomb-phase", 5*time.Second, "how long each phase of -only schema-bomb lasts (idle, then under attack)")
	bombProfile = flag.String("bomb-profile", "", "write a CPU profile of the daemon under attack (-only schema-bomb) to this file")
)

// benchSchemaBomb measures what a schema's regular expression can cost
// other tenants (issue 59, item 1): the schema of the finding
// ({"additionalProperties":{"pattern":"(?:a?){999}a{999}!x"}}) and a
// 256 KiB value against it, then the costliest pattern coordd accepts
// with the costliest value its validation budget lets through, four
// attackers putting it in a loop, while another tenant puts into a
// namespace of its own. It prints the attacker's outcomes and CPU, and
// the other tenant's put latency idle and under attack (p50, p99, ratio).
func benchSchemaBomb(bin, tmp string) error {
	d, err := startDaemon(bin, filepath.Join(tmp, "schema-bomb"))
	if err != nil {
		return err
	}
	defer d.stop()
	ctx := context.Background()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.grpcAddr}})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	cc := c.ConfigCenter()

	// The finding's schema: refused when set?
	bomb := `{"additionalProperties":{"pattern":"(?:a?){999}a{999}!x"}}`
	err = cc.SetSchema(ctx, "bomb/original", bomb)
	fmt.Printf("The finding's schema %s: set -> %v\n", bomb, orOK(err))

	// The costliest pattern accepted: (?:a?){n}a{n}!x under 2,000 instructions.
	n, insts := 1, 0
	for m := 1; m < 999; m++ {
		k := progSize(fmt.Sprintf("(?:a?){%d}a{%d}!x", m, m))
		if k > 2000 {
			break
		}
		n, insts = m, k
	}
	pattern := fmt.Sprintf("(?:a?){%d}a{%d}!x", n, n)
	if err := cc.SetSchema(ctx, "bomb/ns", fmt.Sprintf(`{"additionalProperties":{"pattern":%q}}`, pattern)); err != nil {
		return fmt.Errorf("set the accepted pattern: %w", err)
	}
	fmt.Printf("The costliest accepted pattern %s: %d instructions\n", pattern, insts)
	huge := strings.Repeat("a", 256<<10)
	cpu0, t0 := d.cpuSeconds(), time.Now()
	_, err = cc.Put(ctx, "bomb/ns", "k", huge, clientlib.PublishOptions{})
	fmt.Printf("A 256 KiB value against it: %v in %s, %.3f CPU-s of the daemon\n", orOK(err), time.Since(t0).Round(time.Millisecond), d.cpuSeconds()-cpu0)
	// The longest value the budget lets the pattern run on: 100,000 steps
	// of 64 instruction-bytes each.
	value := strings.Repeat("a", 100_000*16/insts-16)
	cpu0, t0 = d.cpuSeconds(), time.Now()
	_, err = cc.Put(ctx, "bomb/ns", "k", value, clientlib.PublishOptions{})
	fmt.Printf("A %d-byte value (the most the budget runs): %v in %s, %.3f CPU-s\n\n", len(value), orOK(err), time.Since(t0).Round(time.Millisecond), d.cpuSeconds()-cpu0)

	victim := func(d time.Duration) []float64 {
		var lat []float64
		for end := time.Now().Add(d); time.Now().Before(end); {
			t := time.Now()
			if _, err := cc.Put(ctx, "tenant/b", "k", fmt.Sprint(t.UnixNano()), clientlib.PublishOptions{}); err != nil {
				fmt.Printf("(the other tenant's put failed: %v)\n", err)
			}
			lat = append(lat, float64(time.Since(t))/float64(time.Millisecond))
		}
		slices.Sort(lat)
		return lat
	}
	idle := victim(*bombPhase)
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	attempts, refused := 0, 0
	cpu0 = d.cpuSeconds()
	for range 4 {
		wg.Go(func() {
			for actx.Err() == nil {
				_, err := cc.Put(actx, "bomb/ns", "k", value, clientlib.PublishOptions{})
				mu.Lock()
				attempts++
				if err != nil && !errors.Is(err, context.Canceled) {
					refused++
				}
				mu.Unlock()
			}
		})
	}
	profiled := make(chan error, 1)
	if *bombProfile != "" {
		go func() { profiled <- cpuProfile(d.httpAddr, *bombPhase, *bombProfile) }()
	} else {
		profiled <- nil
	}
	attacked := victim(*bombPhase)
	if err := <-profiled; err != nil {
		fmt.Printf("(profile: %v)\n", err)
	}
	cancel()
	wg.Wait()
	cpu := d.cpuSeconds() - cpu0
	fmt.Printf("Four attackers, %s: %d puts of the %d-byte value (%d refused), the daemon at %.2f CPU-s per second\n", *bombPhase, attempts, len(value), refused, cpu/bombPhase.Seconds())
	fmt.Printf("%-22s %8s %8s %8s\n", "other tenant's put", "p50 ms", "p99 ms", "puts")
	fmt.Printf("%-22s %8.2f %8.2f %8d\n", "idle", pct(idle, 50), pct(idle, 99), len(idle))
	fmt.Printf("%-22s %8.2f %8.2f %8d\n", "under attack", pct(attacked, 50), pct(attacked, 99), len(attacked))
	fmt.Printf("%-22s %7.2fx %7.2fx\n", "ratio (target <= 2x)", pct(attacked, 50)/pct(idle, 50), pct(attacked, 99)/pct(idle, 99))
	return nil
}

// progSize is the size of a regular expression's compiled RE2 program.
func progSize(expr string) int {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return 1 << 30
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return 1 << 30
	}
	return len(prog.Inst)
}

func orOK(err error) string {
	if err == nil {
		return "accepted"
	}
	return "refused: " + err.Error()
}
