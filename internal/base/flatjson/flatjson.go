// Package flatjson reads the members of a flat JSON object without
// reflection: the values coordd writes itself (queue entries, seats),
// which its watchers decode on every change.
//
// It reads only a plain subset of JSON: one object whose keys and strings
// are printable ASCII without escapes, and whose values are such strings,
// integers, true or false. Anything else (an escape, a nested value, null,
// a fraction, bytes past the object) makes the reader report that it
// cannot read the input, and the caller decodes it with encoding/json
// instead. So a decoder built on it gives encoding/json's result for every
// input, quickly for the values coordd writes, and exactly for the rest.
package flatjson

import "strconv"

// Object reads an object's members in order. Its zero value reads nothing.
type Object struct {
	b    []byte
	i    int
	bad  bool
	done bool
}

// NewObject starts reading the object b.
func NewObject(b []byte) Object {
	o := Object{b: b}
	o.space()
	if !o.eat('{') {
		o.bad = true
		return o
	}
	o.space()
	if o.eat('}') {
		o.end()
	}
	return o
}

// Next returns the next member's key (without its quotes) and raw value
// (a string with its quotes, an integer, true or false), or ok false at
// the object's end or where it cannot read on (see Readable).
func (o *Object) Next() (key, raw []byte, ok bool) {
	if o.bad || o.done {
		return nil, nil, false
	}
	if key, ok = o.str(); !ok {
		return o.fail()
	}
	key = key[1 : len(key)-1]
	o.space()
	if !o.eat(':') {
		return o.fail()
	}
	o.space()
	if raw, ok = o.value(); !ok {
		return o.fail()
	}
	o.space()
	switch {
	case o.eat(','):
		o.space()
	case o.eat('}'):
		o.end()
	default:
		return o.fail()
	}
	return key, raw, true
}

// Readable reports whether every member so far was read, and, after Next
// returned false, whether the input was a whole object this package
// reads. When it is false, decode the input with encoding/json.
func (o *Object) Readable() bool { return !o.bad }

// String returns the string a raw value holds.
func String(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	return string(raw[1 : len(raw)-1]), true
}

// Int returns the integer a raw value holds, if it fits in 64 bits.
func Int(raw []byte) (int64, bool) {
	if len(raw) == 0 || raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return 0, false
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	return n, err == nil
}

// Bool returns the boolean a raw value holds.
func Bool(raw []byte) (v, ok bool) {
	switch string(raw) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

func (o *Object) fail() ([]byte, []byte, bool) {
	o.bad = true
	return nil, nil, false
}

// end notes the object's closing brace: only white space may follow.
func (o *Object) end() {
	o.done = true
	o.space()
	if o.i != len(o.b) {
		o.bad = true
	}
}

func (o *Object) eat(c byte) bool {
	if o.i < len(o.b) && o.b[o.i] == c {
		o.i++
		return true
	}
	return false
}

func (o *Object) space() {
	for o.i < len(o.b) {
		switch o.b[o.i] {
		case ' ', '\t', '\n', '\r':
			o.i++
		default:
			return
		}
	}
}

// str reads a string of printable ASCII without escapes, quotes included.
func (o *Object) str() ([]byte, bool) {
	start := o.i
	if !o.eat('"') {
		return nil, false
	}
	for o.i < len(o.b) {
		c := o.b[o.i]
		o.i++
		switch {
		case c == '"':
			return o.b[start:o.i], true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

func (o *Object) value() ([]byte, bool) {
	if o.i >= len(o.b) {
		return nil, false
	}
	switch c := o.b[o.i]; {
	case c == '"':
		return o.str()
	case c == 't':
		return o.literal("true")
	case c == 'f':
		return o.literal("false")
	case c == '-' || c >= '0' && c <= '9':
		return o.integer()
	}
	return nil, false
}

func (o *Object) literal(lit string) ([]byte, bool) {
	if len(o.b)-o.i < len(lit) || string(o.b[o.i:o.i+len(lit)]) != lit {
		return nil, false
	}
	o.i += len(lit)
	return o.b[o.i-len(lit) : o.i], true
}

// integer reads -?(0|[1-9][0-9]*) not followed by a fraction or exponent.
func (o *Object) integer() ([]byte, bool) {
	start := o.i
	o.eat('-')
	digits := o.i
	for o.i < len(o.b) && o.b[o.i] >= '0' && o.b[o.i] <= '9' {
		o.i++
	}
	n := o.i - digits
	if n == 0 || n > 1 && o.b[digits] == '0' {
		return nil, false
	}
	if o.i < len(o.b) {
		switch o.b[o.i] {
		case '.', 'e', 'E':
			return nil, false
		}
	}
	return o.b[start:o.i], true
}
