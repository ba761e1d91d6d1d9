package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// A request body reaches protojson only once encoding/json has read it, so
// protojson's "syntax error" or "invalid value" is a value of the wrong
// type for its field: a string where labels take an object, a number
// where a map's values are strings. protojson names the position and, at
// best, the innermost field ("value", for a map's values). wrongType names
// the whole field path the caller wrote, what it takes and what it got.

// reDecodeAt finds protojson's position in its message.
var reDecodeAt = regexp.MustCompile(`\(line (\d+):(\d+)\): (?:unexpected token|invalid value)`)

// wrongType explains protojson's error err for the body raw of a message
// md, or returns "" when err is not a value of the wrong type it can
// place. The position is the caller's, in sent, the body as sent (raw is
// sent with its durations rewritten).
func wrongType(sent, raw []byte, md protoreflect.MessageDescriptor, err error) string {
	m := reDecodeAt.FindStringSubmatch(err.Error())
	if m == nil {
		return ""
	}
	line, _ := strconv.Atoi(m[1])
	col, _ := strconv.Atoi(m[2])
	off, ok := offsetOf(raw, line, col)
	if !ok {
		return ""
	}
	path, got, ok := valueAt(raw, off)
	if !ok || len(path) == 0 {
		return ""
	}
	name, want, ok := expected(md, path)
	if !ok {
		return ""
	}
	if !bytes.Equal(sent, raw) {
		if line, col, ok = positionOf(sent, path); !ok {
			return fmt.Sprintf("%s takes %s, not %s", name, want, got)
		}
	}
	return fmt.Sprintf("%s takes %s, not %s (line %d, column %d)", name, want, got, line, col)
}

// offsetOf is the byte offset of 1-based line and column in raw.
func offsetOf(raw []byte, line, col int) (int, bool) {
	off := 0
	for l := 1; l < line; l++ {
		i := bytes.IndexByte(raw[off:], '\n')
		if i < 0 {
			return 0, false
		}
		off += i + 1
	}
	off += col - 1
	return off, off >= 0 && off < len(raw)
}

// pathStep is one step from a message to a value: an object member's key
// or a list's index (key "" then).
type pathStep struct {
	key   string
	index int
}

// valueAt is the path of the JSON value that starts at byte off of raw,
// and that value described in words.
func valueAt(raw []byte, off int) (path []pathStep, got string, ok bool) {
	walk(raw, func(start int, p []pathStep, tok json.Token) bool {
		if start != off {
			return true
		}
		path, got, ok = slices.Clone(p), describe(tok, raw[start:]), true
		return false
	})
	return path, got, ok
}

// positionOf is the line and column at which the value at path starts in
// raw.
func positionOf(raw []byte, path []pathStep) (line, col int, ok bool) {
	walk(raw, func(start int, p []pathStep, _ json.Token) bool {
		if !slices.Equal(p, path) {
			return true
		}
		line = 1 + bytes.Count(raw[:start], []byte("\n"))
		col, ok = start-bytes.LastIndexByte(raw[:start], '\n'), true
		return false
	})
	return line, col, ok
}

// walk calls visit with each JSON value of raw (objects and lists before
// their members): where it starts, its path and its first token, in one
// pass, until visit returns false.
func walk(raw []byte, visit func(start int, path []pathStep, tok json.Token) bool) {
	type frame struct {
		object, wantKey bool
	}
	var stack []frame
	var path []pathStep
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	for {
		start := skipSeparators(raw, int(d.InputOffset()))
		tok, err := d.Token()
		if err != nil {
			return
		}
		n := len(stack)
		if s, ok := tok.(string); ok && n > 0 && stack[n-1].object && stack[n-1].wantKey {
			path[n-1].key, stack[n-1].wantKey = s, false
			continue
		}
		if delim, ok := tok.(json.Delim); ok && (delim == '}' || delim == ']') {
			stack, path = stack[:n-1], path[:n-1]
			if n > 1 {
				next(stack[n-2].object, &stack[n-2].wantKey, &path[n-2])
			}
			continue
		}
		if !visit(start, path, tok) {
			return
		}
		if delim, ok := tok.(json.Delim); ok {
			stack, path = append(stack, frame{object: delim == '{', wantKey: delim == '{'}), append(path, pathStep{})
			continue
		}
		if n > 0 {
			next(stack[n-1].object, &stack[n-1].wantKey, &path[n-1])
		}
	}
}

