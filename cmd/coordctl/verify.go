package main

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/internal/verify"
)

// kindJSON is one kind's figures under -o json.
type kindJSON struct {
	Grants      int            `json:"grants"`
	GrantP50    string         `json:"grantP50"`
	GrantP99    string         `json:"grantP99"`
	Writes      int            `json:"writes"`
	Refused     int            `json:"refused"`
	Unknown     int            `json:"unknown"`
	LateWrites  int            `json:"lateWrites"`
	LateRefused int            `json:"lateRefused"`
	Applied     int            `json:"applied"`
	LongestGap  string         `json:"longestGap"`
	Sessions    int            `json:"sessions"`
	Errors      map[string]int `json:"errors"`
}

type verifyJSON struct {
	Passed     bool     `json:"passed"`
	Names      string   `json:"names"`
	Duration   string   `json:"duration"`
	Lock       kindJSON `json:"lock"`
	Election   kindJSON `json:"election"`
	Violations []string `json:"violations"`
	Sabotage   string   `json:"sabotage,omitempty"`
	Leftovers  string   `json:"leftovers,omitempty"`
}

func kindOut(k verify.KindReport) kindJSON {
	return kindJSON{Grants: k.Grants, GrantP50: k.GrantP50.String(), GrantP99: k.GrantP99.String(), Writes: k.Writes, Refused: k.Refused, Unknown: k.Unknown,
		LateWrites: k.LateWrites, LateRefused: k.LateRefused, Applied: k.Applied, LongestGap: k.LongestGap.String(), Sessions: k.SessionsStarted, Errors: cmpOr(k.Errors)}
}

func cmpOr(m map[string]int) map[string]int {
	if m == nil {
		return map[string]int{}
	}
	return m
}

func (a *app) verifyCommand() *cobra.Command {
	var o verify.Options
	cmd := &cobra.Command{
		Use:   "verify [--duration 30s]",
		Short: "Check a running cluster's mutual exclusion live: concurrent lock holders and leaders, fenced writes, a linearizability check (exit 7 on a violation)",
		Long: `Run a bounded live check against the cluster: for --duration, --lockers
clients take a lock and --candidates lead an election over and over, each
with its own session, writing their token to a fenced key while they hold
it and once more after they let go (as a paused holder would: the fence
must refuse it). Then the history is checked: linearizability of the
grants and fenced writes (porcupine), the order of the applied writes'
tokens, and no two holders (or leaders) at once in their own view.

It uses names of its own under coordd-verify/<run id>/ (a policy must let
the caller use them), and cleans up after itself. Its load is bounded:
at most --rate grants per second per kind, three fenced writes each, from
lockers + candidates sessions: safe to run in production. A fault during
the run (a member killed, a partition) is part of the test: the longest
gap between grants is its fail-over.

Exit code: 0 passed, 7 a violation was found, 1 it could not run.
--sabotage unfenced writes to an unfenced store instead: the check must
then fail (it shows verify catches a broken fence).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Duration <= 0 || o.Duration > time.Hour {
				return usagef("--duration must be between 0 and 1h")
			}
			if o.Lockers < 0 || o.Candidates < 0 || o.Lockers+o.Candidates == 0 {
				return usagef("--lockers and --candidates: at least one client")
			}
			if o.Sabotage != "" && o.Sabotage != verify.SabotageUnfenced {
				return usagef("--sabotage %q: the only mode is %q", o.Sabotage, verify.SabotageUnfenced)
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			_, _ = fmt.Fprintf(a.stderr, "verifying for %s: %d lock holders and %d election candidates, at most %g grants/s each...\n", o.Duration, o.Lockers, o.Candidates, o.Rate)
			rep, err := verify.Run(cmd.Context(), c, o)
			if err != nil {
				return err
			}
			var vs []string
			for _, v := range rep.Violations {
				vs = append(vs, v.String())
			}
			out := verifyJSON{Passed: rep.Passed, Names: rep.Name, Duration: rep.Duration.Round(time.Millisecond).String(), Lock: kindOut(rep.Lock), Election: kindOut(rep.Election),
				Violations: append([]string{}, vs...), Sabotage: rep.Sabotage, Leftovers: rep.Leftovers}
			if err := a.print(out, func(w *bytes.Buffer) { verifyText(w, rep, o) }); err != nil {
				return err
			}
			if !rep.Passed {
				return withCode(exitViolation, fmt.Errorf("verify found %d violations", len(rep.Violations)))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.Duration, "duration", 30*time.Second, "how long the clients run")
	f.IntVar(&o.Lockers, "lockers", 3, "lock clients")
	f.IntVar(&o.Candidates, "candidates", 2, "election candidates")
	f.Float64Var(&o.Rate, "rate", 20, "at most this many grants per second per kind")
	f.DurationVar(&o.TTL, "ttl", 5*time.Second, "the clients' session TTL")
	f.StringVar(&o.Sabotage, "sabotage", "", `"unfenced": write to an unfenced store, to see the check fail`)
	return cmd
}

func verifyText(w *bytes.Buffer, rep verify.Report, o verify.Options) {
	verdict := "PASSED"
	if !rep.Passed {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "verify %s in %s (names under %s)\n", verdict, rep.Duration.Round(time.Millisecond), rep.Name)
	for _, k := range []struct {
		name string
		r    verify.KindReport
		n    int
	}{{"lock", rep.Lock, o.Lockers}, {"election", rep.Election, o.Candidates}} {
		if k.n == 0 {
			continue
		}
		fmt.Fprintf(w, "%s:\t%d grants (wait p50 %s, p99 %s), longest gap between grants %s, %d sessions\n", k.name, k.r.Grants,
			k.r.GrantP50.Round(10*time.Microsecond), k.r.GrantP99.Round(10*time.Microsecond), k.r.LongestGap.Round(time.Millisecond), k.r.SessionsStarted)
		fmt.Fprintf(w, "\t%d fenced writes while holding (%d refused as stale, %d unanswered), %d applied\n", k.r.Writes, k.r.Refused, k.r.Unknown, k.r.Applied)
		fmt.Fprintf(w, "\t%d late writes with an old token, %d refused by the fence\n", k.r.LateWrites, k.r.LateRefused)
		if len(k.r.Errors) > 0 {
			var es []string
			for _, msg := range slices.Sorted(maps.Keys(k.r.Errors)) {
				es = append(es, fmt.Sprintf("%d× %s", k.r.Errors[msg], msg))
			}
			fmt.Fprintf(w, "\terrors (retried): %s\n", strings.Join(es, "; "))
		}
	}
	if rep.Passed {
		fmt.Fprintln(w, "checks:\tlinearizable grants and fenced writes (porcupine), applied writes in token order, never two holders at once: no violation")
	}
	for _, v := range rep.Violations {
		fmt.Fprintf(w, "violation:\t%s\n", v)
	}
	if rep.Sabotage != "" {
		fmt.Fprintf(w, "sabotage:\t%s (the fence was switched off on purpose)\n", rep.Sabotage)
	}
	if rep.Leftovers != "" {
		fmt.Fprintf(w, "left behind:\t%s\n", rep.Leftovers)
	}
}
