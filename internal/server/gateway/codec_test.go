package gateway

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

func decode(t *testing.T, body string, v *coorddv1.AcquireRequest) error {
	t.Helper()
	return newCodec().NewDecoder(strings.NewReader(body)).Decode(v)
}

// Request bodies take Go durations as well as protobuf's seconds, in any
// Duration field; anything else is refused as before.
func TestCodecDurations(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want time.Duration
	}{
		{`"60s"`, time.Minute},
		{`"1.5s"`, 1500 * time.Millisecond},
		{`"1m"`, time.Minute},
		{`"1h30m"`, 90 * time.Minute},
		{`"250ms"`, 250 * time.Millisecond},
		{`"0"`, 0},
		{`60`, time.Minute},
		{`"60"`, time.Minute},
		{`1.5`, 1500 * time.Millisecond},
	} {
		var req coorddv1.AcquireRequest
		if err := decode(t, `{"name":"a","wait":`+tt.in+`,"lockDelay":`+tt.in+`}`, &req); err != nil {
			t.Errorf("%s: %v", tt.in, err)
			continue
		}
		if got := req.GetWait().AsDuration(); got != tt.want {
			t.Errorf("wait %s = %s, want %s", tt.in, got, tt.want)
		}
		if got := req.GetLockDelay().AsDuration(); got != tt.want {
			t.Errorf("lockDelay %s = %s, want %s", tt.in, got, tt.want)
		}
		if req.GetName() != "a" {
			t.Errorf("name = %q after rewriting %s", req.GetName(), tt.in)
		}
	}
	for _, bad := range []string{`"soon"`, `"1x"`, `"1e3"`, `true`, `{}`} {
		var req coorddv1.AcquireRequest
		if err := decode(t, `{"wait":`+bad+`}`, &req); err == nil {
			t.Errorf("wait %s accepted as %s", bad, req.GetWait().AsDuration())
		}
	}
	var req coorddv1.AcquireRequest
	if err := decode(t, `{"name":"a","bogus":1}`, &req); err == nil {
		t.Error("unknown field accepted")
	}
	// One JSON object, each key once: trailing content and a key given
	// twice (which a duration rewrite would quietly collapse) are refused,
	// in nested objects too; the same key in sibling objects is fine.
	for _, bad := range []string{
		`{"name":"a"} {"name":"b"}`,
		`{"name":"a"}x`,
		`{"name":"a","name":"b"}`,
		`{"name":"a","wait":"1m","wait":"2m"}`,
	} {
		var req coorddv1.AcquireRequest
		if err := decode(t, bad, &req); err == nil {
			t.Errorf("%s accepted as %v", bad, &req)
		}
	}
	if err := checkDuplicateKeys([]byte(`{"a":{"k":1,"k":2}}`)); err == nil {
		t.Error("a key twice in a nested object accepted")
	}
	if err := checkDuplicateKeys([]byte(`{"a":[{"k":1},{"k":2}],"b":{"k":[1,{"k":2}]},"c":"k"}`)); err != nil {
		t.Errorf("the same key in different objects refused: %v", err)
	}
	if err := decode(t, "{\"name\":\"a\",\"wait\":\"1m\"}\n\t ", &req); err != nil {
		t.Errorf("trailing white space refused: %v", err)
	}
	// Rewriting a duration must not launder invalid UTF-8 into U+FFFD.
	if err := decode(t, "{\"name\":\"a\",\"wait\":\"1m\",\"metadata\":\"\xff\"}", &req); err == nil {
		t.Errorf("invalid UTF-8 beside a Go duration accepted as %q", req.GetMetadata())
	}
}

// Responses end with a newline and carry empty lists as [].
func TestCodecMarshal(t *testing.T) {
	b, err := newCodec().Marshal(&coorddv1.CandidatesResponse{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(b), "}\n") {
		t.Errorf("Marshal = %q, want a newline at the end", b)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if l, ok := got["candidates"].([]any); !ok || len(l) != 0 {
		t.Errorf("Marshal = %s, want \"candidates\": []", b)
	}
}

// A value of the wrong type names the field as the caller wrote it, what
// the field takes and what it got (protojson says only "unexpected
// token", or names a map's values "value").
func TestCodecNamesAValueOfTheWrongType(t *testing.T) {
	for body, want := range map[string]string{
		`{"ttl":"10s","labels":"team"}`:           `field "labels" takes an object of strings, such as {"name": "value"}, not "team" (line 1, column 23)`,
		`{"ttl":"10s","labels":["team"]}`:         `field "labels" takes an object of strings, such as {"name": "value"}, not a list (line 1, column 23)`,
		`{"ttl":"10s","labels":{"team":1}}`:       `field labels["team"] takes a string, not 1 (line 1, column 31)`,
		"{\n  \"ttl\": true\n}":                   `field "ttl" takes a duration, such as "90s", not true (line 2, column 10)`,
		`{"ttl":"10s","labels":{"a":"b","c":{}}}`: `field labels["c"] takes a string, not an object (line 1, column 36)`,
	} {
		var req coorddv1.CreateSessionRequest
		err := newCodec().NewDecoder(strings.NewReader(body)).Decode(&req)
		if err == nil || err.Error() != want {
			t.Errorf("%s:\n got %v\nwant %s", body, err, want)
		}
	}
	for body, want := range map[string]string{
		`{"namespace":"a/b","mutations":{"key":"x"}}`:                                       `field "mutations" takes a list of objects, such as [{...}], not an object (line 1, column 32)`,
		`{"namespace":"a/b","mutations":[{"key":"x","value":"5"},{"key":"y","value":[1]}]}`: `field mutations[1].value takes a string, not a list (line 1, column 76)`,
	} {
		var req coorddv1.PublishRequest
		err := newCodec().NewDecoder(strings.NewReader(body)).Decode(&req)
		if err == nil || err.Error() != want {
			t.Errorf("%s:\n got %v\nwant %s", body, err, want)
		}
	}
}
