package auth

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-multierror"
	"go.yaml.in/yaml/v3"
)

// Action is something a caller does. Each RPC maps to exactly one.
type Action string

// The actions, and the kind of resource each names (Kind None: the action
// is not about a name).
const (
	Session          Action = "session"            // create, keep alive, close, read sessions
	LockAcquire      Action = "lock.acquire"       // acquire a lock (lock)
	LockRelease      Action = "lock.release"       // release a grant (lock)
	LockDescribe     Action = "lock.describe"      // holders, waiters, list (lock)
	ElectionCampaign Action = "election.campaign"  // campaign, proclaim, resign (election)
	ElectionObserve  Action = "election.observe"   // leader, candidates, observe, list (election)
	ConfigRead       Action = "config.read"        // read, watch, report status (namespace)
	ConfigReadSecret Action = "config.read-secret" // read secret values in clear, with config.read (namespace)
	ConfigWrite      Action = "config.write"       // put, delete, publish (namespace)
	ConfigPropose    Action = "config.propose"     // propose a release, withdraw one's own (namespace)
	ConfigApprove    Action = "config.approve"     // approve or reject another's proposal (namespace)
	ConfigAdmin      Action = "config.admin"       // schema, rollback (namespace)
	KVFenced         Action = "kv.fenced"          // fenced put, delete, validate (key)
	KVRead           Action = "kv.read"            // get, list, watch the fenced KV (key)
	ClusterRead      Action = "cluster.read"       // status, members, alarms
	ClusterAdmin     Action = "cluster.admin"      // snapshot, members, defrag, disarm
)

// Kind is the kind of name an action is about.
type Kind string

// Resource kinds.
const (
	None      Kind = ""
	Lock      Kind = "lock"
	Election  Kind = "election"
	Namespace Kind = "namespace"
	Key       Kind = "key"
)

// Actions lists every action with the kind of resource it names.
var Actions = map[Action]Kind{
	Session: None, LockAcquire: Lock, LockRelease: Lock, LockDescribe: Lock,
	ElectionCampaign: Election, ElectionObserve: Election,
	ConfigRead: Namespace, ConfigReadSecret: Namespace, ConfigWrite: Namespace, ConfigAdmin: Namespace,
	ConfigPropose: Namespace, ConfigApprove: Namespace,
	KVFenced: Key, KVRead: Key, ClusterRead: None, ClusterAdmin: None,
}

// Resource is what an action is about: a kind and a name (or a name
// prefix, for listings: Prefix set).
type Resource struct {
	Kind   Kind
	Name   string
	Prefix bool // Name is a prefix: every name under it is concerned
}

// Principal is an authenticated caller.
type Principal struct {
	Name   string
	Groups []string
}

// Anonymous is a caller without an identity.
var Anonymous = Principal{}

// IsAnonymous reports whether p carries no identity.
func (p Principal) IsAnonymous() bool { return p.Name == "" }

// Policy is a parsed, validated policy file.
//
//	groups:                  # optional: group -> principals
//	  batch: [worker-1, worker-2]
//	rules:
//	  - principals: [payments]          # and/or groups: [...]; "*" is any
//	                                    # authenticated principal
//	    actions: [session, lock.acquire, lock.release, kv.fenced]
//	    locks: ["payments/*"]           # globs: * any run of characters,
//	    keys: ["payments/*"]            # ? one; also elections, namespaces
//
// A rule allows its actions to its principals on the names its patterns
// match; an action about a kind of name the rule lists no pattern for is
// not allowed by it. Actions may end in ".*" ("lock.*") or be "*".
type Policy struct {
	Groups map[string][]string `yaml:"groups"`
	Rules  []Rule              `yaml:"rules"`
}

// Rule is one grant of a policy.
type Rule struct {
	Principals []string `yaml:"principals"`
	Groups     []string `yaml:"groups"`
	Actions    []string `yaml:"actions"`
	Locks      []string `yaml:"locks"`
	Elections  []string `yaml:"elections"`
	Namespaces []string `yaml:"namespaces"`
	Keys       []string `yaml:"keys"`
}

// ParsePolicy parses and validates a policy file; any problem refuses the
// whole file, every problem listed.
func ParsePolicy(data []byte) (*Policy, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var p Policy
	if err := dec.Decode(&p); err != nil && !errors.Is(err, io.EOF) { // empty: no rules, below
		return nil, fmt.Errorf("policy: %w", err)
	}
	var errs *multierror.Error
	if len(p.Rules) == 0 {
		errs = multierror.Append(errs, errors.New("no rules: a policy with no rules denies everything; give at least one"))
	}
	for g, members := range p.Groups {
		if g == "" || g == "*" {
			errs = multierror.Append(errs, fmt.Errorf("group %q: a group needs a name other than *", g))
		}
		for _, m := range members {
			if m == "" {
				errs = multierror.Append(errs, fmt.Errorf("group %q: an empty principal name", g))
			}
		}
	}
	for i, r := range p.Rules {
		at := fmt.Sprintf("rule %d", i+1)
		if len(r.Principals) == 0 && len(r.Groups) == 0 {
			errs = multierror.Append(errs, fmt.Errorf("%s: names no principals and no groups", at))
		}
		// A rule's groups need not be defined here: the token file gives
		// principals groups too.
		if len(r.Actions) == 0 {
			errs = multierror.Append(errs, fmt.Errorf("%s: no actions", at))
		}
		for _, a := range r.Actions {
			if !validActionPattern(a) {
				errs = multierror.Append(errs, fmt.Errorf("%s: unknown action %q (known: %s)", at, a, strings.Join(actionNames(), ", ")))
			}
		}
		for _, pats := range [][]string{r.Locks, r.Elections, r.Namespaces, r.Keys} {
			for _, pat := range pats {
				if pat == "" {
					errs = multierror.Append(errs, fmt.Errorf("%s: an empty name pattern (use \"*\" for every name)", at))
				}
			}
		}
	}
	if err := errs.ErrorOrNil(); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return &p, nil
}

