package configvalue

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestJSON(t *testing.T) {
	for text, want := range map[string]any{
		`3`:                  3.0,
		`true`:               true,
		`null`:               nil,
		`"5"`:                "5",
		`{"a":1}`:            map[string]any{"a": 1.0},
		`[1, 2]`:             []any{1.0, 2.0},
		`5s`:                 "5s",
		`postgres://db:5432`: "postgres://db:5432",
		`hello world`:        "hello world",
		``:                   "",
		`  `:                 "  ",
		`{`:                  "{",
		`"unterminated`:      `"unterminated`,
	} {
		var got any
		if err := json.Unmarshal(JSON(text), &got); err != nil {
			t.Errorf("JSON(%q) = %s: %v", text, JSON(text), err)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("JSON(%q) reads as %#v, want %#v", text, got, want)
		}
	}
}

func TestTextReadsBackAsTheString(t *testing.T) {
	for s, want := range map[string]string{
		"5s":                 "5s",
		"postgres://db:5432": "postgres://db:5432",
		"":                   "",
		"  ":                 "  ",
		"8080":               `"8080"`,
		"true":               `"true"`,
		"null":               `"null"`,
		`"x"`:                `"\"x\""`,
		"{}":                 `"{}"`,
		" 3":                 `" 3"`,
		"<a & b>":            "<a & b>",
	} {
		if got := Text(s); got != want {
			t.Errorf("Text(%q) = %q, want %q", s, got, want)
		}
		var back any
		if err := json.Unmarshal(JSON(Text(s)), &back); err != nil || back != s {
			t.Errorf("Text(%q) = %q reads back as %#v (%v)", s, Text(s), back, err)
		}
	}
}
