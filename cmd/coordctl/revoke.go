package main

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
)

// revokeFlags are the flags of a release, resignation or session close:
// from outside (the default), the holder is asked first and the call
// waits for it or the bound.
type revokeFlags struct {
	holder string
	force  bool
	within time.Duration
}

func (f *revokeFlags) add(cmd *cobra.Command, holderHelp string) {
	cmd.Flags().StringVar(&f.holder, "session", "", holderHelp)
	cmd.Flags().BoolVar(&f.force, "force", false, "end it at once without asking the holder (a hung process): it may still act, only fencing protects")
	cmd.Flags().DurationVar(&f.within, "within", 0, "how long the holder may take to let go (default and at most: its session's TTL)")
}

func (f *revokeFlags) options() []clientlib.RevokeOption {
	var opts []clientlib.RevokeOption
	if f.holder != "" {
		opts = append(opts, clientlib.AsHolder(f.holder))
	}
	if f.force {
		opts = append(opts, clientlib.Force())
	}
	if f.within > 0 {
		opts = append(opts, clientlib.RevokeWithin(f.within))
	}
	return opts
}

// call runs fn under --timeout plus the revocation's own wait, which the
// server bounds by the holder's session TTL.
func (f *revokeFlags) call(a *app, cmd *cobra.Command, fn func(ctx context.Context, c *clientlib.Client) error) error {
	c, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	wait := f.within
	if wait <= 0 {
		wait = time.Hour // the holder's TTL bounds it
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), a.timeout+wait)
	defer cancel()
	return fn(ctx, c)
}

// revocationJSON is how a revocation ended, for -o json.
type revocationJSON struct {
	Name    string `json:"name"`
	Token   string `json:"token"`
	Outcome string `json:"outcome,omitempty"`
	Waited  string `json:"waited,omitempty"`
}

// printRevocation says how a release or resignation ended, in words.
func printRevocation(a *app, what, name string, token fmt.Stringer, r clientlib.Revocation) error {
	out := revocationJSON{Name: name, Token: token.String(), Outcome: r.Outcome}
	if r.Outcome != "" {
		out.Waited = r.Waited.String()
	}
	return a.print(out, func(w *bytes.Buffer) {
		switch r.Outcome {
		case clientlib.RevokeAcknowledged:
			fmt.Fprintf(w, "%s %s (%s): its holder let go when asked, after %s\n", what, name, token, r.Waited.Round(time.Microsecond))
		case clientlib.RevokeBound:
			fmt.Fprintf(w, "%s %s (%s): its holder did not answer within %s; ended anyway (fencing protects from here on)\n", what, name, token, r.Waited.Round(time.Millisecond))
		case clientlib.RevokeForced:
			fmt.Fprintf(w, "%s %s (%s) at once, without asking its holder (forced)\n", what, name, token)
		default:
			fmt.Fprintf(w, "%s %s (%s)\n", what, name, token)
		}
	})
}