// next moves a frame past one of its values.
func next(object bool, wantKey *bool, step *pathStep) {
	if object {
		*wantKey = true
		return
	}
	step.index++
}

// skipSeparators is the offset of the next token at or after i.
func skipSeparators(raw []byte, i int) int {
	for i < len(raw) && strings.IndexByte(" \t\r\n,:", raw[i]) >= 0 {
		i++
	}
	return i
}

// describe says what a JSON value is: its text when short, else its kind.
func describe(tok json.Token, rest []byte) string {
	switch t := tok.(type) {
	case json.Delim:
		if t == '{' {
			return "an object"
		}
		return "a list"
	case string:
		if q, _ := json.Marshal(t); len(q) <= 40 {
			return string(q)
		}
		return "a long string"
	case nil:
		return "null"
	}
	if i := bytes.IndexAny(rest, ",}] \t\r\n"); i > 0 && i <= 40 {
		return string(rest[:i])
	}
	return "a number"
}

// expected follows path from md and returns the field as the caller wrote
// it (labels["team"], mutations[0].value) and what it takes.
func expected(md protoreflect.MessageDescriptor, path []pathStep) (string, string, bool) {
	var name strings.Builder
	var fd protoreflect.FieldDescriptor
	inList, inMap := false, false // the value is an element of fd's list or map
	for i, st := range path {
		switch {
		case fd != nil && fd.IsList() && !inList:
			fmt.Fprintf(&name, "[%d]", st.index)
			inList = true
			continue
		case fd != nil && fd.IsMap() && !inMap:
			fmt.Fprintf(&name, "[%q]", st.key)
			inMap = true
			continue
		}
		if fd != nil {
			switch {
			case inMap && fd.MapValue().Kind() == protoreflect.MessageKind:
				md = fd.MapValue().Message()
			case fd.Kind() == protoreflect.MessageKind && !fd.IsMap():
				md = fd.Message()
			default:
				return "", "", false
			}
		}
		next := md.Fields().ByJSONName(st.key)
		if next == nil {
			next = md.Fields().ByTextName(st.key)
		}
		if next == nil {
			return "", "", false
		}
		if i > 0 {
			name.WriteByte('.')
		}
		name.WriteString(st.key)
		fd, inList, inMap = next, false, false
	}
	if fd == nil {
		return "", "", false
	}
	var want string
	switch {
	case fd.IsMap() && !inMap:
		want = fmt.Sprintf("an object of %s, such as {\"name\": %s}", plural(fd.MapValue()), example(fd.MapValue()))
	case fd.IsMap():
		want = kindName(fd.MapValue())
	case fd.IsList() && !inList:
		want = fmt.Sprintf("a list of %s, such as [%s]", plural(fd), example(fd))
	default:
		want = kindName(fd)
	}
	if n := name.String(); strings.ContainsAny(n, ".[") {
		return "field " + n, want, true
	}
	return fmt.Sprintf("field %q", name.String()), want, true
}

// kindName says what one value of fd is in JSON.
func kindName(fd protoreflect.FieldDescriptor) string {
	switch {
	case fd.Kind() == protoreflect.MessageKind && fd.Message().FullName() == durationName:
		return `a duration, such as "90s"`
	case fd.Kind() == protoreflect.MessageKind && fd.Message().FullName() == "google.protobuf.Timestamp":
		return `a time, such as "2026-01-02T15:04:05Z"`
	case fd.Kind() == protoreflect.MessageKind:
		return "an object ({...})"
	}
	return typeName(fd.Kind().String())
}

// plural is kindName of many.
func plural(fd protoreflect.FieldDescriptor) string {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return "strings"
	case protoreflect.BoolKind:
		return "true or false values"
	case protoreflect.MessageKind:
		if fd.Message().FullName() == durationName {
			return "durations"
		}
		return "objects"
	case protoreflect.EnumKind:
		return "documented names"
	}
	return "numbers"
}

// example is one value of fd in JSON.
func example(fd protoreflect.FieldDescriptor) string {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return `"value"`
	case protoreflect.BoolKind:
		return "true"
	case protoreflect.MessageKind:
		return "{...}"
	case protoreflect.EnumKind:
		return `"NAME"`
	}
	return "1"
}
