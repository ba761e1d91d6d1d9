# Everything a developer or CI runs. `make test` is the command the README gives.
BIN := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)

.PHONY: all build test test-short generate check-generated tools lint bench fuzz

all: build

build:
	go build ./...

# The full suite: real embedded etcd, the real daemon, race detector, goleak.
# COUNT=2 runs every test twice in a row (CI does, so that a test which
# passes by luck fails before it lands).
COUNT ?= 1
test:
	go test -race -count=$(COUNT) -timeout 15m ./...

# Unit tests only (skips everything that starts etcd).
test-short:
	go test -short -count=1 ./...

tools:
	cd tools/buf && go build -o $(BIN)/ tool
	go build -o $(BIN)/ tool

# Regenerate the Go code and the OpenAPI document from proto/.
generate: tools
	buf format -w proto
	buf lint
	buf generate

# CI: fail when the committed generated code differs from a fresh generation.
check-generated: generate
	@git diff --exit-code -- proto || { echo "generated code is stale: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- proto)" || { git status --porcelain -- proto; echo "generated code is stale: run 'make generate' and commit"; exit 1; }

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	go vet ./...

# Benchmarks: coordd beside raw etcd in one run, printed as ratios.
bench:
	go run ./bench

# Fuzz the request validation, 30s per target (FUZZTIME=5m for longer).
FUZZTIME ?= 30s
fuzz:
	go test -run=^$$ -fuzz=FuzzValidateCreate -fuzztime=$(FUZZTIME) ./session
	go test -run=^$$ -fuzz=FuzzParseID -fuzztime=$(FUZZTIME) ./session
	go test -run=^$$ -fuzz=FuzzValidateRequest -fuzztime=$(FUZZTIME) ./lock
	go test -run=^$$ -fuzz=FuzzValidateRequest -fuzztime=$(FUZZTIME) ./election
	go test -run=^$$ -fuzz=FuzzValidateWrite -fuzztime=$(FUZZTIME) ./configcenter
