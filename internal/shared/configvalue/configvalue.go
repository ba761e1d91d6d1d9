// Package configvalue holds the one rule by which a config value, which
// coordd stores as text, is read as a typed value: by a namespace's JSON
// Schema on the server and by clientlib's Bind in the SDK.
//
// The rule: text that is a JSON value is that value (3 is a number, true a
// boolean, {"a":1} an object, "5" with its quotes the string 5); any other
// text is a string of itself (5s, postgres://db:5432, hello). So plain
// strings need no quotes, and a string that looks like a number, a boolean
// or null keeps its quotes to stay a string.
package configvalue

import (
	"encoding/json"
	"strings"
)

// JSON returns text as JSON under the rule above.
func JSON(text string) []byte {
	if strings.TrimSpace(text) != "" && json.Valid([]byte(text)) {
		return []byte(text)
	}
	b, _ := json.Marshal(text) // a Go string always marshals
	return b
}

// Text returns the text that reads back, under the rule above, as the
// string s: s itself, or s quoted when alone it would read as another JSON
// value (8080, true, null, "x", {}).
func Text(s string) string {
	if strings.TrimSpace(s) != "" && json.Valid([]byte(s)) {
		b, _ := json.Marshal(s) // a Go string always marshals
		return string(b)
	}
	return s
}
