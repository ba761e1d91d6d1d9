package gateway

import (
	"testing"
	"time"
)

func TestRequestError(t *testing.T) {
	for in, want := range map[string]string{
		"unexpected EOF": "the request body ends before its JSON value does: was it cut short?",
		"EOF":            "the request body is empty: send a JSON object ({} when no field is needed)",
		`proto: (line 1:2): unknown field "bogus"`:                          `the request body has no field "bogus" (line 1, column 2); /openapi.json lists each request's fields`,
		`proto: syntax error (line 1:1): unexpected token [`:                "the request body must be a JSON object ({...}), not an array",
		`proto: syntax error (line 2:7): unexpected token }`:                "the request body is not valid JSON (line 2, column 7): unexpected }",
		`proto: (line 1:38): invalid value for string field value: 5`:       `field "value" takes a string, not 5 (line 1, column 38)`,
		`proto: (line 1:9): invalid value for int64 field afterRevision: x`: `field "afterRevision" takes a whole number (as a number or a string), not x (line 1, column 9)`,
		`proto: (line 1:8): invalid google.protobuf.Duration value "soon"`:  `"soon" is not a duration (line 1, column 8): write "90s", "1m30s", "250ms" or a number of seconds`,
		`proto: (line 1:5): duplicate field "ttl"`:                          `the request body names field "ttl" twice (line 1, column 5)`,
		`parsing field "wait": time: invalid duration "abc"`:                `query parameter "wait": "abc" is not a duration: write "90s", "1m30s", "250ms" or a number of seconds`,
		`proto: (line 1:10): invalid UTF-8 in string`:                       "invalid UTF-8 in string (line 1, column 10)",
		"the request body names \"ttl\" twice in one object":                "the request body names \"ttl\" twice in one object",
	} {
		if got := requestError(in); got != want {
			t.Errorf("requestError(%q)\n got %q\nwant %q", in, got, want)
		}
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{"30": 30 * time.Second, "1.5": 1500 * time.Millisecond, "-2": -2 * time.Second, "1m": time.Minute, "250ms": 250 * time.Millisecond} {
		if d, ok := parseDuration(in); !ok || d != want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v", in, d, ok, want)
		}
	}
	for _, in := range []string{"", "soon", "1e3", "0x10", "NaN", "Inf", " 30", "30 ", "1_0", "1e400"} {
		if d, ok := parseDuration(in); ok {
			t.Errorf("parseDuration(%q) = %v; want refused", in, d)
		}
	}
}

// protobuf-go writes a no-break space after "proto:" at random.
func TestRequestErrorNoBreakSpace(t *testing.T) {
	if got, want := requestError("proto:\u00a0(line 1:2): unknown field \"x\""), `the request body has no field "x" (line 1, column 2); /openapi.json lists each request's fields`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
