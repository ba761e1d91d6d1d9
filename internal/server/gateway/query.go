package gateway

import (
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// durationQueryParser is grpc-gateway's query parser, with Duration
// parameters also taking a plain number of seconds ("?wait=30"), as
// request bodies do.
type durationQueryParser struct{ runtime.DefaultQueryParser }

func (p *durationQueryParser) Parse(msg proto.Message, values url.Values, filter *utilities.DoubleArray) error {
	md := msg.ProtoReflect().Descriptor()
	var rewritten url.Values
	for key, vs := range values {
		if !isDurationPath(md, key) {
			continue
		}
		for i, v := range vs {
			if _, err := time.ParseDuration(v); err == nil {
				continue
			}
			if d, ok := parseDuration(v); ok {
				if rewritten == nil {
					rewritten = cloneValues(values)
				}
				rewritten[key][i] = d.String()
			}
		}
	}
	if rewritten != nil {
		values = rewritten
	}
	return p.DefaultQueryParser.Parse(msg, values, filter)
}

func cloneValues(v url.Values) url.Values {
	out := make(url.Values, len(v))
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}

// isDurationPath reports whether the query parameter path (a field, or
// fields joined by dots, by JSON or proto name) of md names a Duration.
func isDurationPath(md protoreflect.MessageDescriptor, path string) bool {
	for name := range strings.SplitSeq(path, ".") {
		if md == nil {
			return false
		}
		fd := md.Fields().ByJSONName(name)
		if fd == nil {
			fd = md.Fields().ByTextName(name)
		}
		if fd == nil || fd.Kind() != protoreflect.MessageKind || fd.IsMap() {
			return false
		}
		md = fd.Message()
	}
	return md != nil && md.FullName() == durationName
}

var installQueryParser sync.Once

// useDurationQueryParser makes grpc-gateway parse query parameters with
// durationQueryParser. grpc-gateway keeps its query parser in a package
// variable that its mux option sets; it is set once, before the first
// mux is made, so that muxes made later (and their requests) only read it.
func useDurationQueryParser() {
	installQueryParser.Do(func() { runtime.NewServeMux(runtime.SetQueryParameterParser(&durationQueryParser{})) })
}
