package clientlib

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/coordd/coordd/internal/shared/keyring"
)

// ExportFormat names the layout of a ConfigExport; Import refuses others.
const ExportFormat = "coordd-config-export/1"

// ConfigExport is namespaces as of one etcd revision of one cluster: what
// Export writes and Import reads, as JSON.
type ConfigExport struct {
	Format     string              `json:"format"`
	Exported   time.Time           `json:"exported"`
	Revision   int64               `json:"revision"` // every namespace is as of this revision
	Namespaces []ExportedNamespace `json:"namespaces"`
	// SecretsKey is the id of the transfer key that sealed the secrets
	// (empty: none were exported).
	SecretsKey string `json:"secrets_key,omitempty"`
}

// ExportedNamespace is one namespace's content, its release number (in the
// cluster it came from) and its JSON Schema ("" if none).
type ExportedNamespace struct {
	Name    string            `json:"name"`
	Release int64             `json:"release"`
	Values  map[string]string `json:"values"`
	Schema  string            `json:"schema,omitempty"`
	// Secrets are the secret keys' values, each sealed with the transfer
	// key (AES-256-GCM, bound to namespace and key): never in clear.
	Secrets map[string]string `json:"secrets,omitempty"`
	// Hidden are the secret keys not exported: Import leaves them as they
	// are in the target.
	Hidden []string `json:"hidden_secrets,omitempty"`
	// Approval is the namespace's approval policy, if it requires one.
	Approval *ExportedApproval `json:"approval,omitempty"`
	// Inherits is the shared namespace it inherits from; Values then hold
	// only its own keys.
	Inherits string `json:"inherits,omitempty"`
	// History is the namespace's last releases up to Release, oldest
	// first (ExportOptions.History; none by default). Import replays them.
	History []ExportedRelease `json:"history,omitempty"`
}

// ExportedRelease is one release of a namespace's history in an export:
// who made it, when, why, and what it changed. A secret's change says only
// that it changed (Secret, no values), as release history does.
type ExportedRelease struct {
	Number     int64          `json:"number"`
	Author     string         `json:"author,omitempty"`
	Message    string         `json:"message,omitempty"`
	Time       time.Time      `json:"time"`
	RollbackOf int64          `json:"rollback_of,omitempty"`
	Changes    []ExportChange `json:"changes"`
	// InheritedFrom is set on a release that carried a shared namespace's
	// change to this heir: import does not replay it (the heir inherits).
	InheritedFrom string `json:"inherited_from,omitempty"`
}

// ExportChange is one key's change in an ExportedRelease: Old absent, the
// key was added; New absent, it was deleted.
type ExportChange struct {
	Key    string  `json:"key"`
	Old    *string `json:"old,omitempty"`
	New    *string `json:"new,omitempty"`
	Secret bool    `json:"secret,omitempty"`
}

// ExportOptions qualify an Export.
type ExportOptions struct {
	// SecretsKey, when set, exports secrets sealed with it: the calls must
	// reveal secrets (RevealSecrets; the caller needs config.read-secret).
	// Without it secrets are left out (listed in Hidden).
	SecretsKey TransferKey
	// History is how many of each namespace's last releases to export
	// with it (0: none; at most MaxExportHistory), so that an import keeps
	// their authors, messages, times and changes.
	History int
}

// MaxExportHistory bounds ExportOptions.History.
const MaxExportHistory = 1000

// ExportedApproval is an approval policy in an export.
type ExportedApproval struct {
	Required    bool   `json:"required"`
	ProposalTTL string `json:"proposal_ttl,omitempty"` // a Go duration
}

// TransferKey seals secrets in an export and opens them in an import: a
// key file as the daemon's --secret-key-file takes (coordd keygen), whose
// first key seals. The export's secrets are readable by whoever holds it,
// so keep it apart from the export file.
type TransferKey = *keyring.Ring

// ParseTransferKey reads a transfer key file's content.
func ParseTransferKey(data []byte) (TransferKey, error) {
	r, err := keyring.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%w: transfer key: %w", ErrInvalidArgument, err)
	}
	return r, nil
}

func transferAAD(ns, key string) []byte {
	return []byte("coordd config export\x00" + ns + "\x00" + key)
}

