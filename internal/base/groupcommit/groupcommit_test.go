package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

func client(t *testing.T) *clientv3.Client {
	t.Helper()
	return etcdtest.Start(t).Client(t)
}

// put is a create-only put of key, as an acquisition's enqueue is.
func put(name, key string, opts ...clientv3.OpOption) Txn {
	return Txn{
		Name:    name,
		Creates: true,
		If:      []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
		Then:    []clientv3.Op{clientv3.OpPut(key, "v", opts...), clientv3.OpGet(key)},
		Else:    []clientv3.Op{clientv3.OpGet(key)},
	}
}

// queued builds a Committer whose loop does not run, with calls queued as
// if they had arrived while a batch was in flight: take and commit then
// run exactly as the loop would.
func queued(cli *clientv3.Client, txns ...Txn) (*Committer, []*call) {
	c := &Committer{cli: cli, wake: make(chan struct{}, 1), done: make(chan struct{})}
	c.stop, c.cancel = context.WithCancel(context.Background())
	var calls []*call
	for _, t := range txns {
		cl := &call{ctx: context.Background(), txn: t, size: size(t), done: make(chan struct{})}
		calls = append(calls, cl)
		c.queueLocked(cl)
	}
	return c, calls
}

// take is takeLocked under the lock, as the loop's next takes it.
func (c *Committer) take() []*call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.takeLocked()
}

func TestABatchIsOneTransactionWithEachCallersOwnAnswer(t *testing.T) {
	cli := client(t)
	if _, err := cli.Put(t.Context(), "taken", "x"); err != nil {
		t.Fatal(err)
	}
	c, calls := queued(cli, put("a", "a/1"), put("b", "taken"), put("c", "c/1"))
	batch := c.take()
	if len(batch) != 3 {
		t.Fatalf("took %d of 3 calls of distinct names", len(batch))
	}
	c.commit(batch)
	rev := int64(0)
	for i, want := range []bool{true, false, true} {
		cl := calls[i]
		if cl.err != nil {
			t.Fatalf("call %d: %v", i, cl.err)
		}
		if cl.resp.Succeeded != want {
			t.Errorf("call %d: succeeded %v, want %v (its own compare)", i, cl.resp.Succeeded, want)
		}
		if got := len(cl.resp.Responses); got != 2 && want || got != 1 && !want {
			t.Errorf("call %d: %d responses, not its own branch's", i, got)
		}
		if i > 0 && cl.resp.Header.Revision != rev {
			t.Errorf("call %d at revision %d, call 0 at %d: not one transaction", i, cl.resp.Header.Revision, rev)
		}
		rev = cl.resp.Header.Revision
	}
	kv := calls[0].resp.Responses[1].GetResponseRange().Kvs
	if len(kv) != 1 || kv[0].CreateRevision != rev {
		t.Errorf("a/1 read back in the batch as %v, want created at %d", kv, rev)
	}
	if b, n := c.Stats(); b != 1 || n != 3 {
		t.Errorf("stats: %d batches, %d transactions; want 1, 3", b, n)
	}
}

// Two mutations of one name never share a batch, so they never share a
// revision: the tokens of one lock stay strictly increasing.
func TestOneTransactionPerNameInABatch(t *testing.T) {
	cli := client(t)
	c, calls := queued(cli, put("lock-a", "a/1"), put("lock-a", "a/2"), put("lock-b", "b/1"), put("lock-a", "a/3"))
	first := c.take()
	if len(first) != 2 || first[0] != calls[0] || first[1] != calls[2] {
		t.Fatalf("first batch: %d calls; want a/1 and b/1", len(first))
	}
	second := c.take()
	if len(second) != 1 || second[0] != calls[1] {
		t.Fatalf("second batch: %d calls; want a/2 alone (arrival order)", len(second))
	}
	third := c.take()
	if len(third) != 1 || third[0] != calls[3] {
		t.Fatalf("third batch: %d calls; want a/3", len(third))
	}
	if rest := c.take(); len(rest) != 0 {
		t.Fatalf("%d calls left over", len(rest))
	}
	// Changes that create nothing (releases) share a batch with one that
	// creates.
	del := func(key string) Txn { return Txn{Name: "lock-a", Then: []clientv3.Op{clientv3.OpDelete(key)}} }
	c, calls = queued(cli, del("a/1"), put("lock-a", "a/4"), del("a/2"), put("lock-a", "a/5"))
	if b := c.take(); len(b) != 3 || b[0] != calls[0] || b[1] != calls[1] || b[2] != calls[2] {
		t.Fatalf("a batch of releases and acquisitions of one name: %d calls; want two releases and one acquisition", len(b))
	}
}

