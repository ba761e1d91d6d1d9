package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/fencing"
)

// role names a lock entry's role for lock status: "holder" or "waiter",
// with "(read)" for a read grant or wait.
func role(r string, e clientlib.LockEntry) string {
	if e.Read {
		return r + " (read)"
	}
	return r
}

func parseToken(s string) (fencing.Token, error) {
	t, err := fencing.Parse(s)
	if err != nil {
		return 0, usagef("token %q: %v", s, err)
	}
	return t, nil
}

// waitCtx bounds a wait by --wait (0: wait as long as it takes).
func waitCtx(ctx context.Context, wait time.Duration) (context.Context, context.CancelFunc) {
	if wait > 0 {
		return context.WithTimeout(ctx, wait)
	}
	return context.WithCancel(ctx)
}

func (a *app) lockCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "lock", Short: "Acquire, release, inspect and validate locks; run a command under one"}
	acquire, acquireAll, release := a.lockAcquireCommand(), a.lockAcquireAllCommand(), a.lockReleaseCommand()
	status, validate := a.lockStatusCommand(), a.lockValidateCommand()
	list := a.listCommand("list [PREFIX]", "List locks that have holders or waiters", "lock is held or waited for", lockNames)

	for _, c := range []*cobra.Command{acquire, release, status, list, validate} {
		c.ValidArgsFunction = a.completeFirst(lockNames, cobra.ShellCompDirectiveNoFileComp)
	}
	acquireAll.ValidArgsFunction = a.completeEach(lockNames)
	history := a.historyCommand("lock", (*clientlib.Admin).LockHistory)
	history.ValidArgsFunction = a.completeFirst(lockNames, cobra.ShellCompDirectiveNoFileComp)
	cmd.AddCommand(acquire, acquireAll, release, status, list, validate, history, a.lockRunCommand())
	return cmd
}

// lockAcquireOptions are the flags of lock acquire.
type lockAcquireOptions struct {
	sessionID, metadata string
	requestID           string
	wait, lockDelay     time.Duration
	limit               int
	try, read           bool
}

func (a *app) lockAcquireCommand() *cobra.Command {
	var o lockAcquireOptions
	cmd := &cobra.Command{
		Use:   "acquire NAME --session ID",
		Short: "Take a lock for a session you keep alive; prints the fencing token",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.lockAcquire(cmd, args[0], o)
		},
	}
	cmd.Flags().StringVar(&o.sessionID, "session", "", "the holding session (required)")
	cmd.Flags().DurationVar(&o.wait, "wait", 0, "give up after this long (exit 124); 0 waits as long as it takes")
	cmd.Flags().BoolVar(&o.try, "try", false, "do not wait: fail at once (exit 4) if the lock is held")
	cmd.Flags().IntVarP(&o.limit, "limit", "n", 1, "holders allowed at once (a semaphore when > 1)")
	cmd.Flags().StringVar(&o.metadata, "metadata", "", "note shown by lock status")
	cmd.Flags().DurationVar(&o.lockDelay, "lock-delay", 0, "keep the lock from others this long after the session expires")
	cmd.Flags().StringVar(&o.requestID, "request-id", "", "the acquisition's idempotency key: run again with the same session and id after a --wait ran out or an answer was lost, and it resumes that wait (or prints the grant it already has) instead of queueing again")
	cmd.Flags().BoolVar(&o.read, "read", false, "take a read grant of a read/write lock: shared with other readers, never with a writer")
	return cmd
}

