package history

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// entryInputs makes JSON-ish values of queue entries: coordd's own, and
// ones with what the flat reader does not take (escapes, other cases of
// a field's name, nulls, fractions, nesting, duplicates, broken syntax).
func entryInputs(rng *rand.Rand, n int) []string {
	keys := []string{"limit", "request_id", "read", "enqueued", "granted", "since", "attempt", "metadata", "Limit", "READ", "Since", "lock_delay", "x"}
	values := []string{`1`, `0`, `-3`, `007`, `1.5`, `1e3`, `99999999999999999999`, `true`, `false`, `null`, `""`, `"r-1"`,
		`"a\"b"`, `"\u00e9"`, "\"\xff\"", `"2026-12-06T05:13:41.123456789Z"`, `"2026-12-06T05:13:41+01:00"`, `"2026-13-06T05:13:41Z"`,
		`"0001-01-01T00:00:00Z"`, `{}`, `[1]`, `{"a":1}`, `"x y"`}
	var out []string
	for range n {
		var b strings.Builder
		b.WriteString([]string{"{", " {", "{\n"}[rng.IntN(3)])
		for i := range rng.IntN(6) {
			if i > 0 {
				b.WriteString([]string{",", " , ", ",\t"}[rng.IntN(3)])
			}
			b.WriteString(`"` + keys[rng.IntN(len(keys))] + `"`)
			b.WriteString([]string{":", " : "}[rng.IntN(2)])
			b.WriteString(values[rng.IntN(len(values))])
		}
		b.WriteString([]string{"}", "} ", "}x", ",}", "", "}}"}[rng.IntN(6)])
		out = append(out, b.String())
	}
	return out
}

// decodeEntry gives json.Unmarshal's result for every input (that the
// flat path takes what the lock and election packages write is
// TestEntriesAsWrittenDecodeFlat's).
func TestDecodeEntryMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	inputs := append(entryInputs(rng, 20000), "", "null", "[]", "{}", `{"limit":1}`, `{"limit":1,"limit":2}`, `{"limit":1,"limit":"2"}`)
	flat := 0
	for _, in := range inputs {
		var want entryValue
		_ = json.Unmarshal([]byte(in), &want)
		if got := decodeEntry([]byte(in)); !reflect.DeepEqual(got, want) {
			t.Fatalf("decodeEntry(%q) = %+v, encoding/json gives %+v", in, got, want)
		}
		if got, ok := decodeEntryFlat([]byte(in)); ok {
			flat++
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("flat path took %q: %+v, encoding/json gives %+v", in, got, want)
			}
		}
	}
	if flat < len(inputs)/20 {
		t.Fatalf("the flat path took %d of %d inputs: the test no longer exercises it", flat, len(inputs))
	}
}

// FuzzDecodeEntry: decodeEntry agrees with encoding/json on any input.
func FuzzDecodeEntry(f *testing.F) {
	for _, in := range entryInputs(rand.New(rand.NewPCG(5, 6)), 50) {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var want entryValue
		_ = json.Unmarshal(in, &want)
		if got := decodeEntry(in); !reflect.DeepEqual(got, want) {
			t.Fatalf("decodeEntry(%q) = %+v, encoding/json gives %+v", in, got, want)
		}
	})
}

func BenchmarkDecodeEntry(b *testing.B) {
	at := time.Date(2026, 12, 6, 5, 13, 41, 123456789, time.UTC)
	in := []byte(`{"attempt":"a1b2c3d4","limit":1,"request_id":"9f86d081884c7d65","enqueued":"` + at.Format(time.RFC3339Nano) + `"}`)
	b.Run("flat", func(b *testing.B) {
		for b.Loop() {
			decodeEntry(in)
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			var v entryValue
			_ = json.Unmarshal(in, &v)
		}
	})
}
