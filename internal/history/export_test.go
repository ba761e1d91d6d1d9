package history

import "time"

// StartFromNow switches off resuming from the cursor: r starts at the
// current revision, as a recorder without a cursor would (tests check
// that the history then misses what happened while none recorded).
func StartFromNow(r *Recorder) { r.fromNow = true }

// SetNow replaces r's clock.
func SetNow(r *Recorder, now func() time.Time) { r.now = now }

// SetBatchEvents bounds the events of one batch (one transaction).
func SetBatchEvents(r *Recorder, n int) { r.batch.events = n }

// SetBatchBytes bounds the stored bytes of one batch (0: no bound).
func SetBatchBytes(r *Recorder, n int) { r.batch.bytes = n }

// WriteUncompressed has r write its batches as plain JSON, as events that
// do not compress would take (and as batches were written before
// compression).
func WriteUncompressed(r *Recorder) { r.plain = true }

// DecodesFlat reports whether the recorder decodes a queue entry's or a
// seat's value without encoding/json.
func DecodesFlat(value []byte) bool {
	_, ok := decodeEntryFlat(value)
	return ok
}
