package clientlib

import (
	"errors"
	"strings"
	"testing"
)

type bindCfg struct {
	Port    int               `json:"port"`
	Name    string            `json:"name"`
	Tags    map[string]string `json:"tags"`
	Enabled bool              `json:"enabled"`
}

func snapshotOf(ns string, release int64, values map[string]string) *ConfigSnapshot {
	return &ConfigSnapshot{revision: 1, spaces: map[string]*nsView{ns: {release: release, values: values}}}
}

func newBinding[T any](format Format, opts ...BindOption[T]) *Binding[T] {
	b := &Binding[T]{ns: "app", format: format}
	for _, opt := range opts {
		opt(&b.opts)
	}
	return b
}

func TestBindDecodes(t *testing.T) {
	defaults := bindCfg{Port: 80, Tags: map[string]string{"env": "dev"}, Enabled: true}
	b := newBinding(JSON, BindDefaults(defaults))
	if err := b.update(snapshotOf("app", 1, map[string]string{"port": "8080", "name": `web`, "tags": `{"zone":"a"}`, "other": "1"})); err != nil {
		t.Fatal(err)
	}
	v := b.Load()
	if v.Port != 8080 || v.Name != "web" || !v.Enabled || v.Tags["zone"] != "a" || b.Release() != 1 {
		t.Fatalf("one key per field: %+v", v)
	}
	if len(defaults.Tags) != 1 || defaults.Tags["zone"] != "" {
		t.Fatalf("decoding wrote into the defaults: %+v", defaults.Tags)
	}

	y := newBinding(YAML, BindKey[bindCfg]("app.yaml"), BindStrict[bindCfg]())
	if err := y.update(snapshotOf("app", 2, map[string]string{"app.yaml": "port: 9090\nname: api\ntags:\n  zone: b\n"})); err != nil {
		t.Fatal(err)
	}
	if v := y.Load(); v.Port != 9090 || v.Name != "api" || v.Tags["zone"] != "b" {
		t.Fatalf("YAML document: %+v", v)
	}
	// Strict refuses unknown fields; the last good value stays.
	err := y.update(snapshotOf("app", 3, map[string]string{"app.yaml": "port: 1\nprot: 2\n"}))
	if err == nil || !strings.Contains(err.Error(), "release 3") || y.Load().Port != 9090 {
		t.Fatalf("strict with an unknown field: %v, value %+v", err, y.Load())
	}
	// A missing document key means the defaults.
	d := newBinding(JSON, BindKey[bindCfg]("doc"), BindDefaults(bindCfg{Port: 1}))
	if err := d.update(snapshotOf("app", 0, map[string]string{})); err != nil || d.Load().Port != 1 {
		t.Fatalf("missing document: %v, %+v", err, d.Load())
	}
}

func TestBindRejects(t *testing.T) {
	var changes int
	b := newBinding(JSON,
		BindValidate(func(c bindCfg) error {
			if c.Port == 0 {
				return errors.New("port is required")
			}
			return nil
		}),
		BindOnChange(func(_, _ bindCfg) { changes++ }))
	if err := b.update(snapshotOf("app", 1, map[string]string{"port": "1"})); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []map[string]string{
		{"port": "0"},        // fails validation
		{"port": `"eighty"`}, // wrong type
		{"port": "{"},        // not JSON: the string "{"
		{"port": "eighty"},   // plain text: a string
	} {
		if err := b.update(snapshotOf("app", 2, bad)); err == nil {
			t.Fatalf("%v accepted", bad)
		}
	}
	if b.Load().Port != 1 || b.Release() != 1 || changes != 0 {
		t.Fatalf("after refused releases: %+v (release %d), %d changes", b.Load(), b.Release(), changes)
	}
	if err := b.update(snapshotOf("app", 3, map[string]string{"port": "2"})); err != nil || changes != 1 {
		t.Fatalf("good release after bad ones: %v, %d changes", err, changes)
	}
}
