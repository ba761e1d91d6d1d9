package configcenter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/coordd/coordd/internal/shared/configvalue"
)

// A namespace's JSON Schema validates the namespace as one JSON object:
// each key is a property whose value is the key's value read by
// configvalue's rule (JSON text is that JSON value; other text is a string
// of itself). So a schema can require keys ("required"), type them
// ("properties"), and forbid unknown ones ("additionalProperties": false).

// schemaURL names the one resource a compiler sees.
const schemaURL = "coordd:///namespace-schema.json"

// noLoader refuses every "$ref" outside the schema: a schema may not make
// the daemon read files or fetch URLs.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("schema references %q: only references inside the schema are allowed", url)
}

// compileSchema parses and compiles a schema document.
func compileSchema(text string) (*jsonschema.Schema, error) {
	if err := validateSize("schema", text, MaxSchemaBytes); err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("%w: schema is not JSON: %s", ErrInvalid, err.Error())
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	c.UseRegexpEngine(compileBoundedRegexp)
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, fmt.Errorf("%w: schema: %s", ErrInvalid, err.Error())
	}
	sch, err := c.Compile(schemaURL)
	if err != nil {
		return nil, fmt.Errorf("%w: schema does not compile: %s", ErrInvalid, err.Error())
	}
	return sch, nil
}

// validateContent checks content against sch and returns every problem as
// a ValidationError of kind ErrValidation. A problem with a key in secret
// does not say what its value is.
// heavyValidationSteps is the validation cost (see checkValidationCost)
// above which a validation waits for one of heavyValidations' places: a
// tenth of the budget, some 5 ms of CPU or more.
const heavyValidationSteps = MaxValidationSteps / 10

// heavyValidations bounds the CPU that costly validations take in this
// process: a quarter of the CPUs (at least one place), each place idle
// after a validation three times as long as the validation ran, so that
// however many principals send releases that cost their whole budget at
// once, at most a sixteenth of the CPUs (a quarter of one CPU on two, one
// place) goes to them and the rest, garbage collection included, stays
// with everyone else's calls. (With a rest as long as the run, half a CPU
// of two, the other tenant's p99 in the schema-bomb bench was 2.3-2.8x
// idle; with three times, 1.7-2.2x.)
var heavyValidations = newGate(max(1, runtime.GOMAXPROCS(0)/4))

// gate is a counting semaphore whose waits end with a context, and whose
// places rest after use three times as long as they were used.
type gate chan struct{}

func newGate(n int) gate { return make(gate, n) }

// acquire takes a place, or fails with ctx's error; release gives it back
// once it has rested.
func (g gate) acquire(ctx context.Context) (release func(), err error) {
	select {
	case g <- struct{}{}:
		start := time.Now()
		return func() { time.AfterFunc(3*time.Since(start), func() { <-g }) }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func validateContent(ctx context.Context, sch *jsonschema.Schema, content map[string]string, secret map[string]bool) error {
	var errs *multierror.Error
	doc := make(map[string]any, len(content))
	keys := make([]string, 0, len(content))
	for k := range content {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(configvalue.JSON(content[k])))
		if err != nil { // cannot happen: configvalue returns valid JSON
			errs = multierror.Append(errs, &Problem{Key: k, Message: err.Error()})
			continue
		}
		doc[k] = v
	}
	steps, err := checkValidationCost(sch, doc, MaxValidationSteps)
	if err != nil {
		return fmt.Errorf("%w: validating this content against the namespace's schema could take more than %d steps: its branches multiply over the values' depth, or uniqueItems over a long array; simplify the schema or the values", ErrInvalid, MaxValidationSteps)
	}
	if err := runValidation(ctx, sch, doc, steps); err != nil {
		var ve *jsonschema.ValidationError
		if !errors.As(err, &ve) {
			return fmt.Errorf("config: validate: %w", err)
		}
		for _, leaf := range leaves(ve) {
			key := ""
			if len(leaf.InstanceLocation) > 0 {
				key = leaf.InstanceLocation[0]
			}
			msg := leaf.ErrorKind.LocalizedString(printer)
			if secret[key] {
				msg = "the secret value does not match the schema (the details would tell of the value, so they are not given)"
			} else if len(leaf.InstanceLocation) > 1 {
				msg = "at /" + strings.Join(leaf.InstanceLocation[1:], "/") + ": " + msg
			}
			errs = multierror.Append(errs, &Problem{Key: key, Message: msg})
		}
	}
	return problemsOf(errs, ErrValidation)
}

// runValidation validates doc against sch. A validation whose cost is
// above heavyValidationSteps waits for a place of heavyValidations and
// runs at the lowest CPU priority: one tenant's costly schema takes what
// the member's CPUs have left, not other tenants' share.
func runValidation(ctx context.Context, sch *jsonschema.Schema, doc any, steps int) (err error) {
	if steps <= heavyValidationSteps {
		return sch.Validate(doc)
	}
	release, err := heavyValidations.acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	atLowPriority(func() { err = sch.Validate(doc) })
	return err
}

var printer = message.NewPrinter(language.English)

// leaves returns the innermost causes of a validation error: the specific
// problems, not the "doesn't validate" summaries above them.
func leaves(e *jsonschema.ValidationError) []*jsonschema.ValidationError {
	if len(e.Causes) == 0 {
		return []*jsonschema.ValidationError{e}
	}
	var out []*jsonschema.ValidationError
	for _, c := range e.Causes {
		out = append(out, leaves(c)...)
	}
	return out
}