func actionNames() []string {
	out := make([]string, 0, len(Actions))
	for a := range Actions {
		out = append(out, string(a))
	}
	slices.Sort(out)
	return out
}

func validActionPattern(a string) bool {
	if a == "*" {
		return true
	}
	if prefix, ok := strings.CutSuffix(a, ".*"); ok {
		for known := range Actions {
			if strings.HasPrefix(string(known), prefix+".") {
				return true
			}
		}
		return false
	}
	_, ok := Actions[Action(a)]
	return ok
}

func actionMatches(pattern string, a Action) bool {
	if pattern == "*" || pattern == string(a) {
		return true
	}
	prefix, ok := strings.CutSuffix(pattern, ".*")
	return ok && strings.HasPrefix(string(a), prefix+".")
}

func (r *Rule) patterns(k Kind) []string {
	switch k {
	case Lock:
		return r.Locks
	case Election:
		return r.Elections
	case Namespace:
		return r.Namespaces
	case Key:
		return r.Keys
	}
	return nil
}

func (r *Rule) appliesTo(p Principal, groups map[string][]string) bool {
	if p.IsAnonymous() {
		return false
	}
	for _, name := range r.Principals {
		if name == "*" || name == p.Name {
			return true
		}
	}
	for _, g := range r.Groups {
		if slices.Contains(p.Groups, g) || slices.Contains(groups[g], p.Name) {
			return true
		}
	}
	return false
}

// Allows reports whether the policy lets p take action a on res, and, when
// it does not, why (for the caller's error and the audit log).
func (pol *Policy) Allows(p Principal, a Action, res Resource) (bool, string) {
	if p.IsAnonymous() {
		return false, "no identity: present a client certificate or a bearer token"
	}
	kind := Actions[a]
	for i := range pol.Rules {
		r := &pol.Rules[i]
		if !r.appliesTo(p, pol.Groups) || !slices.ContainsFunc(r.Actions, func(pat string) bool { return actionMatches(pat, a) }) {
			continue
		}
		if kind == None {
			return true, ""
		}
		for _, pat := range r.patterns(kind) {
			if (res.Prefix && prefixCovered(pat, res.Name)) || (!res.Prefix && Glob(pat, res.Name)) {
				return true, ""
			}
		}
	}
	if kind == None {
		return false, fmt.Sprintf("no rule allows %s to %s", p.Name, a)
	}
	what := fmt.Sprintf("%s %q", kind, res.Name)
	if res.Prefix {
		what = fmt.Sprintf("every %s under %q", kind, res.Name)
	}
	return false, fmt.Sprintf("no rule allows %s to %s on %s", p.Name, a, what)
}

// prefixCovered reports whether pattern matches every name that starts
// with prefix: a listing of prefix is allowed only then.
func prefixCovered(pattern, prefix string) bool {
	// pattern must be a literal start that prefix extends, then "*".
	lit, ok := strings.CutSuffix(pattern, "*")
	if !ok || strings.ContainsAny(lit, "*?") {
		return false
	}
	return strings.HasPrefix(prefix, lit)
}

// Glob reports whether name matches pattern: '*' matches any run of
// characters ('/' included), '?' any one character, everything else
// itself.
func Glob(pattern, name string) bool {
	// Iterative matching with one backtrack point: linear in practice,
	// never exponential.
	p, n := 0, 0
	star, mark := -1, 0
	for n < len(name) {
		switch {
		case p < len(pattern) && (pattern[p] == '?' || pattern[p] == name[n]):
			p++
			n++
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, n
			p++
		case star >= 0:
			p = star + 1
			mark++
			n = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// Authorizer holds the policy in force; Load replaces it atomically, so a
// reload never leaves a half-applied policy. A nil policy is open mode:
// everything is allowed.
type Authorizer struct {
	policy atomic.Pointer[Policy]
}

// NewAuthorizer returns an Authorizer enforcing p (nil: open mode).
func NewAuthorizer(p *Policy) *Authorizer {
	a := &Authorizer{}
	a.policy.Store(p)
	return a
}

// Open reports whether no policy is in force (everything is allowed).
func (a *Authorizer) Open() bool { return a.policy.Load() == nil }

// Groups returns p's groups, sorted: those its token gives it and those
// the policy in force lists it in; and whether a policy is in force.
func (a *Authorizer) Groups(p Principal) (groups []string, inForce bool) {
	groups = slices.Clone(p.Groups)
	pol := a.policy.Load()
	if pol != nil && !p.IsAnonymous() {
		for g, members := range pol.Groups {
			if slices.Contains(members, p.Name) {
				groups = append(groups, g)
			}
		}
	}
	slices.Sort(groups)
	return slices.Compact(groups), pol != nil
}

// Load parses data and, if it is valid, puts it in force; if not, the
// policy in force stays and the error says why.
func (a *Authorizer) Load(data []byte) error {
	p, err := ParsePolicy(data)
	if err != nil {
		return err
	}
	a.policy.Store(p)
	return nil
}

// Allows reports whether p may take action act on res under the policy
// in force, and why not.
func (a *Authorizer) Allows(p Principal, act Action, res Resource) (bool, string) {
	pol := a.policy.Load()
	if pol == nil {
		return true, ""
	}
	return pol.Allows(p, act, res)
}