// lockAcquire takes lock name for the session and prints the grant.
func (a *app) lockAcquire(cmd *cobra.Command, name string, o lockAcquireOptions) error {
	if o.sessionID == "" {
		return usagef("--session is required (see coordctl session create)")
	}
	c, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	ctx, cancel := waitCtx(cmd.Context(), o.wait)
	defer cancel()
	acquire := c.Admin().Acquire
	if o.try {
		acquire = c.Admin().TryAcquire
	}
	opts := []clientlib.LockOption{clientlib.WithLimit(o.limit), clientlib.WithMetadata(o.metadata), clientlib.WithLockDelay(o.lockDelay)}
	if o.read {
		opts = append(opts, clientlib.Shared())
	}
	if o.requestID != "" {
		opts = append(opts, clientlib.WithRequestID(o.requestID))
	}
	g, err := acquire(ctx, o.sessionID, name, opts...)
	if err != nil {
		return err
	}
	return a.print(grantOut(g), func(w *bytes.Buffer) {
		fmt.Fprintf(w, "NAME\tTOKEN\tSESSION\n%s\t%s\t%s\n", g.Name, g.Token, g.SessionID)
	})
}

// lockAcquireAllOptions are the flags of lock acquire-all.
type lockAcquireAllOptions struct {
	sessionID, requestID, metadata string
	wait                           time.Duration
}

func (a *app) lockAcquireAllCommand() *cobra.Command {
	var o lockAcquireAllOptions
	cmd := &cobra.Command{
		Use:   "acquire-all NAME... --session ID",
		Short: "Take several locks for a session, all or none, without deadlock; prints a token per lock",
		Long: `Take every named lock for the session, all or none, in one request: the
server queues for them in the order of their names, so acquire-all calls
for overlapping sets never deadlock each other, and each lock's queue
stays first come, first served. It prints one grant (one fencing token)
per lock, sorted by name. If --wait runs out (exit 124) or a lock cannot
be had, none of them stays held or queued. Release each with lock release,
or all with the session (session close).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.lockAcquireAll(cmd, args, o)
		},
	}
	cmd.Flags().StringVar(&o.sessionID, "session", "", "the holding session (required)")
	cmd.Flags().DurationVar(&o.wait, "wait", 0, "give up after this long (exit 124), leaving none held; 0 waits as long as it takes")
	cmd.Flags().StringVar(&o.metadata, "metadata", "", "note shown by lock status on each lock")
	cmd.Flags().StringVar(&o.requestID, "request-id", "", "the set's idempotency key: run again with the same session and id and it resumes the same grants")
	return cmd
}

// lockAcquireAll takes every lock of names for the session, all or none,
// and prints the grants.
func (a *app) lockAcquireAll(cmd *cobra.Command, names []string, o lockAcquireAllOptions) error {
	if o.sessionID == "" {
		return usagef("--session is required (see coordctl session create)")
	}
	c, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	ctx, cancel := waitCtx(cmd.Context(), o.wait)
	defer cancel()
	opts := []clientlib.LockOption{clientlib.WithMetadata(o.metadata)}
	if o.requestID != "" {
		opts = append(opts, clientlib.WithRequestID(o.requestID))
	}
	gs, err := c.Admin().AcquireAll(ctx, o.sessionID, names, opts...)
	if err != nil {
		return err
	}
	out := make([]grantJSON, 0, len(gs))
	for _, g := range gs {
		out = append(out, grantOut(g))
	}
	return a.print(out, func(w *bytes.Buffer) {
		fmt.Fprintln(w, "NAME\tTOKEN\tSESSION")
		for _, g := range gs {
			fmt.Fprintf(w, "%s\t%s\t%s\n", g.Name, g.Token, g.SessionID)
		}
	})
}

func (a *app) lockReleaseCommand() *cobra.Command {
	var rf revokeFlags
	cmd := &cobra.Command{
		Use:   "release NAME TOKEN",
		Short: "End the grant a token names; from outside, its holder is asked to let go first",
		Long: `End the grant a token names. Unless --session names the holder's own
session (a script releasing what it acquired), the release is from
outside: the server asks the holder to let go and grants the next waiter
once it does (the Go, Python and TypeScript clients let go at once), or
once the bound passes (--within, at most and by default the holder's
session TTL: a holder without a stream, such as a REST client, cannot
answer). --force ends it at once.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.lockRelease(cmd, args[0], args[1], rf)
		},
	}
	rf.add(cmd, "the holder's own session: the holder releases, at once")
	return cmd
}

