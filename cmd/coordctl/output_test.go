package main

import "testing"

// Free text shown in a table can neither break its lines nor drive the
// terminal: newlines, tabs, escape sequences, carriage returns, C1
// controls and bidi overrides are shown escaped; a block keeps its
// newlines; plain text is untouched.
func TestCellEscapesTerminalControls(t *testing.T) {
	for in, want := range map[string]string{
		"plain text, ünïcode":           "plain text, ünïcode",
		"fix\nrelease 99 by ops":        `fix\nrelease 99 by ops`,
		"a\tb":                          `a\tb`,
		"x\x1b[2Jy":                     `x\u001b[2Jy`,
		"over\rwrite":                   `over\u000dwrite`,
		"c1 \u009b2J":                   `c1 \u009b2J`,
		"bidi \u202eevil\u2066 isolate": `bidi \u202eevil\u2066 isolate`,
	} {
		if got := cell(in); got != want {
			t.Errorf("cell(%q) = %q, want %q", in, got, want)
		}
	}
	if got, want := block("two\nlines\x1b[2J"), "two\nlines\\u001b[2J"; got != want {
		t.Errorf("block = %q, want %q", got, want)
	}
}
