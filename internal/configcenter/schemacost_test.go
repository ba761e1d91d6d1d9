package configcenter_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/coordd/coordd/internal/configcenter"
)

// nested is a JSON array nested depth levels deep around a 1.
func nested(depth int) string {
	return strings.Repeat("[", depth) + "1" + strings.Repeat("]", depth)
}

// One tenant's schema cannot stall the member: a validation whose work
// could explode (anyOf over a recursive $ref, each level doubling it;
// uniqueItems over a long array) is refused before it runs, with a clear
// error and nothing written, while the same shapes at a sane size pass;
// schemas nested too deep or using $dynamicRef are refused when set; and
// a validation with thousands of problems reports a bounded list.
//
// Without the bound, the anyOf schema with a 24-deep value would take
// minutes and tens of GiB in the validator (20 deep: 26 s, 6.3 GiB).
func TestSchemaValidationIsBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	ctx := t.Context()
	bomb := `{"type":"object","additionalProperties":{"$ref":"#/$defs/n"},
	  "$defs":{"n":{"anyOf":[{"type":"array","items":{"$ref":"#/$defs/n"}},{"type":"array","items":{"$ref":"#/$defs/n"}},{"type":"integer"}]}}}`
	if _, err := e.s.SetSchema(ctx, "bomb", bomb); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Put(ctx, "bomb", "shallow", nested(6), 0, "", ""); err != nil {
		t.Fatalf("a 6-deep value under the anyOf schema: %v", err)
	}
	before := e.rev(t)
	_, err := e.s.Put(ctx, "bomb", "deep", nested(24), 0, "", "")
	if !errors.Is(err, configcenter.ErrInvalid) || !strings.Contains(err.Error(), "more than 100000 steps") {
		t.Fatalf("a 24-deep value under the anyOf schema: %v; want it refused as too complex", err)
	}

	if e.rev(t) != before {
		t.Fatal("a refused validation wrote something")
	}

	unique := `{"type":"object","properties":{"ids":{"type":"array","uniqueItems":true}}}`
	if _, err := e.s.SetSchema(ctx, "unique", unique); err != nil {
		t.Fatal(err)
	}
	ids := func(n int) string {
		s := make([]string, n)
		for i := range s {
			s[i] = fmt.Sprint(i)
		}
		return "[" + strings.Join(s, ",") + "]"
	}
	if _, err := e.s.Put(ctx, "unique", "ids", ids(100), 0, "", ""); err != nil {
		t.Fatalf("100 unique items: %v", err)
	}
	before = e.rev(t)
	if _, err := e.s.Put(ctx, "unique", "ids", ids(30_000), 0, "", ""); !errors.Is(err, configcenter.ErrInvalid) || !strings.Contains(err.Error(), "uniqueItems") {
		t.Fatalf("30,000 items under uniqueItems: %v; want it refused as too complex", err)
	}
	if e.rev(t) != before {
		t.Fatal("a refused validation wrote something")
	}

	// A deep tree whose schema does not branch is linear: it passes.
	tree := `{"type":"object","additionalProperties":{"$ref":"#/$defs/n"},"$defs":{"n":{"type":["array","integer"],"items":{"$ref":"#/$defs/n"}}}}`
	if _, err := e.s.SetSchema(ctx, "tree", tree); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Put(ctx, "tree", "deep", nested(500), 0, "", ""); err != nil {
		t.Fatalf("a 500-deep value under a schema that does not branch: %v", err)
	}

	// Set-time limits.
	deep := strings.Repeat(`{"not":`, configcenter.MaxSchemaDepth) + `{}` + strings.Repeat("}", configcenter.MaxSchemaDepth)
	if _, err := e.s.SetSchema(ctx, "limits", deep); !errors.Is(err, configcenter.ErrInvalid) || !strings.Contains(err.Error(), "deeper than 64") {
		t.Errorf("a schema nested %d deep: %v; want it refused", configcenter.MaxSchemaDepth+1, err)
	}
	if _, err := e.s.SetSchema(ctx, "limits", `{"$dynamicAnchor":"n","items":{"$dynamicRef":"#n"}}`); !errors.Is(err, configcenter.ErrInvalid) || !strings.Contains(err.Error(), "$dynamicRef") {
		t.Errorf("a schema with $dynamicRef: %v; want it refused", err)
	}

	// Thousands of problems: the first MaxProblems and a count of the rest.
	if _, err := e.s.SetSchema(ctx, "many", `{"type":"object","additionalProperties":{"type":"array","items":{"type":"string"}}}`); err != nil {
		t.Fatal(err)
	}
	_, err = e.s.Put(ctx, "many", "list", ids(5_000), 0, "", "")
	var ve *configcenter.ValidationError
	if !errors.As(err, &ve) || !errors.Is(err, configcenter.ErrValidation) {
		t.Fatalf("5,000 wrong items: %v; want a validation error", err)
	}
	if p := ve.Problems(); len(p) != configcenter.MaxProblems+1 || !strings.Contains(p[len(p)-1].Message, "and 4900 more problems") {
		t.Errorf("5,000 wrong items: %d problems, last %+v; want %d and a count of the rest", len(p), p[len(p)-1], configcenter.MaxProblems+1)
	}
}