// Under load, many mutations of one name each get a revision of their own
// and the batches really merge transactions of different names.
func TestConcurrentMutationsOfOneNameGetDistinctRevisions(t *testing.T) {
	cli := client(t)
	c := New(cli)
	defer c.Close()
	const names, each = 8, 25
	revs := make([][]int64, names)
	var wg sync.WaitGroup
	errs := make(chan error, names*each)
	for n := range names {
		for i := range each {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := c.Commit(t.Context(), put(fmt.Sprintf("lock-%d", n), fmt.Sprintf("%d/%d", n, i)))
				if err != nil {
					errs <- err
					return
				}
				kv := resp.Responses[1].GetResponseRange().Kvs[0]
				if kv.CreateRevision != resp.Header.Revision {
					errs <- fmt.Errorf("key created at %d, answer at %d", kv.CreateRevision, resp.Header.Revision)
				}
				c.mu.Lock()
				revs[n] = append(revs[n], kv.CreateRevision)
				c.mu.Unlock()
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for n, rs := range revs {
		seen := map[int64]bool{}
		for _, r := range rs {
			if seen[r] {
				t.Fatalf("lock-%d: two keys created at revision %d", n, r)
			}
			seen[r] = true
		}
	}
	batches, txns := c.Stats()
	if txns != names*each {
		t.Fatalf("%d transactions committed, want %d", txns, names*each)
	}
	if batches >= txns {
		t.Errorf("%d batches for %d transactions: nothing was merged", batches, txns)
	}
	t.Logf("%d transactions in %d batches", txns, batches)
}

// An idle committer sends a lone transaction from its caller's goroutine
// at once; what arrives while it is in flight waits and goes as one batch
// after it, at a later revision.
func TestALoneTransactionGoesAtOnceAndWhatQueuesBehindItIsOneBatch(t *testing.T) {
	cli := client(t)
	c := New(cli)
	defer c.Close()
	inFlight, proceed := make(chan struct{}), make(chan struct{})
	c.beforeAlone = func() {
		close(inFlight)
		<-proceed
	}
	first := make(chan *clientv3.TxnResponse, 1)
	go func() {
		resp, err := c.Commit(t.Context(), put("lock-0", "0/1"))
		if err != nil {
			t.Error(err)
		}
		first <- resp
	}()
	select {
	case <-inFlight:
	case <-time.After(wait.Bound(10 * time.Second)):
		t.Fatal("an idle committer's lone transaction was not sent from its caller's goroutine")
	}
	c.beforeAlone = nil // only the committer's own batch follows
	const behind = 3
	resps := make(chan *clientv3.TxnResponse, behind)
	for i := range behind {
		go func() {
			resp, err := c.Commit(t.Context(), put(fmt.Sprint("lock-", i+1), fmt.Sprint(i+1, "/1")))
			if err != nil {
				t.Error(err)
			}
			resps <- resp
		}()
	}
	wait.For(t, "the calls behind the lone one to queue", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.pending) == behind
	})
	close(proceed)
	lone := <-first
	revs := map[int64]bool{}
	for range behind {
		resp := <-resps
		if resp == nil || !resp.Succeeded {
			t.Fatalf("a queued call: %v", resp)
		}
		revs[resp.Header.Revision] = true
	}
	if lone == nil || !lone.Succeeded {
		t.Fatalf("the lone call: %v", lone)
	}
	if len(revs) != 1 {
		t.Errorf("the calls that queued behind the lone one committed at revisions %v: not one batch", revs)
	}
	for rev := range revs {
		if rev <= lone.Header.Revision {
			t.Errorf("the batch at revision %d, not after the lone call's %d", rev, lone.Header.Revision)
		}
	}
	if b, n := c.Stats(); b != 2 || n != behind+1 {
		t.Errorf("stats: %d batches, %d transactions; want 2, %d", b, n, behind+1)
	}
}

