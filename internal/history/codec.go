package history

import (
	"encoding/json"
	"fmt"

	"github.com/klauspost/compress/s2"
)

// A batch's value is its events' JSON array compressed as one S2 block
// (Snappy's format, extended), after a one-byte tag. JSON of events is
// repetitive (field names, owners, hosts, reasons): a batch of a thousand
// lock events shrinks about 6 times, at about a tenth of a microsecond an
// event; zstd shrinks it 15 times at three times the CPU, which the
// recording member pays on every grant. Batches written before
// compression (a plain JSON array, starting with '[') are read as they
// are.

// s2Tag starts a compressed batch: no JSON text starts with it.
const s2Tag = 0x01

// maxBatchJSON bounds a batch's decompressed size: a batch holds at most
// 4,000 events (defaultBatch.events) of at most about 2 KB each; a value
// that claims far more is not one of them, and is not decompressed.
const maxBatchJSON = 16 << 20

// encodeBatch encodes the batch whose JSON array is arr into buf (grown if
// too small) and returns the encoding, which lives in buf.
func encodeBatch(buf, arr []byte) []byte {
	need := 1 + s2.MaxEncodedLen(len(arr))
	if cap(buf) < need {
		buf = make([]byte, need)
	}
	buf = buf[:need]
	buf[0] = s2Tag
	return buf[:1+len(s2.Encode(buf[1:], arr))]
}

// decodeBatch reads a stored batch's events.
func decodeBatch(value []byte) ([]Event, error) {
	if len(value) > 0 && value[0] == s2Tag {
		n, err := s2.DecodedLen(value[1:])
		if err == nil && n > maxBatchJSON {
			err = fmt.Errorf("%d bytes decompressed, over %d", n, maxBatchJSON)
		}
		var raw []byte
		if err == nil {
			raw, err = s2.Decode(nil, value[1:])
		}
		if err != nil {
			return nil, fmt.Errorf("history: decompress batch: %w", err)
		}
		value = raw
	}
	var evs []Event
	if err := json.Unmarshal(value, &evs); err != nil {
		return nil, fmt.Errorf("history: decode batch: %w", err)
	}
	return evs, nil
}
