package fencing_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/coordd/coordd/fencing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestGuardRejectsLowerTokens(t *testing.T) {
	var g fencing.Guard
	steps := []struct {
		resource string
		token    fencing.Token
		want     error
	}{
		{"db", 5, nil},
		{"db", 5, nil}, // the same grant writes again
		{"db", 9, nil},
		{"db", 7, fencing.ErrStale}, // the old holder, late
		{"db", 5, fencing.ErrStale},
		{"cache", 7, nil}, // resources are independent
		{"db", 0, fencing.ErrInvalid},
		{"db", -3, fencing.ErrInvalid},
		{"db", 12, nil},
	}
	for i, s := range steps {
		if err := g.Check(s.resource, s.token); !errors.Is(err, s.want) || (s.want == nil && err != nil) {
			t.Fatalf("step %d: Check(%s, %d) = %v, want %v", i, s.resource, s.token, err, s.want)
		}
	}
	if h := g.Highest("db"); h != 12 {
		t.Fatalf("Highest(db) = %d, want 12", h)
	}
}

func TestGuardDoRecordsOnlySuccessfulWrites(t *testing.T) {
	var g fencing.Guard
	boom := errors.New("disk full")
	if err := g.Do("r", 10, func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want the write's error", err)
	}
	if h := g.Highest("r"); h != 0 {
		t.Fatalf("a failed write recorded token %d", h)
	}
	ran := false
	if err := g.Do("r", 3, func() error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("Do = %v, ran = %v", err, ran)
	}
}

// Many writers with random tokens: the sequence of accepted writes, as the
// resource sees it, never goes down.
func TestGuardConcurrentWritesStayOrdered(t *testing.T) {
	var g fencing.Guard
	var mu sync.Mutex
	var applied []fencing.Token
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range 500 {
				tok := fencing.Token(r.IntN(1000) + 1)
				err := g.Do("res", tok, func() error {
					mu.Lock()
					applied = append(applied, tok)
					mu.Unlock()
					return nil
				})
				if err != nil && !errors.Is(err, fencing.ErrStale) {
					t.Errorf("Do: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	for i := 1; i < len(applied); i++ {
		if applied[i] < applied[i-1] {
			t.Fatalf("write %d applied token %d after %d", i, applied[i], applied[i-1])
		}
	}
	if len(applied) == 0 {
		t.Fatal("no write was accepted")
	}
}

func TestParse(t *testing.T) {
	for _, bad := range []string{"", "0", "-1", "x", "1.5", "99999999999999999999"} {
		if _, err := fencing.Parse(bad); !errors.Is(err, fencing.ErrInvalid) {
			t.Errorf("Parse(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	if tok, err := fencing.Parse("42"); err != nil || tok != 42 || tok.String() != "42" {
		t.Fatalf("Parse(42) = %v, %v", tok, err)
	}
}

func TestMiddleware(t *testing.T) {
	var g fencing.Guard
	writes := 0
	h := fencing.Middleware(&g, func(r *http.Request) string { return r.URL.Path }, http.HandlerFunc(func(_ http.ResponseWriter, _ *http.Request) {
		writes++
	}))
	send := func(path, token string) int {
		r := httptest.NewRequest("PUT", path, nil)
		if token != "" {
			r.Header.Set(fencing.Header, token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	steps := []struct {
		path, token string
		want        int
	}{
		{"/a", "7", 200},
		{"/a", "6", 409},
		{"/a", "", 400},
		{"/a", "zz", 400},
		{"/b", "1", 200},
		{"/a", "8", 200},
	}
	for i, s := range steps {
		if got := send(s.path, s.token); got != s.want {
			t.Fatalf("step %d: %s with token %q = %d, want %d", i, s.path, s.token, got, s.want)
		}
	}
	if writes != 3 {
		t.Fatalf("handler ran %d times, want 3 (rejected requests must not reach it)", writes)
	}
}

func ExampleGuard_Do() {
	var g fencing.Guard
	// A holder whose lock was granted at token 41 writes; then a newer
	// holder (token 57) writes; then the first holder, resumed from a long
	// pause, tries again and is refused.
	_ = g.Do("orders-table", 41, func() error { return nil })
	_ = g.Do("orders-table", 57, func() error { return nil })
	err := g.Do("orders-table", 41, func() error { return nil })
	fmt.Println(errors.Is(err, fencing.ErrStale))
	// Output: true
}

func TestTokenJSON(t *testing.T) {
	b, err := json.Marshal(struct{ T fencing.Token }{42})
	if err != nil || string(b) != `{"T":"42"}` {
		t.Fatalf("Marshal = %s, %v", b, err)
	}
	var v struct{ T fencing.Token }
	if err := json.Unmarshal([]byte(`{"T":"43"}`), &v); err != nil || v.T != 43 {
		t.Fatalf("Unmarshal = %v, %v", v, err)
	}
	if err := json.Unmarshal([]byte(`{"T":"0"}`), &v); err == nil {
		t.Fatal("a zero token was accepted")
	}
}