// Export reads the named namespaces (nil: every namespace) as of one
// revision: the first read's, which every other read names, so the export
// is one consistent state even while others publish. A schema is read
// as it is now (schemas are not versioned). A namespace with neither a
// release nor a schema is left out.
//
// Secrets are left out (listed in Hidden) unless o.SecretsKey is given:
// then each secret is sealed with it before it is kept in the export.
// With o.History, each namespace's last releases up to the exported one
// come with it (those etcd still keeps: the config center keeps a bounded
// number per namespace).
func (cc *ConfigCenter) Export(ctx context.Context, namespaces []string, o ExportOptions) (ConfigExport, error) {
	if o.History < 0 || o.History > MaxExportHistory {
		return ConfigExport{}, fmt.Errorf("%w: history %d is not between 0 and %d releases", ErrInvalidArgument, o.History, MaxExportHistory)
	}
	var tk []byte
	if o.SecretsKey != nil {
		if !cc.reveal {
			return ConfigExport{}, fmt.Errorf("%w: exporting secrets needs the calls to reveal them (ConfigCenter().RevealSecrets())", ErrInvalidArgument)
		}
		k, err := o.SecretsKey.Key(o.SecretsKey.Primary())
		if err != nil {
			return ConfigExport{}, err
		}
		tk = k
	}
	if namespaces == nil {
		all, err := cc.Namespaces(ctx, "")
		if err != nil {
			return ConfigExport{}, err
		}
		namespaces = all
	}
	out := ConfigExport{Format: ExportFormat, Exported: time.Now().UTC(), Namespaces: []ExportedNamespace{}}
	for _, ns := range slices.Compact(slices.Sorted(slices.Values(namespaces))) {
		snap, err := cc.Snapshot(ctx, ns, out.Revision)
		if err != nil {
			return ConfigExport{}, fmt.Errorf("exporting %s: %w", ns, err)
		}
		if out.Revision == 0 {
			out.Revision = snap.Revision
		}
		schema, err := cc.Schema(ctx, ns)
		if err != nil {
			return ConfigExport{}, fmt.Errorf("exporting the schema of %s: %w", ns, err)
		}
		ap, err := cc.ApprovalPolicy(ctx, ns)
		if err != nil {
			return ConfigExport{}, fmt.Errorf("exporting the approval policy of %s: %w", ns, err)
		}
		if snap.Release == 0 && schema == "" && !ap.Required {
			continue
		}
		e := ExportedNamespace{Name: ns, Release: snap.Release, Values: snap.Values, Schema: schema, Hidden: snap.Hidden}
		if ap.Required {
			e.Approval = &ExportedApproval{Required: true, ProposalTTL: ap.ProposalTTL.String()}
		}
		if snap.Inherits != "" {
			e.Inherits = snap.Inherits
			for _, k := range snap.Inherited {
				delete(e.Values, k)
			}
		}
		if tk == nil { // revealed secrets without a key to seal them: only named
			for _, k := range snap.Secret {
				delete(e.Values, k)
				e.Hidden = append(e.Hidden, k)
			}
			slices.Sort(e.Hidden)
		}
		if e.History, err = cc.exportHistory(ctx, ns, snap.Release, o.History); err != nil {
			return ConfigExport{}, fmt.Errorf("exporting the history of %s: %w", ns, err)
		}
		if tk != nil && len(snap.Secret) > 0 {
			out.SecretsKey, e.Secrets = o.SecretsKey.Primary(), map[string]string{}
			for _, k := range snap.Secret {
				sealed, err := keyring.Seal(tk, transferAAD(ns, k), snap.Values[k])
				if err != nil {
					return ConfigExport{}, err
				}
				e.Secrets[k] = sealed
				delete(e.Values, k)
			}
		}
		out.Namespaces = append(out.Namespaces, e)
	}
	return out, nil
}

// exportHistory reads up to n of ns's releases up to release last, oldest
// first.
func (cc *ConfigCenter) exportHistory(ctx context.Context, ns string, last int64, n int) ([]ExportedRelease, error) {
	var out []ExportedRelease
	for before := last + 1; len(out) < n && before > 1; {
		page, err := cc.Releases(ctx, ns, before, min(n-len(out), 100))
		if err != nil || len(page) == 0 {
			return out, err
		}
		for _, r := range page {
			e := ExportedRelease{Number: r.Number, Author: r.Author, Message: r.Message, Time: r.Time, RollbackOf: r.RollbackOf, InheritedFrom: r.InheritedFrom, Changes: []ExportChange{}}
			for _, c := range r.Changes {
				e.Changes = append(e.Changes, ExportChange(c))
			}
			out = append(out, e)
			before = r.Number
		}
	}
	slices.Reverse(out)
	return out, nil
}