// A schema's regular expressions cost their program's size times the
// text's length (RE2 is linear, with that factor): a pattern whose program
// is too large is refused when the schema is set; matching is charged to
// the validation's steps, so a large pattern on a long value, or on a long
// property name, is refused before it runs, and nothing is written, while
// ordinary patterns on ordinary values pass. Without the charge the 48 KB
// value below would be matched (0.6 CPU-seconds, as much again on every
// later release of the namespace) and fail as not matching instead.
func TestSchemaPatternsAreCharged(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	ctx := t.Context()
	_, err := e.s.SetSchema(ctx, "rx", `{"additionalProperties":{"pattern":"(?:a?){999}a{999}!x"}}`)
	if !errors.Is(err, configcenter.ErrInvalid) || !strings.Contains(err.Error(), "instructions") {
		t.Fatalf("a 3,001-instruction pattern: %v; want it refused when set", err)
	}
	if _, err := e.s.SetSchema(ctx, "rx", `{"additionalProperties":{"pattern":"(?:a?){600}a{600}!x"}}`); err != nil {
		t.Fatalf("a 1,804-instruction pattern: %v", err)
	}
	long := strings.Repeat("a", 48<<10)
	before := e.rev(t)
	if _, err := e.s.Put(ctx, "rx", "k", long, 0, "", ""); !errors.Is(err, configcenter.ErrInvalid) || !strings.Contains(err.Error(), "steps") {
		t.Fatalf("a 48 KB value under a 1,804-instruction pattern: %v; want it refused as too complex", err)
	}
	if e.rev(t) != before {
		t.Fatal("a refused validation wrote something")
	}
	if _, err := e.s.Put(ctx, "rx", "k", strings.Repeat("a", 600)+"!x", 0, "", ""); err != nil {
		t.Fatalf("a short matching value: %v", err)
	}

	// Property names are matched too (each 252-byte key costs about
	// 28,000 steps here): the namespace's keys add up.
	if _, err := e.s.SetSchema(ctx, "names", `{"patternProperties":{"(?:b?){600}b{600}!y":{"type":"string"}}}`); err != nil {
		t.Fatal(err)
	}
	refused := -1
	for i := range 20 {
		before = e.rev(t)
		_, err := e.s.Put(ctx, "names", fmt.Sprintf("%s%02d", strings.Repeat("b", 250), i), "v", 0, "", "")
		if err != nil {
			if !errors.Is(err, configcenter.ErrInvalid) || !strings.Contains(err.Error(), "steps") || e.rev(t) != before {
				t.Fatalf("key %d under a 1,804-instruction patternProperties: %v; want it refused as too complex, nothing written", i, err)
			}
			refused = i
			break
		}
	}
	if refused != 3 {
		t.Fatalf("the key refused was number %d, want the 4th (each costs about 28,000 of the 100,000 steps)", refused)
	}

	// An ordinary pattern on a long value passes.
	if _, err := e.s.SetSchema(ctx, "plain", `{"properties":{"mail":{"type":"string","pattern":"^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}$"},"blob":{"type":"string","pattern":"^[a-z]*$"}}}`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Put(ctx, "plain", "mail", "ops@example.com", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Put(ctx, "plain", "blob", strings.Repeat("z", 200<<10), 0, "", ""); err != nil {
		t.Fatalf("a 200 KB value under a 6-instruction pattern: %v", err)
	}
}
