package configcenter_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/coordd/coordd/configcenter"
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
