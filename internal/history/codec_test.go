package history

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
)

func TestBatchEncoding(t *testing.T) {
	evs := []Event{
		{Kind: Lock, Name: "a", Type: Granted, Token: 7, Owner: strings.Repeat("o", 100), Revision: 7, Time: time.Unix(1, 2).UTC()},
		{Kind: Lock, Name: "a", Type: Released, Token: 7, Reason: "released", Revision: 9, Time: time.Unix(3, 4).UTC()},
	}
	arr, err := json.Marshal(evs)
	if err != nil {
		t.Fatal(err)
	}
	packed := encodeBatch(nil, arr)
	if len(packed) >= len(arr) {
		t.Fatalf("encoded to %d bytes from %d", len(packed), len(arr))
	}
	for _, v := range [][]byte{packed, arr} { // compressed, and as written before
		got, err := decodeBatch(v)
		if err != nil {
			t.Fatal(err)
		}
		if g, _ := json.Marshal(got); !bytes.Equal(g, arr) {
			t.Fatalf("decoded %s, want %s", g, arr)
		}
	}
	// A value that claims more than any batch holds is not decompressed.
	bomb := append([]byte{s2Tag}, s2.Encode(nil, bytes.Repeat([]byte{' '}, maxBatchJSON+1))...)
	if _, err := decodeBatch(bomb); err == nil || !strings.Contains(err.Error(), "over") {
		t.Fatalf("decoding a %d-byte claim: %v, want refused", maxBatchJSON+1, err)
	}
	if _, err := decodeBatch([]byte{s2Tag, 0xff}); err == nil {
		t.Fatal("a corrupt value decoded")
	}
}
