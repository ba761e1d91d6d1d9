package flatjson_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/coordd/coordd/internal/base/flatjson"
)

// members reads in whole: its members as key=raw, and whether it was
// readable.
func members(in string) (string, bool) {
	o := flatjson.NewObject([]byte(in))
	var out []string
	for {
		k, raw, ok := o.Next()
		if !ok {
			return strings.Join(out, " "), o.Readable()
		}
		out = append(out, string(k)+"="+string(raw))
	}
}

// The plain subset is read member by member; anything else is refused,
// and every input refused or not is JSON's verdict where it is read.
func TestObject(t *testing.T) {
	for _, tc := range []struct {
		in, members string
		readable    bool
	}{
		{`{}`, "", true},
		{" {\n} \t", "", true},
		{`{"a":1,"b":"x y","c":true,"d":false,"e":-20}`, `a=1 b="x y" c=true d=false e=-20`, true},
		{`{ "a" : 0 , "a" : "" }`, `a=0 a=""`, true},
		// Refused: JSON that encoding/json must decode, and not JSON.
		{`{"a":null}`, "", false},
		{`{"a":1.5}`, "", false},
		{`{"a":1e3}`, "", false},
		{`{"a":01}`, "", false},
		{`{"a":"\n"}`, "", false},
		{`{"a\u0062":1}`, "", false},
		{"{\"a\":\"\xc3\xa9\"}", "", false},
		{`{"a":{}}`, "", false},
		{`{"a":[]}`, "", false},
		{`{"a":1,"b":null}`, "a=1", false},
		{`{"a":1,}`, "a=1", false},
		{`{"a":1}x`, "a=1", false},
		{`{"a":1}}`, "a=1", false},
		{`{"a":1`, "", false},
		{`{"a" 1}`, "", false},
		{`{"a":tru}`, "", false},
		{`[]`, "", false},
		{``, "", false},
	} {
		got, readable := members(tc.in)
		if got != tc.members || readable != tc.readable {
			t.Errorf("%q: members %q readable %v, want %q %v", tc.in, got, readable, tc.members, tc.readable)
		}
		if readable && !json.Valid([]byte(tc.in)) {
			t.Errorf("%q is read, but it is not JSON", tc.in)
		}
	}
}

func TestValues(t *testing.T) {
	if s, ok := flatjson.String([]byte(`"a b"`)); !ok || s != "a b" {
		t.Errorf(`String("a b") = %q, %v`, s, ok)
	}
	if _, ok := flatjson.String([]byte(`1`)); ok {
		t.Error("String(1) is ok")
	}
	if n, ok := flatjson.Int([]byte(`-9223372036854775808`)); !ok || n != -1<<63 {
		t.Errorf("Int(min int64) = %d, %v", n, ok)
	}
	for _, raw := range []string{`9223372036854775808`, `"1"`, `true`} {
		if _, ok := flatjson.Int([]byte(raw)); ok {
			t.Errorf("Int(%s) is ok", raw)
		}
	}
	if v, ok := flatjson.Bool([]byte(`true`)); !ok || !v {
		t.Errorf("Bool(true) = %v, %v", v, ok)
	}
	if _, ok := flatjson.Bool([]byte(`1`)); ok {
		t.Error("Bool(1) is ok")
	}
}