// ImportOptions qualify an Import.
type ImportOptions struct {
	// DryRun computes and returns what would change, writing nothing
	// (each namespace's new content is still validated against its
	// schema, when the schema does not change).
	DryRun bool
	// Merge keeps the keys a namespace has that the export lacks; by
	// default the namespace becomes exactly the exported content.
	Merge bool
	// Author and Message are recorded with every release.
	Author, Message string
	// SecretsKey opens the export's secrets (the transfer key it was
	// made with); without it an export with secrets is refused.
	SecretsKey TransferKey
}

// ImportResult is what Import did (or, in a dry run, would do) to one
// namespace.
type ImportResult struct {
	Namespace string
	// Changes are the keys the release changes, sorted; none: the
	// namespace's content already was the export's.
	Changes []KeyChange
	// SchemaChanged is true when the namespace's schema becomes the
	// export's.
	SchemaChanged bool
	// ApprovalChanged is true when the namespace's approval policy
	// becomes the export's (set after the content: a namespace that
	// requires approval already refuses the import's release).
	ApprovalChanged bool
	// InheritanceChanged is true when the namespace comes to inherit from
	// the export's shared namespace (or stops); set once every namespace's
	// content is imported, as a release of its own.
	InheritanceChanged bool
	// Release is the release made (Number 0: none, in a dry run or with no
	// change).
	Release ConfigRelease
	// Skipped are secrets the export left out (its Hidden) that the target
	// lacks: they could not be created.
	Skipped []string
	// Replayed is how many releases of the export's history were made
	// again here (in a dry run: would be), the content before the first
	// of them included.
	Replayed int
}

// Import makes each namespace of the export what the export says: one
// release per namespace with every change at once (compare-and-set
// against what it read, so a concurrent publish makes it fail rather than
// be overwritten), and the export's schema. Namespaces are imported one
// after another, in the export's order; it is not atomic across them: on
// an error it returns the results of the namespaces imported before it.
//
// A namespace exported with its history whose content here differs is
// instead brought to the content before the first exported release, and
// each exported release is made again, with its author and its message
// (which gains the release's number, time and o.Message), each a
// compare-and-set on the one before; then one more release sets what the
// history cannot (secrets). Releases that changed only secrets, or that an
// heir inherited, are not made again. A replay that fails part way leaves
// the releases made so far.
//
// Importing the same export again changes nothing and makes no release.
func (cc *ConfigCenter) Import(ctx context.Context, exp ConfigExport, o ImportOptions) ([]ImportResult, error) {
	if exp.Format != ExportFormat {
		return nil, fmt.Errorf("%w: not a coordd config export (format %q, want %q)", ErrInvalidArgument, exp.Format, ExportFormat)
	}
	if exp.SecretsKey != "" {
		if o.SecretsKey == nil {
			return nil, fmt.Errorf("%w: the export holds secrets sealed with transfer key %q: give that key", ErrInvalidArgument, exp.SecretsKey)
		}
		if _, err := o.SecretsKey.Key(exp.SecretsKey); err != nil {
			return nil, fmt.Errorf("%w: the export's secrets were sealed with transfer key %q: %w", ErrInvalidArgument, exp.SecretsKey, err)
		}
	}
	var results []ImportResult
	for _, ns := range exp.Namespaces {
		r, err := cc.importOne(ctx, ns, o, exp.SecretsKey)
		if err == nil {
			err = cc.importApproval(ctx, ns, o, &r)
		}
		if err != nil {
			return results, fmt.Errorf("importing %s: %w", ns.Name, err)
		}
		results = append(results, r)
	}
	for i, ns := range exp.Namespaces {
		if err := cc.importInheritance(ctx, ns, o, &results[i]); err != nil {
			return results, fmt.Errorf("importing %s: %w", ns.Name, err)
		}
	}
	return results, nil
}

