package daemon_test

// The Go SDK's config-center tests are in tests/sdk; these names serve this
// package's own config tests.

import (
	"testing"

	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/testkit/daemontest"
)

// configTestConfig is testConfig with quick bookmarks.
func configTestConfig(t *testing.T) daemon.Config { return daemontest.ConfigTestConfig(t) }

// fast are subscription options with a short stall timeout and backoff.
var fast = daemontest.FastSubscribe