// lockRelease ends the grant of lock name that tokenArg names.
func (a *app) lockRelease(cmd *cobra.Command, name, tokenArg string, rf revokeFlags) error {
	token, err := parseToken(tokenArg)
	if err != nil {
		return err
	}
	return rf.call(a, cmd, func(ctx context.Context, c *clientlib.Client) error {
		r, err := c.Admin().Revoke(ctx, name, token, rf.options()...)
		if err != nil {
			return err
		}
		return printRevocation(a, "released", name, token, r)
	})
}

// lockStatusOptions are the flags of lock status.
type lockStatusOptions struct {
	follow bool
	count  int
	page   clientlib.LockPage
}

func (a *app) lockStatusCommand() *cobra.Command {
	var o lockStatusOptions
	cmd := &cobra.Command{
		Use:   "status NAME",
		Short: "Show a lock's holders and waiters (with --watch, again after every change)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.lockStatus(cmd, args[0], o)
		},
	}
	cmd.Flags().BoolVarP(&o.follow, "watch", "w", false, "print the lock again after every change, until interrupted (or --count)")
	cmd.Flags().IntVar(&o.count, "count", 0, "with --watch, stop after this many")
	cmd.Flags().IntVar(&o.page.Size, "page-size", 1000, "list at most this many holders and waiters (1-1000); the counts count all")
	cmd.Flags().StringVar(&o.page.Token, "page-token", "", "list the page after the one that printed this token")
	return cmd
}

// lockStatus prints lock name's holders and waiters; with --watch, again
// after every change until interrupted or --count.
func (a *app) lockStatus(cmd *cobra.Command, name string, o lockStatusOptions) error {
	if !o.follow {
		return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
			st, err := c.Admin().DescribeLockPage(ctx, name, o.page)
			if err != nil {
				return err
			}
			return a.print(lockStateOut(st), lockTable(st, false))
		})
	}
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	c, err := a.connect(ctx)
	if err != nil {
		return err
	}
	n := 0
	stop := errors.New("enough")
	err = c.Admin().WatchLock(ctx, name, func(st clientlib.LockState) error {
		if a.output == "json" {
			err = a.printLine(lockStateOut(st), "")
		} else {
			err = a.print(nil, lockTable(st, true))
		}
		if err != nil {
			return err
		}
		if n++; o.count > 0 && n >= o.count {
			return stop
		}
		return nil
	})
	if errors.Is(err, stop) || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (a *app) lockValidateCommand() *cobra.Command {
	var election bool
	cmd := &cobra.Command{
		Use:   "validate NAME TOKEN",
		Short: "Exit 0 if the token holds the lock now (or, with --election, leads the election), 4 if not",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.lockValidate(cmd, args[0], args[1], election)
		},
	}
	cmd.Flags().BoolVar(&election, "election", false, "NAME is an election and TOKEN a leadership term")
	return cmd
}

// lockValidate checks that tokenArg holds lock name now (with election,
// leads election name).
func (a *app) lockValidate(cmd *cobra.Command, name, tokenArg string, election bool) error {
	token, err := parseToken(tokenArg)
	if err != nil {
		return err
	}
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		if election {
			err = c.Admin().ValidateFence(ctx, clientlib.Fence{Election: name, Token: token})
		} else {
			err = c.Admin().ValidateFence(ctx, clientlib.Fence{Lock: name, Token: token})
		}
		if err != nil {
			return err
		}
		return a.printLine(validJSON{Name: name, Token: token.String(), Valid: true}, "valid")
	})
}