// importInheritance makes the namespace inherit as the export says.
func (cc *ConfigCenter) importInheritance(ctx context.Context, ns ExportedNamespace, o ImportOptions, res *ImportResult) error {
	cur, err := cc.Snapshot(ctx, ns.Name, 0)
	if err != nil || cur.Inherits == ns.Inherits {
		return err
	}
	res.InheritanceChanged = true
	if o.DryRun {
		return nil
	}
	_, err = cc.Inherit(ctx, ns.Name, ns.Inherits, PublishOptions{Author: o.Author, Message: o.Message})
	return err
}

// importSnapshot reads the namespace ns is imported into, its own keys
// only. When ns brings secrets it reads their values too if the caller may
// (config.read-secret), so that a secret that already has the exported
// value is not put again: importing the same file twice then makes no
// release.
func (cc *ConfigCenter) importSnapshot(ctx context.Context, ns ExportedNamespace) (NamespaceSnapshot, error) {
	cur, err := cc.RevealSecrets().Snapshot(ctx, ns.Name, 0)
	if len(ns.Secrets) == 0 || err != nil {
		cur, err = cc.Snapshot(ctx, ns.Name, 0)
	}
	for _, k := range cur.Inherited { // only its own keys are imported
		delete(cur.Values, k)
	}
	return cur, err
}

func (cc *ConfigCenter) importOne(ctx context.Context, ns ExportedNamespace, o ImportOptions, keyID string) (ImportResult, error) {
	cur, err := cc.importSnapshot(ctx, ns)
	if err != nil {
		return ImportResult{}, err
	}
	schema, err := cc.Schema(ctx, ns.Name)
	if err != nil {
		return ImportResult{}, err
	}
	res := ImportResult{Namespace: ns.Name, SchemaChanged: schema != ns.Schema}
	ms, secrets, err := planImport(ns, cur, o, keyID, &res)
	if err != nil {
		return res, err
	}
	replay := replaySteps(ns, cur, o, len(ms) > len(secrets))
	res.Replayed = len(replay)
	po := PublishOptions{ExpectedRevision: cur.Revision, Author: o.Author, Message: o.Message}
	if o.DryRun {
		if len(ms) > 0 && !res.SchemaChanged {
			po.DryRun = true
			r, err := cc.Publish(ctx, ns.Name, ms, po)
			if err != nil {
				return res, err
			}
			if len(secrets) > 0 {
				res.Changes = r.Changes // what the member found would change
			}
		}
		return res, nil
	}
	publish := func() error {
		if len(replay) > 0 {
			return cc.replay(ctx, ns, replay, po, o, keyID, &res)
		}
		if len(ms) == 0 {
			return nil
		}
		r, err := cc.Publish(ctx, ns.Name, ms, po)
		res.Release = r
		if err == nil && len(secrets) > 0 {
			res.Changes = r.Changes // what the member found changed
		}
		return err
	}
	if !res.SchemaChanged {
		return res, publish()
	}
	// The schema changes too. Set it first when the current content
	// matches it, so the release is checked against the new schema; else
	// publish first (checked against the old one) and set it after.
	err = cc.SetSchema(ctx, ns.Name, ns.Schema)
	switch {
	case err == nil:
		return res, publish()
	case !errors.Is(err, ErrValidationFailed):
		return res, err
	}
	if err := publish(); err != nil {
		if errors.Is(err, ErrValidationFailed) {
			return res, fmt.Errorf("%w (the namespace's current content breaks the export's schema, and the export's content its current schema: remove the schema first, coordctl config schema %s --remove)", err, ns.Name)
		}
		return res, err
	}
	return res, cc.SetSchema(ctx, ns.Name, ns.Schema)
}

// replayStep is one release of a replay.
type replayStep struct {
	ms              []ConfigMutation
	author, message string
}

