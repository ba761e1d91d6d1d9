package configcenter

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/go-multierror"

	"github.com/coordd/coordd/internal/base/names"
	"github.com/coordd/coordd/internal/shared/keyring"
)

// Limits bound what one namespace and one release may hold. The zero value
// of a field means its default.
type Limits struct {
	// MaxValueBytes bounds one value. Default 256 KiB.
	MaxValueBytes int
	// MaxReleaseBytes bounds one release: its new and old values together
	// (a release record keeps both, for history and rollback). Default
	// 1 MiB, under etcd's default 1.5 MiB request limit.
	MaxReleaseBytes int
	// MaxKeysPerRelease bounds the keys one release changes (etcd bounds the
	// operations of one transaction; 128 by default). Default 100.
	MaxKeysPerRelease int
	// HistoryReleases is how many releases of a namespace are kept for
	// history, diff and rollback. Default 100.
	HistoryReleases int
}

// Defaults.
const (
	DefaultMaxValueBytes     = 256 << 10
	DefaultMaxReleaseBytes   = 1 << 20
	DefaultMaxKeysPerRelease = 100
	DefaultHistoryReleases   = 100
	MaxNamespaceBytes        = names.MaxName
	MaxKeyBytes              = 256
	MaxAuthorBytes           = 256
	MaxMessageBytes          = 1024
	MaxSchemaBytes           = 64 << 10
)

func (l Limits) withDefaults() Limits {
	if l.MaxValueBytes <= 0 {
		l.MaxValueBytes = DefaultMaxValueBytes
	}
	if l.MaxReleaseBytes <= 0 {
		l.MaxReleaseBytes = DefaultMaxReleaseBytes
	}
	if l.MaxKeysPerRelease <= 0 {
		l.MaxKeysPerRelease = DefaultMaxKeysPerRelease
	}
	if l.HistoryReleases <= 0 {
		l.HistoryReleases = DefaultHistoryReleases
	}
	return l
}

// ValidateNamespace accepts the names locks and elections take (see package
// names): segments of ASCII letters, digits and . _ : @ - joined by single
// slashes, such as "payments/prod", at most MaxNamespaceBytes in all.
func ValidateNamespace(ns string) error {
	if err := names.Check("namespace", ns); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// validateKey accepts 1 to MaxKeyBytes of [A-Za-z0-9._:@/-].
func validateKey(key string) error {
	if len(key) > MaxKeyBytes {
		return fmt.Errorf("key is %d bytes, at most %d are allowed", len(key), MaxKeyBytes)
	}
	return names.CheckKey("key", key)
}

// checkMutations validates a release's mutations and reports every problem
// at once.
func (s *Store) checkMutations(ms []Mutation) error {
	var errs *multierror.Error
	if len(ms) == 0 {
		errs = multierror.Append(errs, &Problem{Message: "a release needs at least one change"})
	}
	if len(ms) > s.limits.MaxKeysPerRelease {
		errs = multierror.Append(errs, &Problem{Message: fmt.Sprintf("%d keys change, at most %d may in one release", len(ms), s.limits.MaxKeysPerRelease)})
	}
	seen := map[string]bool{}
	tooLarge := false
	for _, m := range ms {
		if err := validateKey(m.Key); err != nil {
			errs = multierror.Append(errs, &Problem{Key: m.Key, Message: err.Error()})
			continue
		}
		if seen[m.Key] {
			errs = multierror.Append(errs, &Problem{Key: m.Key, Message: "changed twice in one release"})
		}
		seen[m.Key] = true
		if m.Delete {
			continue
		}
		if len(m.Value) > s.limits.MaxValueBytes {
			tooLarge = true
			errs = multierror.Append(errs, &Problem{Key: m.Key, Message: fmt.Sprintf("value is %d bytes, at most %d are allowed", len(m.Value), s.limits.MaxValueBytes)})
		}
		if !utf8.ValidString(m.Value) {
			errs = multierror.Append(errs, &Problem{Key: m.Key, Message: "value is not valid UTF-8"})
		}
		if keyring.IsSealed(m.Value) {
			errs = multierror.Append(errs, &Problem{Key: m.Key, Message: fmt.Sprintf("a value may not start with %q, which marks a sealed secret; to store a secret, mark the key secret and give its clear value", keyring.SealedPrefix)})
		}
	}
	return problems(errs, tooLarge)
}

// validateText checks free text a person reads later (a release's
// message, a schema, a status's reason): at most limit bytes of UTF-8,
// without control characters other than newline (or CRLF) and tab, nor Unicode's
// bidirectional overrides and isolates. A terminal acts on those: an
// escape sequence in a message could clear an operator's screen, a
// carriage return or a bidi override redraw a line of `config history`.
func validateText(what, s string, limit int) error {
	if err := validateSize(what, s, limit); err != nil {
		return err
	}
	for i, r := range s {
		if r == '\n' || r == '\t' || r == '\r' && strings.HasPrefix(s[i+1:], "\n") || !isTerminalControl(r) {
			continue
		}
		return fmt.Errorf("%w: %s has the control character %U at byte %d: only printable text, newlines and tabs are allowed", ErrInvalid, what, r, i)
	}
	return nil
}

// validateSize checks a document's size and encoding (a schema: JSON
// escapes what it shows).
func validateSize(what, s string, limit int) error {
	if len(s) > limit {
		return fmt.Errorf("%w: %s is %d bytes, at most %d are allowed", ErrTooLarge, what, len(s), limit)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, what)
	}
	return nil
}

// validateLine is validateText for one line (an author, a label): no
// newline or tab either.
func validateLine(what, s string, limit int) error {
	if err := validateText(what, s, limit); err != nil {
		return err
	}
	if i := strings.IndexAny(s, "\n\t"); i >= 0 {
		return fmt.Errorf("%w: %s has a newline or tab at byte %d: it is one line", ErrInvalid, what, i)
	}
	return nil
}

// isTerminalControl reports whether r makes a terminal do something
// rather than show a character: C0 and C1 controls, DEL, and the
// bidirectional embeddings, overrides and isolates.
func isTerminalControl(r rune) bool {
	return unicode.IsControl(r) || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069
}
