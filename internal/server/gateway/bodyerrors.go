package gateway

import (
	"fmt"
	"regexp"
	"strings"
)

// The request decoder's messages (protojson's, and encoding/json's) name
// protobuf and Go. requestError says the same in terms of the request a
// REST caller wrote; a message it does not know keeps its text, without
// the "proto:" prefix.
var (
	reProto       = regexp.MustCompile(`^proto:[\s\x{00a0}]+`)
	reAt          = regexp.MustCompile(`\(line (\d+):(\d+)\)`)
	reLeadingAt   = regexp.MustCompile(`^\(line (\d+):(\d+)\): (.*)$`)
	reUnknown     = regexp.MustCompile(`^\(line (\d+):(\d+)\): unknown field "([^"]*)"$`)
	reSyntax      = regexp.MustCompile(`^syntax error \(line (\d+):(\d+)\): unexpected token (.*)$`)
	reFieldValue  = regexp.MustCompile(`^\(line (\d+):(\d+)\): invalid value for (\w+) field (\w+): (.*)$`)
	reTypeValue   = regexp.MustCompile(`^\(line (\d+):(\d+)\): invalid value for (\w+) type: (.*)$`)
	reWellKnown   = regexp.MustCompile(`^\(line (\d+):(\d+)\): invalid google\.protobuf\.(\w+) value (.*)$`)
	reQuery       = regexp.MustCompile(`^parsing field "([^"]*)": (.*)$`)
	reDuplicate   = regexp.MustCompile(`^\(line (\d+):(\d+)\): duplicate field "([^"]*)"$`)
	jsonTypeNames = map[string]string{
		"string": "a string", "bool": "true or false", "bytes": "base64 text",
		"int32": "a whole number", "int64": "a whole number (as a number or a string)",
		"uint32": "a whole number", "uint64": "a whole number (as a number or a string)",
		"float": "a number", "double": "a number", "enum": "one of the documented names",
	}
)

func requestError(msg string) string {
	// protobuf-go writes "proto:" and then a space or, at random, a
	// no-break space (to keep callers from matching its messages, which is
	// what this does; the tests hold it to the current wording).
	msg = reProto.ReplaceAllString(msg, "")
	at := func(line, col string) string { return fmt.Sprintf("(line %s, column %s)", line, col) }
	switch msg {
	case "unexpected EOF":
		return "the request body ends before its JSON value does: was it cut short?"
	case "EOF":
		return "the request body is empty: send a JSON object ({} when no field is needed)"
	}
	if m := reQuery.FindStringSubmatch(msg); m != nil {
		what := strings.TrimPrefix(m[2], "time: ")
		if strings.HasPrefix(m[2], "time: invalid duration") {
			what = strings.TrimPrefix(what, "invalid duration ") + ` is not a duration: write "90s", "1m30s", "250ms" or a number of seconds`
		}
		return fmt.Sprintf("query parameter %q: %s", m[1], what)
	}
	if m := reSyntax.FindStringSubmatch(msg); m != nil {
		if m[1] == "1" && m[2] == "1" && strings.HasPrefix(m[3], "[") {
			return "the request body must be a JSON object ({...}), not an array"
		}
		return fmt.Sprintf("the request body is not valid JSON %s: unexpected %s", at(m[1], m[2]), m[3])
	}
	if m := reUnknown.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("the request body has no field %q %s; /openapi.json lists each request's fields", m[3], at(m[1], m[2]))
	}
	if m := reDuplicate.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("the request body names field %q twice %s", m[3], at(m[1], m[2]))
	}
	if m := reWellKnown.FindStringSubmatch(msg); m != nil {
		switch m[3] {
		case "Duration":
			return fmt.Sprintf("%s is not a duration %s: write \"90s\", \"1m30s\", \"250ms\" or a number of seconds", m[4], at(m[1], m[2]))
		case "Timestamp":
			return fmt.Sprintf("%s is not a time %s: write RFC 3339, such as \"2026-01-02T15:04:05Z\"", m[4], at(m[1], m[2]))
		}
		return fmt.Sprintf("%s is not a valid %s %s", m[4], strings.ToLower(m[3]), at(m[1], m[2]))
	}
	if m := reFieldValue.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("field %q takes %s, not %s %s", m[4], typeName(m[3]), m[5], at(m[1], m[2]))
	}
	if m := reTypeValue.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("a value here must be %s, not %s %s", typeName(m[3]), m[4], at(m[1], m[2]))
	}
	if m := reLeadingAt.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("%s %s", m[3], at(m[1], m[2]))
	}
	return reAt.ReplaceAllString(msg, "(line $1, column $2)")
}

func typeName(protoType string) string {
	if n, ok := jsonTypeNames[protoType]; ok {
		return n
	}
	return protoType
}
