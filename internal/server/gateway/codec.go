package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// codec is the REST gateway's JSON: protojson with three changes a shell
// user or a JavaScript client expects.
//   - Every response, error and stream line ends with a newline.
//   - Responses carry every field, also when it is empty: a list with no
//     elements is [], never left out (unset messages stay left out).
//   - Durations in request bodies take Go's syntax as well as protobuf's
//     seconds ("90s", "1.5s"): "1m", "1h30m", "250ms", as query parameters
//     already do.
type codec struct {
	runtime.JSONPb
}

func newCodec() *codec {
	return &codec{runtime.JSONPb{
		MarshalOptions:   protojson.MarshalOptions{EmitDefaultValues: true},
		UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
	}}
}

// Marshal ends the JSON with a newline. An error that ends a stream gets
// the body every REST error has (restError).
func (c *codec) Marshal(v any) ([]byte, error) {
	if b, ok := streamError(v); ok {
		return append(b, '\n'), nil
	}
	b, err := c.JSONPb.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Delimiter is empty: Marshal already ends every stream line.
func (c *codec) Delimiter() []byte { return []byte{} }

// NewDecoder reads one JSON value and rewrites Go-syntax durations in it
// before protojson decodes it.
func (c *codec) NewDecoder(r io.Reader) runtime.Decoder {
	d := json.NewDecoder(r)
	return runtime.DecoderFunc(func(v any) error {
		var raw json.RawMessage
		if err := d.Decode(&raw); err != nil {
			var syntax *json.SyntaxError
			if errors.As(err, &syntax) {
				return fmt.Errorf("the request body is not valid JSON at byte %d: %w", syntax.Offset, err)
			}
			return err
		}
		if _, err := d.Token(); !errors.Is(err, io.EOF) {
			return errors.New("the request body has more after its JSON value: send exactly one JSON object")
		}
		if err := checkDuplicateKeys(raw); err != nil {
			return err
		}
		sent := raw
		if m, ok := v.(proto.Message); ok {
			var err error
			if raw, err = normalizeDurations(raw, m.ProtoReflect().Descriptor()); err != nil {
				return err
			}
		}
		err := c.Unmarshal(raw, v) // JSONPb's: codec does not change decoding
		if m, ok := v.(proto.Message); ok && err != nil {
			if explained := wrongType(sent, raw, m.ProtoReflect().Descriptor(), err); explained != "" {
				return errors.New(explained)
			}
		}
		return err
	})
}

// checkDuplicateKeys refuses a JSON value in which an object names a key
// twice: which one counts would depend on the decoder (protojson refuses
// some, a re-encoding keeps the last).
func checkDuplicateKeys(raw json.RawMessage) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	type frame struct {
		object  bool
		keys    map[string]bool
		wantKey bool
	}
	var stack []*frame
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return nil // a syntax error: the decoder reports it
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.wantKey {
			if k, ok := tok.(string); ok {
				if top.keys[k] {
					return fmt.Errorf("the request body names %q twice in one object", k)
				}
				top.keys[k], top.wantKey = true, false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, keys: map[string]bool{}, wantKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: the enclosing object wants its next key.
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].wantKey = true
		}
	}
}

const durationName = "google.protobuf.Duration"

// normalizeDurations rewrites every Duration field of the JSON object raw
// (a message of type md) that holds a Go duration ("1m") into protobuf's
// form ("60s"). Anything it does not understand is left for protojson to
// refuse with its own message.
func normalizeDurations(raw json.RawMessage, md protoreflect.MessageDescriptor) (json.RawMessage, error) {
	if !hasDuration(md) || !utf8.Valid(raw) {
		// Invalid UTF-8 would be replaced by re-encoding; left as it is,
		// protojson refuses it.
		return raw, nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return raw, nil // protojson reports the syntax error
	}
	if !rewriteMessage(v, md) {
		return raw, nil
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("re-encode request body: %w", err)
	}
	return out, nil
}

// rewriteMessage rewrites durations in v, a decoded JSON object of type md,
// and reports whether it changed anything.
func rewriteMessage(v any, md protoreflect.MessageDescriptor) bool {
	obj, ok := v.(map[string]any)
	if !ok {
		return false
	}
	changed := false
	for k, fv := range obj {
		fd := md.Fields().ByJSONName(k)
		if fd == nil {
			fd = md.Fields().ByTextName(k)
		}
		if fd == nil {
			continue
		}
		switch {
		case fd.IsMap():
			if m, ok := fv.(map[string]any); ok && fd.MapValue().Kind() == protoreflect.MessageKind {
				for mk, mv := range m {
					if nv, ok := rewriteValue(mv, fd.MapValue().Message()); ok {
						m[mk], changed = nv, true
					}
				}
			}
		case fd.IsList():
			if l, ok := fv.([]any); ok && fd.Kind() == protoreflect.MessageKind {
				for i, lv := range l {
					if nv, ok := rewriteValue(lv, fd.Message()); ok {
						l[i], changed = nv, true
					}
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			if nv, ok := rewriteValue(fv, fd.Message()); ok {
				obj[k], changed = nv, true
			}
		}
	}
	return changed
}

// rewriteValue rewrites v of message type md: a Duration in Go's syntax
// ("1m30s") or as a number of seconds (30, "30", "1.5") becomes protobuf's
// form; any other message is walked.
func rewriteValue(v any, md protoreflect.MessageDescriptor) (any, bool) {
	if md.FullName() != durationName {
		return v, rewriteMessage(v, md)
	}
	var s string
	switch t := v.(type) {
	case string:
		s = t
	case json.Number:
		s = t.String()
	default:
		return v, false
	}
	d, ok := parseDuration(s)
	if !ok {
		return v, false
	}
	return protoDuration(d), true
}

// parseDuration reads Go's duration syntax, or a plain number of seconds.
func parseDuration(s string) (time.Duration, bool) {
	if d, err := time.ParseDuration(s); err == nil {
		return d, true
	}
	secs, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(secs) || math.IsInf(secs, 0) || math.Abs(secs) > math.MaxInt64/float64(time.Second) {
		return 0, false
	}
	if strings.ContainsAny(s, "xXpPeE_") || strings.TrimSpace(s) != s {
		return 0, false // only plain decimals: "30", "1.5", "-2"
	}
	return time.Duration(secs * float64(time.Second)), true
}

// protoDuration formats d as protobuf's JSON Duration: seconds with up to
// nine fractional digits and a trailing "s".
func protoDuration(d time.Duration) string {
	sign := ""
	if d < 0 {
		sign, d = "-", -d
	}
	return fmt.Sprintf("%s%d.%09ds", sign, d/time.Second, d%time.Second)
}

var durationFields sync.Map // protoreflect.FullName → bool

// hasDuration reports whether messages of type md can hold a Duration.
func hasDuration(md protoreflect.MessageDescriptor) bool {
	if v, ok := durationFields.Load(md.FullName()); ok {
		return v.(bool)
	}
	has := scanDuration(md, map[protoreflect.FullName]bool{})
	durationFields.Store(md.FullName(), has)
	return has
}

func scanDuration(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if md.FullName() == durationName {
		return true
	}
	if seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsMap() {
			fd = fd.MapValue()
		}
		if fd.Kind() == protoreflect.MessageKind && scanDuration(fd.Message(), seen) {
			return true
		}
	}
	return false
}
