package auth

import (
	"encoding/json"
	"io"
	"sync"
	"time"
)

// Record is one line of the audit log: a call that changed something, or
// any call that was refused.
type Record struct {
	Time      time.Time `json:"time"`
	Principal string    `json:"principal"` // "" for a caller without an identity
	Source    string    `json:"source"`    // the client's address
	RPC       string    `json:"rpc"`       // e.g. /coordd.v1.LockService/Acquire
	Action    Action    `json:"action"`
	Resources []string  `json:"resources,omitempty"` // kind:name, e.g. lock:payments/ledger
	Result    string    `json:"result"`              // OK, or the gRPC code
	Reason    string    `json:"reason,omitempty"`    // why it failed or was refused
	RequestID string    `json:"request_id,omitempty"`
}

// Audit writes records as JSON lines, one Write per record, so that lines
// never interleave. A nil *Audit writes nothing.
type Audit struct {
	mu sync.Mutex
	w  io.Writer
}

// NewAudit returns an Audit writing to w.
func NewAudit(w io.Writer) *Audit { return &Audit{w: w} }

// Write appends r. A failed write is returned for the caller to log; the
// call it describes is not failed for it.
func (a *Audit) Write(r Record) error {
	if a == nil {
		return nil
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	a.mu.Lock()
	defer a.mu.Unlock()
	_, err = a.w.Write(b)
	return err
}

// Mutates reports whether an action changes state, so that every call
// taking it is audited (refused calls are audited whatever their action).
func Mutates(a Action) bool {
	switch a {
	case LockAcquire, LockRelease, ElectionCampaign, ConfigWrite, ConfigAdmin, ConfigPropose, ConfigApprove, KVFenced, ClusterAdmin:
		return true
	}
	return false
}