// lockTable prints a lock's holders and waiters; with header, a line
// first naming the revision (for --watch, which prints one per change).
func lockTable(st clientlib.LockState, header bool) func(w *bytes.Buffer) {
	return func(w *bytes.Buffer) {
		if header {
			fmt.Fprintf(w, "# %s at revision %d\n", st.Name, st.Revision)
		}
		if !st.DelayedUntil.IsZero() {
			fmt.Fprintf(w, "lock-delay until %s\n", ts(st.DelayedUntil))
		}
		if len(st.Holders)+len(st.Waiters) == 0 {
			fmt.Fprintln(w, "nobody holds or waits")
			return
		}
		fmt.Fprintln(w, "ROLE\tTOKEN\tSESSION\tOWNER\tHOST\tSINCE\tMETADATA")
		for _, e := range st.Holders {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", role("holder", e), e.Token, e.SessionID, e.Owner, e.Hostname, ts(e.Granted), e.Metadata)
		}
		for _, e := range st.Waiters {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", role("waiter", e), e.Token, e.SessionID, e.Owner, e.Hostname, ts(e.Enqueued), e.Metadata)
		}
		if st.NextPageToken != "" {
			fmt.Fprintf(w, "# %d holding, %d waiting in all; the next page: --page-token %s\n", st.HolderCount, st.WaiterCount, st.NextPageToken)
		}
	}
}

// runFlags are the flags lock run and elect run share.
type runFlags struct {
	ttl, wait, grace time.Duration
}

func (f *runFlags) add(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&f.ttl, "ttl", 10*time.Second, "session TTL: how long a crashed coordctl blocks others")
	cmd.Flags().DurationVar(&f.wait, "wait", 0, "give up waiting after this long (exit 124); 0 waits as long as it takes")
	cmd.Flags().DurationVar(&f.grace, "kill-grace", 0, "after SIGTERM, SIGKILL follows within this (default TTL/6, and always before the session's local deadline)")
}

// childFor builds the supervised command for a hold on sess.
func (f *runFlags) childFor(argv, env []string, sess *clientlib.Session, lost <-chan struct{}) *child {
	grace := f.grace
	if grace <= 0 {
		grace = max(f.ttl/6, 500*time.Millisecond)
	}
	return &child{
		argv: argv, env: env, lost: lost, deadline: sess.Deadline,
		// SIGKILL at least 200ms before the deadline: time for the process
		// to die.
		jeopardy: f.ttl / 3, kill: max(min(grace, f.ttl/6), 200*time.Millisecond), grace: grace,
	}
}

