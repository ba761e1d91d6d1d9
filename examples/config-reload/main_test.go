package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/coorddtest"
	"github.com/coordd/coordd/internal/testkit/syncbuf"
)

// The example starts with the defaults, prints each accepted change, and
// rejects (and reports) an invalid release, keeping the last good value.
func TestConfigReload(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	ctx, cancel := context.WithCancel(t.Context())
	var out syncbuf.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, &out, []string{d.GRPCAddr}, "demo/app", "") }()
	wait.For(t, "the start line", func() bool { return strings.Contains(out.String(), "started (live, release 0)") })
	if want := fmt.Sprintf("config-reload: pid %d\n", os.Getpid()); !strings.HasPrefix(out.String(), want) {
		t.Fatalf("output does not start with %q:\n%s", want, out.String())
	}

	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.GRPCAddr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.ConfigCenter().Publish(ctx, "demo/app", []clientlib.ConfigMutation{{Key: "greeting", Value: `"hi"`}, {Key: "workers", Value: "8"}}, clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the change", func() bool { return strings.Contains(out.String(), `changed: greeting="hi" workers=8`) })
	if _, err := c.ConfigCenter().Put(ctx, "demo/app", "workers", "0", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the rejection", func() bool { return strings.Contains(out.String(), "rejected:") })
	wait.For(t, "the server to see the rejection", func() bool {
		st, err := c.ConfigCenter().AppliedStatus(ctx, "demo/app")
		return err == nil && st.Rejected[2] == 1 && st.Applied[1] == 1
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("run = %v", err)
	}
}
