package daemon

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"github.com/hashicorp/go-multierror"

	"github.com/coordd/coordd/internal/auth"
	"github.com/coordd/coordd/internal/server/api"
	"github.com/coordd/coordd/internal/server/rotate"
	"github.com/coordd/coordd/internal/shared/keyring"
)

// loadAuth reads the TLS files, token file and policy at start: any error
// stops the start.
func (d *Daemon) loadAuth() error {
	cfg := d.cfg
	d.authn = &api.Authenticator{IdentityFrom: cfg.IdentityFrom}
	d.authz = auth.NewAuthorizer(nil)
	switch cfg.AuditLog {
	case "":
	case "-":
		d.audit = auth.NewAudit(os.Stderr)
	default:
		f, err := rotate.Open(cfg.AuditLog, int64(cfg.AuditMaxMB)<<20, cfg.AuditKeep)
		if err != nil {
			return fmt.Errorf("--audit-log: %w", err)
		}
		d.audit = auth.NewAudit(f)
		// Written line by line: nothing is lost, whatever Close says.
		d.stops.onStop("the audit log", done(func() { _ = f.Close() }))
	}
	if cfg.TokenFile != "" {
		t, err := readTokens(cfg.TokenFile)
		if err != nil {
			return err
		}
		d.authn.SetTokens(t)
	}
	if cfg.PolicyFile != "" {
		data, err := os.ReadFile(cfg.PolicyFile)
		if err != nil {
			return fmt.Errorf("--policy-file: %w", err)
		}
		if err := d.authz.Load(data); err != nil {
			return fmt.Errorf("--policy-file %s: %w", cfg.PolicyFile, err)
		}
	} else {
		d.lg.Warn("no --policy-file: coordd runs open; anyone who reaches its ports may do anything (close any session, release any lock, save a snapshot)")
	}
	return nil
}

// seesAllSessions says whether the caller may read every session, not
// only those it created (api.SessionOptions.SeesAll): cluster.read or
// cluster.admin.
func (d *Daemon) seesAllSessions(ctx context.Context) bool {
	p := api.PrincipalFrom(ctx)
	read, _ := d.authz.Allows(p, auth.ClusterRead, auth.Resource{})
	admin, _ := d.authz.Allows(p, auth.ClusterAdmin, auth.Resource{})
	return read || admin
}

// lockTokensVisible says whether the caller may see the fencing tokens of
// lock name, in DescribeLock and the grant history
// (api.LockOptions.TokensVisible): whether it may release the lock.
func (d *Daemon) lockTokensVisible(ctx context.Context, name string) bool {
	ok, _ := d.authz.Allows(api.PrincipalFrom(ctx), auth.LockRelease, auth.Resource{Kind: auth.Lock, Name: name})
	return ok
}

// mayReadSecrets says whether the caller may read config namespace ns's
// secrets (api.ConfigOptions.MayReadSecrets).
func (d *Daemon) mayReadSecrets(ctx context.Context, ns string) bool {
	ok, _ := d.authz.Allows(api.PrincipalFrom(ctx), auth.ConfigReadSecret, auth.Resource{Kind: auth.Namespace, Name: ns})
	return d.authz.Open() || ok
}

// mayReadConfig says whether the caller may read config namespace ns
// (api.ConfigOptions.MayRead).
func (d *Daemon) mayReadConfig(ctx context.Context, ns string) bool {
	ok, _ := d.authz.Allows(api.PrincipalFrom(ctx), auth.ConfigRead, auth.Resource{Kind: auth.Namespace, Name: ns})
	return d.authz.Open() || ok
}

func readTokens(file string) (*auth.Tokens, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--token-file: %w", err)
	}
	t, err := auth.ParseTokens(data)
	if err != nil {
		return nil, fmt.Errorf("--token-file %s: %w", file, err)
	}
	return t, nil
}

// Reload reads the TLS certificate files, the token file and the policy
// again. Each that fails to read or validate is refused (what was in force
// stays) and named in the error; the others take effect. Calls and
// streams in progress are not interrupted; each new call is checked
// against what is in force when it arrives (a stream, message by message).
func (d *Daemon) Reload() error {
	var errs *multierror.Error
	if d.cfg.TLSFiles != nil {
		if err := d.cfg.TLSFiles.Reload(); err != nil {
			errs = multierror.Append(errs, err)
		}
	}
	if d.cfg.TokenFile != "" {
		if t, err := readTokens(d.cfg.TokenFile); err != nil {
			errs = multierror.Append(errs, err)
		} else {
			d.authn.SetTokens(t)
		}
	}
	if d.cfg.PolicyFile != "" {
		data, err := os.ReadFile(d.cfg.PolicyFile)
		if err == nil {
			err = d.authz.Load(data)
		}
		if err != nil {
			errs = multierror.Append(errs, fmt.Errorf("--policy-file %s: %w", d.cfg.PolicyFile, err))
		}
	}
	if d.cfg.SecretKeyFile != "" && d.configStore != nil {
		if ring, err := keyring.Load(d.cfg.SecretKeyFile); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("--secret-key-file: %w", err))
		} else {
			d.configStore.SetKeys(ring)
		}
	}
	return errs.ErrorOrNil()
}

// guardHTTP lets only principals allowed cluster.read see /metrics,
// /openapi.json and the profiles once a policy is in force (unless
// PublicMetrics).
func (d *Daemon) guardHTTP(r *http.Request) error {
	if d.cfg.PublicMetrics || d.authz.Open() {
		return nil
	}
	p, err := d.authn.HTTPPrincipal(r)
	if err != nil {
		return err
	}
	if ok, why := d.authz.Allows(p, auth.ClusterRead, auth.Resource{}); !ok {
		if p.IsAnonymous() {
			return errUnauthenticated(why)
		}
		return errDenied(why + " (" + r.URL.Path + " needs cluster.read; --public-metrics opens it)")
	}
	return nil
}

// authNote is what /readyz adds when ready.
func (d *Daemon) authNote() string {
	if d.authz.Open() {
		return "auth: open (no --policy-file): anyone who reaches coordd may do anything"
	}
	return ""
}

func errUnauthenticated(why string) error { return api.Unauthenticated("auth: " + why) }
func errDenied(why string) error          { return api.PermissionDenied("auth: " + why) }