// replaySteps are the releases that replay ns's history onto cur: to the
// content before its first release, then each release's changes of
// values (a secret's value is not in history). None when ns has no
// history or differs (differs: false) only in secrets.
func replaySteps(ns ExportedNamespace, cur NamespaceSnapshot, o ImportOptions, differs bool) []replayStep {
	secret := func(k string) bool {
		_, sealed := ns.Secrets[k]
		return sealed || slices.Contains(ns.Hidden, k) || slices.Contains(cur.Secret, k) || slices.Contains(cur.Hidden, k)
	}
	var history []ExportedRelease
	for _, r := range ns.History {
		if r.InheritedFrom == "" {
			history = append(history, r)
		}
	}
	if !differs || len(history) == 0 {
		return nil
	}
	// The content before the first release: the exported values with
	// the history undone, newest first.
	base := maps.Clone(ns.Values)
	for i := len(history) - 1; i >= 0; i-- {
		for _, c := range history[i].Changes {
			switch {
			case c.Secret || secret(c.Key):
			case c.Old == nil:
				delete(base, c.Key)
			default:
				base[c.Key] = *c.Old
			}
		}
	}
	var first []ConfigMutation
	for _, k := range slices.Sorted(maps.Keys(base)) {
		if old, ok := cur.Values[k]; !ok || old != base[k] {
			first = append(first, ConfigMutation{Key: k, Value: base[k]})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(cur.Values)) {
		if _, ok := base[k]; !ok && !o.Merge && !secret(k) {
			first = append(first, ConfigMutation{Key: k, Delete: true})
		}
	}
	var steps []replayStep
	if len(first) > 0 {
		steps = append(steps, replayStep{ms: first, author: o.Author, message: replayMessage(o.Message, fmt.Sprintf("the content before release %d of %s", history[0].Number, ns.Name))})
	}
	for _, r := range history {
		var ms []ConfigMutation
		for _, c := range r.Changes {
			switch {
			case c.Secret || secret(c.Key):
			case c.New == nil:
				ms = append(ms, ConfigMutation{Key: c.Key, Delete: true})
			default:
				ms = append(ms, ConfigMutation{Key: c.Key, Value: *c.New})
			}
		}
		if len(ms) > 0 {
			from := fmt.Sprintf("release %d of %s, %s", r.Number, ns.Name, r.Time.UTC().Format(time.RFC3339))
			steps = append(steps, replayStep{ms: ms, author: cmp.Or(r.Author, o.Author), message: replayMessage(r.Message, from+"; "+o.Message)})
		}
	}
	return steps
}

// replayMessage is msg followed by where it came from, within a release
// message's bound (msg is cut if need be).
func replayMessage(msg, from string) string {
	const maxBytes = 1024 // configcenter.MaxMessageBytes
	suffix := " [" + strings.TrimSuffix(from, "; ") + "]"
	if msg == "" {
		suffix = suffix[2 : len(suffix)-1]
	}
	for len(msg)+len(suffix) > maxBytes {
		_, size := utf8.DecodeLastRuneInString(msg)
		msg = msg[:len(msg)-size]
	}
	return msg + suffix
}

// replay makes the steps, each a compare-and-set on the one before, and
// then the release that makes the namespace what ns says (secrets).
func (cc *ConfigCenter) replay(ctx context.Context, ns ExportedNamespace, steps []replayStep, po PublishOptions, o ImportOptions, keyID string, res *ImportResult) error {
	for i, st := range steps {
		r, err := cc.Publish(ctx, ns.Name, st.ms, PublishOptions{ExpectedRevision: po.ExpectedRevision, Author: st.author, Message: st.message})
		if err != nil {
			return fmt.Errorf("replaying release %d of %d: %w", i+1, len(steps), err)
		}
		res.Release = r
		if r.Revision > 0 {
			po.ExpectedRevision = r.Revision
		}
	}
	cur, err := cc.importSnapshot(ctx, ns)
	if err != nil {
		return err
	}
	var rest ImportResult
	ms, _, err := planImport(ns, cur, o, keyID, &rest)
	if err != nil || len(ms) == 0 {
		return err
	}
	po.ExpectedRevision = cur.Revision
	r, err := cc.Publish(ctx, ns.Name, ms, po)
	if err == nil && r.Revision > 0 {
		res.Release = r
	}
	return err
}

// planImport lists in res the changes that make cur the exported ns, and
// returns the mutations and the secret puts among them.
func planImport(ns ExportedNamespace, cur NamespaceSnapshot, o ImportOptions, keyID string, res *ImportResult) ([]ConfigMutation, []ConfigMutation, error) {
	var ms []ConfigMutation
	for _, k := range slices.Sorted(maps.Keys(ns.Values)) {
		v := ns.Values[k]
		old, ok := cur.Values[k]
		if ok && old == v {
			continue
		}
		ch := KeyChange{Key: k, New: &v}
		if ok {
			ch.Old = &old
		}
		if slices.Contains(cur.Secret, k) { // revealed: never in a result
			ch.Old, ch.Secret = new(string), true
		}
		res.Changes = append(res.Changes, ch)
		ms = append(ms, ConfigMutation{Key: k, Value: v})
	}
	secrets, err := importSecrets(ns, o.SecretsKey, keyID)
	if err != nil {
		return nil, nil, err
	}
	kept := secrets[:0]
	for _, m := range secrets {
		if old, ok := cur.Values[m.Key]; ok && old == m.Value && slices.Contains(cur.Secret, m.Key) {
			continue // revealed (importSnapshot): it has this value
		}
		kept = append(kept, m)
		ch := KeyChange{Key: m.Key, New: new(string), Secret: true}
		if slices.Contains(cur.Hidden, m.Key) || slices.Contains(cur.Secret, m.Key) {
			ch.Old = new(string)
		}
		res.Changes = append(res.Changes, ch)
		ms = append(ms, m)
	}
	secrets = kept
	for _, k := range ns.Hidden {
		if !slices.Contains(cur.Hidden, k) && !slices.Contains(cur.Secret, k) {
			res.Skipped = append(res.Skipped, k)
		}
	}
	if !o.Merge {
		exported := func(k string) bool {
			_, v := ns.Values[k]
			_, s := ns.Secrets[k]
			return v || s || slices.Contains(ns.Hidden, k)
		}
		for _, k := range slices.Sorted(maps.Keys(cur.Values)) {
			if !exported(k) {
				old := cur.Values[k]
				if slices.Contains(cur.Secret, k) { // revealed: never in a result
					old = ""
				}
				res.Changes = append(res.Changes, KeyChange{Key: k, Old: &old, Secret: slices.Contains(cur.Secret, k)})
				ms = append(ms, ConfigMutation{Key: k, Delete: true})
			}
		}
		for _, k := range cur.Hidden {
			if !exported(k) {
				res.Changes = append(res.Changes, KeyChange{Key: k, Old: new(string), Secret: true})
				ms = append(ms, ConfigMutation{Key: k, Delete: true})
			}
		}
	}
	slices.SortFunc(res.Changes, func(a, b KeyChange) int { return strings.Compare(a.Key, b.Key) })
	return ms, secrets, nil
}

// importSecrets opens an exported namespace's secrets with the transfer
// key: puts marked secret.
func importSecrets(ns ExportedNamespace, key TransferKey, keyID string) ([]ConfigMutation, error) {
	if len(ns.Secrets) == 0 {
		return nil, nil
	}
	if key == nil || keyID == "" {
		return nil, fmt.Errorf("%w: %s holds secrets, and the export names no transfer key", ErrInvalidArgument, ns.Name)
	}
	k, err := key.Key(keyID)
	if err != nil {
		return nil, err
	}
	var ms []ConfigMutation
	for _, name := range slices.Sorted(maps.Keys(ns.Secrets)) {
		plain, err := keyring.Open(k, transferAAD(ns.Name, name), ns.Secrets[name])
		if err != nil {
			return nil, fmt.Errorf("%w: secret %q of %s does not open with transfer key %q (another key, or an altered file)", ErrInvalidArgument, name, ns.Name, keyID)
		}
		ms = append(ms, ConfigMutation{Key: name, Value: plain, Secret: true})
	}
	return ms, nil
}

// importApproval makes the namespace's approval policy the export's.
func (cc *ConfigCenter) importApproval(ctx context.Context, ns ExportedNamespace, o ImportOptions, res *ImportResult) error {
	cur, err := cc.ApprovalPolicy(ctx, ns.Name)
	if err != nil {
		return err
	}
	want := ApprovalPolicy{}
	if a := ns.Approval; a != nil && a.Required {
		want.Required = true
		if a.ProposalTTL != "" {
			if want.ProposalTTL, err = time.ParseDuration(a.ProposalTTL); err != nil {
				return fmt.Errorf("%w: approval proposal_ttl %q: %w", ErrInvalidArgument, a.ProposalTTL, err)
			}
		}
	}
	if cur.Required == want.Required && (!want.Required || cur.ProposalTTL == want.ProposalTTL) {
		return nil
	}
	res.ApprovalChanged = true
	if o.DryRun {
		return nil
	}
	return cc.SetApprovalPolicy(ctx, ns.Name, want, o.Author)
}
