package api

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Encoded is a message marshaled once, to be sent as it is on many streams
// (one release to K watchers): the server codec passes its bytes through
// instead of marshaling K times. The bytes are shared and never modified.
type Encoded struct{ data []byte }

// Encode marshals m once.
func Encode(m proto.Message) (*Encoded, error) {
	data, err := proto.Marshal(m)
	if err != nil {
		return nil, err
	}
	return &Encoded{data: data}, nil
}

// Codec is the daemon's server codec: protobuf, plus *Encoded passed
// through. Install it with grpc.ForceServerCodecV2.
func Codec() encoding.CodecV2 { return codec{base: encoding.GetCodecV2("proto")} }

type codec struct{ base encoding.CodecV2 }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(*Encoded); ok {
		// A SliceBuffer's Free does nothing, so the shared bytes are never
		// returned to a pool.
		return mem.BufferSlice{mem.SliceBuffer(e.data)}, nil
	}
	return c.base.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error { return c.base.Unmarshal(data, v) }

func (c codec) Name() string { return c.base.Name() }
