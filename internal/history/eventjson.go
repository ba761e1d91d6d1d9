package history

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// appendJSON appends e's JSON to b: the encoding encoding/json gives Event
// (the same fields, names and omissions, read back by json.Unmarshal),
// without its reflection and allocations. The recorder encodes every
// event of every grant; this is most of what recording costs it.
func (e *Event) appendJSON(b []byte) []byte {
	b = append(b, '{')
	str := func(name, v string) {
		if v != "" {
			b = append(b, '"')
			b = append(b, name...)
			b = append(b, `":`...)
			b = appendJSONString(b, v)
			b = append(b, ',')
		}
	}
	num := func(name string, v int64, always bool) {
		if v != 0 || always {
			b = append(b, '"')
			b = append(b, name...)
			b = append(b, `":`...)
			b = strconv.AppendInt(b, v, 10)
			b = append(b, ',')
		}
	}
	str("kind", string(e.Kind))
	str("name", e.Name)
	b = append(b, `"type":`...)
	b = appendJSONString(b, string(e.Type))
	b = append(b, ',')
	num("token", e.Token, false)
	str("session", e.Session)
	str("owner", e.Owner)
	str("principal", e.Principal)
	str("hostname", e.Hostname)
	str("request_id", e.RequestID)
	if e.Read {
		b = append(b, `"read":true,`...)
	}
	str("reason", e.Reason)
	num("revision", e.Revision, true)
	num("from_revision", e.FromRevision, false)
	b = append(b, `"time":"`...)
	b = e.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `",`...)
	num("handed_from", e.HandedFrom, false)
	num("waited", int64(e.Waited), false)
	num("held", int64(e.Held), false)
	str("revocation", string(e.Revocation))
	num("revoke_waited", int64(e.RevokeWaited), false)
	b[len(b)-1] = '}' // the last field's comma
	return b
}

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 replaced by U+FFFD (as
// encoding/json does).
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