// A session (lease) that is gone refuses the whole batch in etcd; only its
// own caller may see that.
func TestOneCallersRefusalIsNotTheOthers(t *testing.T) {
	cli := client(t)
	live, err := cli.Grant(t.Context(), 60)
	if err != nil {
		t.Fatal(err)
	}
	dead, err := cli.Grant(t.Context(), 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(t.Context(), dead.ID); err != nil {
		t.Fatal(err)
	}
	c, calls := queued(cli, put("a", "a/1", clientv3.WithLease(live.ID)), put("b", "b/1", clientv3.WithLease(dead.ID)),
		put("c", "c/1", clientv3.WithLease(live.ID)))
	c.commit(c.take())
	if !errors.Is(calls[1].err, rpctypes.ErrLeaseNotFound) {
		t.Errorf("the call with the revoked lease: %v, want %v", calls[1].err, rpctypes.ErrLeaseNotFound)
	}
	for _, i := range []int{0, 2} {
		if calls[i].err != nil || !calls[i].resp.Succeeded {
			t.Errorf("call %d failed with another's lease: %v", i, calls[i].err)
		}
	}
	resp, err := cli.Get(t.Context(), "b/1")
	if err != nil || len(resp.Kvs) != 0 {
		t.Errorf("b/1 written with a revoked lease: %v %v", resp, err)
	}
}

func TestGivingUpBeforeTheBatchIsSentLeavesNothing(t *testing.T) {
	cli := client(t)
	c, calls := queued(cli, put("a", "a/1"), put("b", "b/1"))
	ctx, cancel := context.WithCancel(context.Background())
	calls[0].ctx = ctx
	cancel()
	batch := c.take()
	if len(batch) != 1 || batch[0] != calls[1] {
		t.Fatalf("took %d calls; want only the one whose caller still waits", len(batch))
	}
	if !errors.Is(calls[0].err, context.Canceled) {
		t.Errorf("the call given up: %v", calls[0].err)
	}
	c.commit(batch)
	resp, err := cli.Get(t.Context(), "a/1")
	if err != nil || len(resp.Kvs) != 0 {
		t.Errorf("a/1 written for a caller that gave up before it was sent: %v %v", resp, err)
	}
}

func TestCloseFailsWhatIsQueued(t *testing.T) {
	cli := client(t)
	c := New(cli)
	if _, err := c.Commit(t.Context(), put("a", "a/1")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := c.Commit(t.Context(), put("b", "b/1")); !errors.Is(err, ErrClosed) {
		t.Errorf("commit after Close: %v, want ErrClosed", err)
	}
	d := Direct(cli)
	if resp, err := d.Commit(t.Context(), put("b", "b/1")); err != nil || !resp.Succeeded {
		t.Errorf("direct commit: %v %v", resp, err)
	}
}

// A batch carries at most MaxBatch transactions; the rest wait, in order.
func TestBatchesAreBounded(t *testing.T) {
	cli := client(t)
	var txns []Txn
	for i := range MaxBatch + 6 {
		txns = append(txns, put(fmt.Sprint("lock-", i), fmt.Sprint("k/", i)))
	}
	c, calls := queued(cli, txns...)
	if b := c.take(); len(b) != MaxBatch || b[0] != calls[0] {
		t.Fatalf("first batch: %d calls, want %d from the first", len(b), MaxBatch)
	}
	if b := c.take(); len(b) != 6 || b[0] != calls[MaxBatch] || b[5] != calls[MaxBatch+5] {
		t.Fatalf("second batch: %d calls, want the 6 left in order", len(b))
	}
}

// Revision follows the newest revision etcd answered with, on every path:
// a lone transaction, a batch, a batch refused and retried one by one,
// and a transaction whose compare failed; it never goes back.
func TestRevisionIsTheNewestAnswered(t *testing.T) {
	cli := client(t)
	ctx := t.Context()
	c := New(cli)
	defer c.Close()
	if c.Revision() != 0 {
		t.Fatalf("revision %d before any answer", c.Revision())
	}
	resp, err := c.Commit(ctx, put("a", "a/1"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Revision() != resp.Header.Revision {
		t.Fatalf("revision %d after a lone transaction answered at %d", c.Revision(), resp.Header.Revision)
	}
	if resp, err = c.Commit(ctx, put("a", "a/1")); err != nil || resp.Succeeded {
		t.Fatalf("a second create of a/1: %v, %v", resp, err)
	}
	if c.Revision() != resp.Header.Revision {
		t.Fatalf("revision %d after a failed compare answered at %d", c.Revision(), resp.Header.Revision)
	}
	// A batch (built as the loop builds it) whose whole is refused, one of
	// its transactions naming a lease that does not exist.
	bc, calls := queued(cli, put("b", "b/1"), put("c", "c/1", clientv3.WithLease(12345)), put("d", "d/1"))
	bc.commit(bc.take())
	newest := int64(0)
	for _, cl := range calls {
		if cl.resp != nil {
			newest = max(newest, cl.resp.Header.Revision)
		}
	}
	if newest == 0 || bc.Revision() != newest {
		t.Fatalf("revision %d after a refused batch retried alone, newest answer %d", bc.Revision(), newest)
	}
	bc.saw(&clientv3.TxnResponse{Header: &etcdserverpb.ResponseHeader{Revision: 1}})
	if bc.Revision() != newest {
		t.Fatalf("revision went back to %d", bc.Revision())
	}
	// A batch that etcd takes whole.
	bc, calls = queued(cli, put("e", "e/1"), put("f", "f/1"))
	bc.commit(bc.take())
	if calls[0].err != nil || bc.Revision() != calls[0].resp.Header.Revision {
		t.Fatalf("revision %d after a batch answered at %v (%v)", bc.Revision(), calls[0].resp, calls[0].err)
	}
}

// A Name with a crowd of creations queued (a crowd joining one lock)
// gives one to each batch, in arrival order, and never holds back other
// Names (each batch also takes theirs) nor its own releases, which go in
// the first batch although a thousand creations arrived before them.
func TestACrowdedNameGivesOneCreationToEachBatch(t *testing.T) {
	var txns []Txn
	for i := range 1000 {
		txns = append(txns, put("crowd", fmt.Sprintf("crowd/%d", i)))
	}
	release := Txn{Name: "crowd", Then: []clientv3.Op{clientv3.OpDelete("crowd/0")}}
	txns = append(txns, release, put("other", "other/1"), put("other", "other/2"))
	c, calls := queued(nil, txns...)
	for b := range 3 {
		batch := c.take()
		want := []*call{calls[b]} // the crowd's next creation
		if b == 0 {
			want = append(want, calls[1000]) // its release, arrived later
		}
		if b < 2 {
			want = append(want, calls[1001+b]) // other's next
		}
		if !slices.Equal(batch, want) {
			t.Fatalf("batch %d: %d calls; want the crowd's creation %d (and its release in the first), and other's next", b, len(batch), b)
		}
	}
	if c.npending != 1003-6 {
		t.Fatalf("%d calls pending; want %d", c.npending, 1003-6)
	}
}

// BenchmarkTakeFromACrowd: a batch's cost does not grow with a crowd
// queued on one Name.
func BenchmarkTakeFromACrowd(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var txns []Txn
			for i := range n {
				txns = append(txns, put("crowd", fmt.Sprintf("crowd/%d", i)))
			}
			c, _ := queued(nil, txns...)
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if len(c.take()) == 0 {
					b.StopTimer()
					c, _ = queued(nil, txns...)
					b.StartTimer()
				}
			}
		})
	}
}

