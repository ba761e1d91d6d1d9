package configcenter

import (
	"fmt"
	"regexp"
	"regexp/syntax"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// A schema's regular expressions ("pattern", "patternProperties", and the
// "regex" format) run on RE2, in time linear in the text, but the factor
// is the size of the expression's compiled program: "(?:a?){999}a{999}!x"
// (3,001 instructions) on a 50 KB value cost 5.7 CPU-seconds in a daemon;
// Go's matcher takes about 7 ns per instruction and byte at worst here. So each expression's program is
// bounded when the schema is set, and each match is charged to the
// validation's steps (see checkValidationCost) in proportion to program
// size times text length, before the validation runs.
const (
	// MaxPatternInstructions bounds one regular expression's compiled
	// program: "^[a-z][a-z0-9-]{0,62}$" takes 129 instructions, a common
	// e-mail pattern 13.
	MaxPatternInstructions = 2_000
	// patternCostUnit is how many (instruction, byte) pairs of matching
	// count as one validation step. MaxValidationSteps allows 1.6 million
	// pairs (some 10-30 ms of one CPU at worst), a 16 KiB value against a
	// 100-instruction pattern; a costlier release is refused before it
	// runs. (64 pairs a step let four parallel releases of the costliest
	// pattern take both CPUs of a 2-core member; see also
	// heavyValidations.)
	patternCostUnit = 16
)

// sizedRegexp is a compiled expression with the size of its program.
type sizedRegexp struct {
	*regexp.Regexp
	insts int
}

// cost is the validation steps matching a text of n bytes is charged.
func (r sizedRegexp) cost(n int) int { return 1 + r.insts*n/patternCostUnit }

// compileBoundedRegexp is the schema compiler's regexp engine: Go's RE2
// (as the default engine), refusing a program of more than
// MaxPatternInstructions.
func compileBoundedRegexp(expr string) (jsonschema.Regexp, error) {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return nil, err
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return nil, err
	}
	if n := len(prog.Inst); n > MaxPatternInstructions {
		return nil, fmt.Errorf("the regular expression %.40q compiles to %d instructions, more than coordd's %d: matching costs its size times the text's length on every release", expr, n, MaxPatternInstructions)
	}
	compiled, err := regexp.Compile(expr)
	if err != nil {
		return nil, err
	}
	return sizedRegexp{Regexp: compiled, insts: len(prog.Inst)}, nil
}

// patternCost is what matching re against a text of n bytes is charged:
// 1 for an expression this package did not compile.
func patternCost(re jsonschema.Regexp, n int) int {
	if r, ok := re.(sizedRegexp); ok {
		return r.cost(n)
	}
	return 1
}
