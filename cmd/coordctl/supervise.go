package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

// child runs a command under a lock or leadership, and stops it before
// anyone else can hold what it holds.
//
// Schedule: while the session is healthy its local deadline stays at least
// two thirds of the TTL ahead. If keep-alives stop being answered, the
// deadline comes closer: with less than jeopardy left the command gets
// SIGTERM, with less than kill left SIGKILL — so it is dead before the
// local deadline, which itself falls before the server can expire the
// session. If the hold ends outright (the session was closed), SIGTERM
// at once and SIGKILL after the grace.
type child struct {
	argv     []string
	env      []string
	lost     <-chan struct{}  // closed when the hold ends without us
	yield    <-chan struct{}  // closed when the holder is asked to step down (nil: never)
	deadline func() time.Time // the session's local deadline
	jeopardy time.Duration    // SIGTERM when less than this is left
	kill     time.Duration    // SIGKILL when less than this is left
	grace    time.Duration    // after an outright loss: SIGTERM, then SIGKILL after this
}

// run starts the command and waits for it. It reports the command's exit
// code and whether the hold was lost (the command was stopped for it), or
// else yielded (the command was stopped because the holder was asked to
// step down: SIGTERM at once, SIGKILL after the grace, as on a loss; the
// hold is still this process's to give up).
func (ch *child) run() (code int, lost, yielded bool, err error) {
	cmd := exec.Command(ch.argv[0], ch.argv[1:]...)
	cmd.Env = ch.env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Its own process group, so a shell's children are stopped with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) && errors.Is(ee.Err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return 127, false, false, fmt.Errorf("%s: command not found", ch.argv[0])
		}
		return 126, false, false, fmt.Errorf("cannot run %s: %w", ch.argv[0], err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	signalGroup := func(sig syscall.Signal) { _ = syscall.Kill(-cmd.Process.Pid, sig) }
	// Signals to coordctl go to the command too.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	// The schedule is checked every tick, and each threshold is acted on
	// one tick early, so SIGKILL never goes out after the local deadline.
	const tick = 25 * time.Millisecond
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	var termSent, killSent bool
	var killAt time.Time
	lostCh, yieldCh := ch.lost, ch.yield
	// stop asks the command to end now, and kills it after the grace: on
	// an outright loss, and on a request to step down.
	stop := func() {
		if !termSent {
			signalGroup(syscall.SIGTERM)
			termSent, killAt = true, time.Now().Add(ch.grace)
		}
	}
	for {
		select {
		case err := <-done:
			// Whatever of its process group is left goes with it: nothing
			// may outlive the hold.
			signalGroup(syscall.SIGKILL)
			select {
			case <-ch.lost:
				lost = true // it ended as the hold did: it may have acted without it
			default:
			}
			if time.Now().After(ch.deadline()) {
				lost = true
			}
			return exitStatus(err), lost, yielded && !lost, nil
		case s := <-sigs:
			// Passed on; the command decides. (coordctl's own context is
			// not used to stop it: an interrupt is forwarded, not enforced.)
			signalGroup(s.(syscall.Signal))
		case <-yieldCh:
			yieldCh, yielded = nil, true
			stop()
		case <-lostCh:
			lostCh, lost = nil, true
			stop()
		case <-ticker.C:
		}
		left := time.Until(ch.deadline())
		switch {
		case !killSent && (left < ch.kill+tick || termSent && !killAt.IsZero() && time.Now().After(killAt.Add(-tick))):
			signalGroup(syscall.SIGKILL)
			killSent, lost = true, lost || left < ch.kill+tick
		case !termSent && left < ch.jeopardy+tick:
			signalGroup(syscall.SIGTERM)
			termSent, lost = true, true
			killAt = time.Now().Add(left - ch.kill)
		}
	}
}

// exitStatus is a finished command's exit code: its own, or 128+N if it
// died of signal N.
func exitStatus(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return 1
}