// A batch never holds more than MaxBatch calls, also when a Name's
// creation goes in ahead of its other call that arrived later (the two
// are taken together for the batch's last place).
func TestABatchHoldsAtMostMaxBatchCalls(t *testing.T) {
	var txns []Txn
	for i := range MaxBatch - 1 {
		txns = append(txns, Txn{Name: fmt.Sprintf("n%d", i), Then: []clientv3.Op{clientv3.OpDelete(fmt.Sprintf("n%d/k", i))}})
	}
	txns = append(txns, put("x", "x/1"), Txn{Name: "x", Then: []clientv3.Op{clientv3.OpDelete("x/0")}})
	c, calls := queued(nil, txns...)
	batch := c.take()
	if len(batch) != MaxBatch || batch[MaxBatch-1] != calls[MaxBatch-1] {
		t.Fatalf("took %d calls (the last: x's creation? %v); want %d, x's creation last", len(batch), batch[len(batch)-1] == calls[MaxBatch-1], MaxBatch)
	}
	if next := c.take(); len(next) != 1 || next[0] != calls[MaxBatch] {
		t.Fatalf("the next batch: %d calls; want x's other call", len(next))
	}
}

// While CrowdDepth creations of one Name or more are queued behind a batch
// in flight, batches go without waiting for it (a crowd joining one lock
// shares etcd's fsyncs), each creation still at a revision of its own;
// once fewer are queued, the rest wait for the batch in flight.
func TestACrowdedNamesCreationsGoWithoutWaitingForTheBatchInFlight(t *testing.T) {
	cli := client(t)
	c := New(cli)
	defer c.Close()
	inFlight, proceed := make(chan struct{}), make(chan struct{})
	c.beforeAlone = func() {
		close(inFlight)
		<-proceed
	}
	first := make(chan *clientv3.TxnResponse, 1)
	go func() {
		resp, err := c.Commit(t.Context(), put("crowd", "crowd/0"))
		if err != nil {
			t.Error(err)
		}
		first <- resp
	}()
	select {
	case <-inFlight:
	case <-time.After(wait.Bound(10 * time.Second)):
		t.Fatal("an idle committer's lone transaction was not sent from its caller's goroutine")
	}
	c.beforeAlone = nil
	// The first stays in flight until proceed: the creations queued
	// behind it go while CrowdDepth are queued, so all but CrowdDepth-1.
	const behind = 2 * CrowdDepth
	resps := make(chan *clientv3.TxnResponse, behind)
	for i := range behind {
		go func() {
			resp, err := c.Commit(t.Context(), put("crowd", fmt.Sprint("crowd/", i+1)))
			if err != nil {
				t.Error(err)
			}
			resps <- resp
		}()
	}
	revs := map[int64]bool{}
	collect := func(n int, what string) {
		for range n {
			select {
			case resp := <-resps:
				if resp == nil || !resp.Succeeded || revs[resp.Header.Revision] {
					t.Fatalf("a creation of the crowded name: %v (revisions so far %v)", resp, revs)
				}
				revs[resp.Header.Revision] = true
			case <-time.After(wait.Bound(10 * time.Second)):
				t.Fatalf("%d of %d creations of the crowded name committed %s", len(revs), behind, what)
			}
		}
	}
	collect(behind-(CrowdDepth-1), "while its first was in flight; the rest waited for it")
	wait.For(t, "the creations left to queue behind the first", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.npending == CrowdDepth-1 && c.inflight == 1
	})
	close(proceed)
	if lone := <-first; lone == nil || !lone.Succeeded || revs[lone.Header.Revision] {
		t.Fatalf("the first creation: %v", lone)
	}
	collect(CrowdDepth-1, "in all")
}

// The committer never has more than MaxInFlight batches in flight, and
// only one while no Name has CrowdDepth creations queued.
func TestBatchesInFlightAreBounded(t *testing.T) {
	var txns []Txn
	for i := range CrowdDepth - 1 {
		txns = append(txns, put("crowd", fmt.Sprint("crowd/", i)))
	}
	c, _ := queued(nil, append(txns, put("other", "other/1"))...)
	c.inflight = 1
	if b, ok := c.next(); ok {
		t.Fatalf("a second batch (%d calls) went with %d creations of one name queued", len(b), CrowdDepth-1)
	}
	for i := range MaxInFlight {
		c.mu.Lock()
		c.queueLocked(&call{ctx: context.Background(), txn: put("crowd", fmt.Sprint("crowd/x", i)), done: make(chan struct{})})
		c.mu.Unlock()
	}
	for c.inflight < MaxInFlight {
		if _, ok := c.next(); !ok {
			t.Fatalf("no batch went with %d in flight and a crowd queued", c.inflight)
		}
	}
	if b, ok := c.next(); ok {
		t.Fatalf("a batch of %d calls went with %d batches in flight already", len(b), MaxInFlight)
	}
}
