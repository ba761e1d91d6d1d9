package configcenter

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Bounds on schemas and on the work of validating against one. A JSON
// Schema validator may do work exponential in the value's depth (an
// "anyOf" of two branches that each recurse through "$ref" doubles it per
// level) and quadratic in an array's length ("uniqueItems"), so one
// tenant's schema could stall the member for every tenant. coordd refuses
// such a validation before it starts instead of timing it out: the
// validator cannot be stopped once started.
const (
	// MaxSchemaDepth is how deeply a schema document may nest (JSON
	// objects and arrays inside each other), checked when it is set.
	MaxSchemaDepth = 64
	// MaxValidationSteps bounds the work of one validation: the number
	// of (schema, value) pairs the validator may visit, counted before it
	// runs over every branch it could take, plus the pairs "uniqueItems"
	// compares, the values an "enum" is compared with, and the regular
	// expressions' matching (see patternCostUnit). A namespace of 100 keys
	// with a schema of a few keywords each takes a few hundred.
	MaxValidationSteps = 100_000
	// maxCostDepth bounds the count's own recursion: a "$ref" chain that
	// goes deeper without moving into the value never ends in the
	// validator either.
	maxCostDepth = 2_000
	// MaxProblems is how many problems one validation reports; past it
	// one more says how many were left out.
	MaxProblems = 100
	// maxProblemBytes bounds one problem's message.
	maxProblemBytes = 512
)

// errTooComplex is why a validation was refused before it ran.
var errTooComplex = errors.New("too complex")

// checkSchemaLimits refuses, when a schema is set, what the bounds above
// cannot count: nesting deeper than MaxSchemaDepth, and "$dynamicRef" and
// "$recursiveRef", whose targets depend on the path the validator took.
func checkSchemaLimits(text string) error {
	dec := json.NewDecoder(strings.NewReader(text))
	depth := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: schema is not JSON: %s", ErrInvalid, err.Error())
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if depth++; depth > MaxSchemaDepth {
				return fmt.Errorf("%w: schema nests deeper than %d levels", ErrInvalid, MaxSchemaDepth)
			}
		case json.Delim('}'), json.Delim(']'):
			depth--
		case "$dynamicRef", "$recursiveRef":
			// A key (or a string value, which refusing costs nothing).
			return fmt.Errorf("%w: schema uses %s, which coordd does not accept: use $ref", ErrInvalid, tok)
		}
	}
}

// checkValidationCost counts, up to limit, the steps validating doc
// against sch could take: every (schema, value) pair reachable through
// every applicator, whichever branch would pass, so it is an upper bound
// on the validator's visits. It fails with errTooComplex past limit.
func checkValidationCost(sch *jsonschema.Schema, doc any, limit int) (steps int, err error) {
	c := costCounter{limit: limit}
	err = c.visit(sch, doc, 0)
	return c.steps, err
}

type costCounter struct {
	steps, limit int
}

func (c *costCounter) add(n int) error {
	c.steps += n
	if c.steps > c.limit {
		return errTooComplex
	}
	return nil
}

func (c *costCounter) visit(s *jsonschema.Schema, v any, depth int) error {
	if s == nil {
		return nil
	}
	if depth > maxCostDepth {
		return errTooComplex
	}
	if err := c.add(1); err != nil {
		return err
	}
	if s.Enum != nil {
		if err := c.add(len(s.Enum.Values)); err != nil {
			return err
		}
	}
	var dynamic *jsonschema.Schema
	if s.DynamicRef != nil {
		dynamic = s.DynamicRef.Ref
	}
	for _, subs := range [][]*jsonschema.Schema{{s.Ref, s.RecursiveRef, dynamic, s.Not, s.If, s.Then, s.Else, s.ContentSchema}, s.AllOf, s.AnyOf, s.OneOf} {
		if err := c.visitAll(subs, v, depth); err != nil {
			return err
		}
	}
	switch v := v.(type) {
	case map[string]any:
		return c.visitObject(s, v, depth)
	case []any:
		return c.visitArray(s, v, depth)
	case string:
		if s.Pattern != nil {
			return c.add(patternCost(s.Pattern, len(v)))
		}
	}
	return nil
}

func (c *costCounter) visitObject(s *jsonschema.Schema, v map[string]any, depth int) error {
	for k, child := range v {
		// A property's name is validated as a string of its own.
		if err := c.visit(s.PropertyNames, k, depth+1); err != nil {
			return err
		}
		if err := c.visitAll([]*jsonschema.Schema{s.Properties[k], s.UnevaluatedProperties, schemaOf(s.AdditionalProperties)}, child, depth); err != nil {
			return err
		}
		for re, sub := range s.PatternProperties {
			if err := c.add(patternCost(re, len(k))); err != nil {
				return err
			}
			if re.MatchString(k) {
				if err := c.visit(sub, child, depth+1); err != nil {
					return err
				}
			}
		}
	}
	for k, sub := range s.DependentSchemas {
		if _, ok := v[k]; ok {
			if err := c.visit(sub, v, depth+1); err != nil {
				return err
			}
		}
	}
	for k, dep := range s.Dependencies {
		if _, ok := v[k]; ok {
			if err := c.visit(schemaOf(dep), v, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *costCounter) visitArray(s *jsonschema.Schema, v []any, depth int) error {
	if s.UniqueItems {
		if err := c.add(len(v) * (len(v) - 1) / 2); err != nil {
			return err
		}
	}
	prefix := s.PrefixItems
	if items, ok := s.Items.([]*jsonschema.Schema); ok {
		prefix = items
	}
	for i, child := range v {
		positional := schemaOf(s.AdditionalItems)
		if i < len(prefix) {
			positional = prefix[i]
		}
		if err := c.visitAll([]*jsonschema.Schema{s.Items2020, schemaOf(s.Items), s.Contains, s.UnevaluatedItems, positional}, child, depth); err != nil {
			return err
		}
	}
	return nil
}

// visitAll visits each of subs (nil ones cost nothing) on v, one level
// deeper than depth.
func (c *costCounter) visitAll(subs []*jsonschema.Schema, v any, depth int) error {
	for _, sub := range subs {
		if err := c.visit(sub, v, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// schemaOf is the schema of a keyword that may also hold a bool or a list.
func schemaOf(v any) *jsonschema.Schema {
	s, _ := v.(*jsonschema.Schema)
	return s
}