func (a *app) lockRunCommand() *cobra.Command {
	var (
		rf        runFlags
		limit     int
		lockDelay time.Duration
		read      bool
	)
	cmd := &cobra.Command{
		Use:   "run NAME -- COMMAND [ARGS...]",
		Short: "Run a command while holding a lock; stop it if the lock is lost",
		Long: `Run a command while holding a lock, and stop it if the lock is lost.

The command runs without a shell, in its own process group, with
COORDD_LOCK_NAME, COORDD_LOCK_TOKEN (also COORDD_FENCE_TOKEN), COORDD_SESSION
and COORDD_DEADLINE (the session's local deadline at the grant, RFC 3339; it
moves forward with every keep-alive) in its environment: pass the token to
whatever the lock protects.

If keep-alives stop being answered, the command gets SIGTERM once less than
a third of the TTL is left before the session's local deadline, and SIGKILL
before that deadline (--kill-grace), which falls before the server can
grant the lock to anyone else. coordctl then exits 125. Otherwise it exits
with the command's code, having released the lock. Signals to coordctl are
passed to the command.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return usagef("usage: coordctl lock run NAME -- COMMAND [ARGS...]")
			}
			name, argv := args[0], args[1:]
			return a.runHeld(cmd.Context(), rf, argv, "lock run "+name, func(ctx context.Context, sess *clientlib.Session) (*held, error) {
				opts := []clientlib.LockOption{clientlib.WithLimit(limit), clientlib.WithLockDelay(lockDelay), clientlib.WithMetadata(fmt.Sprintf("pid %d: %v", os.Getpid(), argv))}
				if read {
					opts = append(opts, clientlib.Shared())
				}
				l, err := sess.Lock(ctx, name, opts...)
				if err != nil {
					return nil, err
				}
				return &held{
					what: fmt.Sprintf("lock %q (token %s)", name, l.Token()), lost: l.Lost(), release: l.Release,
					env: []string{"COORDD_LOCK_NAME=" + name, "COORDD_LOCK_TOKEN=" + l.Token().String(), "COORDD_FENCE_TOKEN=" + l.Token().String()},
				}, nil
			})
		},
	}
	cmd.ValidArgsFunction = a.completeFirst(lockNames, cobra.ShellCompDirectiveDefault)
	rf.add(cmd)
	cmd.Flags().IntVarP(&limit, "limit", "n", 1, "holders allowed at once (a semaphore when > 1)")
	cmd.Flags().DurationVar(&lockDelay, "lock-delay", 0, "keep the lock from others this long after the session expires")
	cmd.Flags().BoolVar(&read, "read", false, "hold a read grant of a read/write lock: shared with other readers, never with a writer")
	return cmd
}

// held is what lock run or elect run holds while its command runs.
type held struct {
	what    string          // for messages: `lock "x" (token 7)`
	lost    <-chan struct{} // closed when the hold is lost
	yield   <-chan struct{} // closed when the holder is asked to give the hold up (nil: never)
	yieldTo func() string   // for messages: who asked
	release func(context.Context) error
	env     []string // the hold's variables for the command
}

// runHeld runs argv under a hold that take acquires (waiting at most
// --wait) on a fresh session, stops it on loss (exit 125), and otherwise
// gives the hold up and exits with the command's code.
func (a *app) runHeld(ctx context.Context, rf runFlags, argv []string, owner string, take func(context.Context, *clientlib.Session) (*held, error)) error {
	c, err := a.connect(ctx)
	if err != nil {
		return err
	}
	sess, err := c.NewSession(ctx, clientlib.WithTTL(rf.ttl), clientlib.WithOwner("coordctl "+owner))
	if err != nil {
		return err
	}
	defer func() {
		// Bounded: after a loss coordd may be unreachable. A session that
		// does not close expires after its TTL, so a failure is not reported.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = sess.Close(cctx)
		cancel()
	}()
	wctx, cancel := waitCtx(ctx, rf.wait)
	h, err := take(wctx, sess)
	cancel()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return withCode(exitTimeout, fmt.Errorf("%s: not granted within %s", owner, rf.wait))
		}
		return err
	}
	env := append(append(os.Environ(), h.env...),
		"COORDD_SESSION="+sess.ID(), "COORDD_DEADLINE="+sess.Deadline().UTC().Format(time.RFC3339Nano))
	ch := rf.childFor(argv, env, sess, h.lost)
	ch.yield = h.yield
	code, lost, yielded, err := ch.run()
	if lost {
		return withCode(exitLost, fmt.Errorf("%s was lost; the command was stopped", h.what))
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	rerr := h.release(rctx)
	rcancel()
	if err != nil {
		return withCode(code, err)
	}
	if yielded {
		if rerr != nil {
			return withCode(exitLost, fmt.Errorf("%s: %s asked it to step down; the command was stopped, but giving it up failed: %w", h.what, h.yieldTo(), rerr))
		}
		return withCode(exitLost, fmt.Errorf("%s was given up: %s asked it to step down; the command was stopped", h.what, h.yieldTo()))
	}
	if rerr != nil {
		// A warning only: the exit code stays the command's. Should stderr
		// fail as well, there is nowhere left to say so.
		_, _ = fmt.Fprintf(a.stderr, "coordctl: give up %s: %v\n", h.what, rerr)
	}
	return exitWith(code)
}

// exitWith ends the command with a child's exit code, printing nothing.
func exitWith(code int) error {
	if code == 0 {
		return nil
	}
	return &codeError{code: code}
}
