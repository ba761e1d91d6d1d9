package render

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/configvalue"
)

// reader gives a template its functions over one snapshot and records
// what it reads: the namespaces it read, and those it named that the
// subscription does not follow yet (missing: the render is done again once
// they are followed).
type reader struct {
	snap     *clientlib.ConfigSnapshot
	followed []string
	read     map[string]bool
	missing  []string
}

func (rd *reader) funcs() map[string]any {
	return map[string]any{
		"ns": func(ns string) map[string]string {
			if !rd.use(ns) {
				return map[string]string{}
			}
			return rd.snap.Values(ns)
		},
		"key": func(ns, k string) (string, error) {
			if !rd.use(ns) {
				return "", nil
			}
			v, ok := rd.snap.Get(ns, k)
			if !ok {
				return "", fmt.Errorf("key %q is not in namespace %s (release %d)", k, ns, rd.snap.Release(ns))
			}
			return v, nil
		},
		"keyOr": func(ns, k, def string) string {
			if !rd.use(ns) {
				return def
			}
			if v, ok := rd.snap.Get(ns, k); ok {
				return v
			}
			return def
		},
		"keys": func(ns string) []string {
			if !rd.use(ns) {
				return nil
			}
			return rd.snap.Keys(ns)
		},
		"release": func(ns string) int64 {
			if !rd.use(ns) {
				return 0
			}
			return rd.snap.Release(ns)
		},
		"parseJSON": func(s string) (any, error) {
			var v any
			if err := json.Unmarshal([]byte(s), &v); err != nil {
				return nil, fmt.Errorf("parseJSON: %w", err)
			}
			return v, nil
		},
		// text is a value read as text: a JSON string without its quotes
		// ("8080" stored quoted to stay a string prints 8080), anything
		// else as stored.
		"text": func(s string) string {
			var str string
			if json.Unmarshal(configvalue.JSON(s), &str) == nil {
				return str
			}
			return s
		},
		// value is a value read as configvalue's rule reads it (a schema
		// and Bind read it so): JSON text as that JSON, other text as a
		// string.
		"value": func(s string) any {
			var v any
			_ = json.Unmarshal(configvalue.JSON(s), &v) // configvalue.JSON is always JSON
			return v
		},
		"toJSON": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
		"env":       os.Getenv,
		"split":     func(s, sep string) []string { return strings.Split(s, sep) },
		"join":      func(list []string, sep string) string { return strings.Join(list, sep) },
		"trimSpace": strings.TrimSpace,
		"upper":     strings.ToUpper,
		"lower":     strings.ToLower,
	}
}

// use records that the template reads ns and reports whether the
// snapshot has it (the subscription follows it).
func (rd *reader) use(ns string) bool {
	if rd.snap == nil { // parsing: no snapshot
		return false
	}
	rd.read[ns] = true
	if slices.Contains(rd.followed, ns) {
		return true
	}
	if !slices.Contains(rd.missing, ns) {
		rd.missing = append(rd.missing, ns)
	}
	return false
}
