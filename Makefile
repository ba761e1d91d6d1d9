# Everything a developer or CI runs. `make test` is the command the README gives.
BIN := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)

.PHONY: check-helm generate-clients all build test test-short screenshots generate check-generated tools lint check-tidy check-breaking chaos bench bench-peers fuzz release

all: build

# Every package of the repository: the server's module (./...) and, through
# go.work, the Go SDK's, the API's and what they share, each a module of
# its own so that the SDK requires none of the server's dependencies.
PKGS := ./... ./clientlib/... ./fencing/... ./proto/... ./internal/shared/...

build:
	go build $(PKGS)

# The full suite: real embedded etcd, the real daemon, race detector, goleak.
# COUNT=N runs every test N times in a row (beside stress-ng --cpu 2, so
# that a test which passes by luck fails before it lands; CI runs it once);
# each package may take 15 minutes per round (the daemon's takes about 10
# beside stress-ng --cpu 8 on 2 cores).
# The web console's browser tests (headless Chromium: apt-get install
# chromium; without it they skip, unless COORDD_REQUIRE_TOOLS=1 as in CI)
# write a PNG of every console page into SCREENSHOTS.
# Tests that own their etcd or daemon run in parallel, PARALLEL at a time
# per package: they wait on disks and timers more than they compute, so 4
# on 2 cores keeps both busy.
# COORDD_TEST_TIMESCALE=N stretches every time bound of every test N times
# (internal/shared/testkit/wait; the race detector doubles it again): on a busy
# or slow machine, a test waits longer instead of failing.
COUNT ?= 1
PARALLEL ?= 4
SCREENSHOTS ?= $(BIN)/screenshots
COORDD_TEST_TIMESCALE ?= 1
export COORDD_TEST_TIMESCALE
test:
	COORDD_SCREENSHOTS=$(SCREENSHOTS) go test -race -count=$(COUNT) -parallel $(PARALLEL) -timeout $$((15 * $(COUNT)))m $(PKGS)

# Only the console's browser tests, and their screenshots in SCREENSHOTS
# (docs/console.png, the README's picture, is a copy of lock.png).
screenshots:
	COORDD_SCREENSHOTS=$(SCREENSHOTS) go test -count=1 -run 'TestConsole' -v ./internal/server/daemon

# Unit tests only: skips everything that starts etcd, except the one
# in-process daemon that clientlib's Examples run against.
test-short:
	go test -short -count=1 $(PKGS)

# Every tool is pinned in a go.mod (root for the protoc plugins, tools/* for
# the big ones, each in its own module so their dependencies stay out of
# ours) and built from source: nothing is downloaded as a binary.
tools:
	cd tools/buf && GOWORK=off go build -o $(BIN)/ tool
	cd tools/golangci-lint && GOWORK=off go build -o $(BIN)/ tool
	cd tools/helm && GOWORK=off go build -o $(BIN)/ tool ./kubecheck
	go build -o $(BIN)/ tool

# Regenerate the Go code and the OpenAPI document from proto/.
generate: tools
	buf format -w proto
	buf lint
	buf generate

# The clients beyond Go, generated from proto/ too (committed): Python with
# Debian's protoc and grpc_python_plugin, TypeScript with protoc-gen-es
# from the client's npm packages (npm ci first). Needs: apt-get install
# protobuf-compiler protobuf-compiler-grpc libprotobuf-dev.
generate-clients:
	clients/python/generate.sh
	test -d clients/typescript/node_modules || (cd clients/typescript && npm ci --no-audit --no-fund)
	clients/typescript/generate.sh

# CI: fail when the committed generated code differs from a fresh generation.
GENERATED := proto internal/server/restapi clients/python/coordd/v1 clients/python/coordd/rpc clients/typescript/src/gen
check-generated: generate generate-clients
	@git diff --exit-code -- $(GENERATED) || { echo "generated code is stale: run 'make generate generate-clients' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- $(GENERATED))" || { git status --porcelain -- $(GENERATED); echo "generated code is stale: run 'make generate generate-clients' and commit"; exit 1; }

# gofmt, go vet, then golangci-lint (pinned, built by `make tools`; its
# linters and formatters are configured in .golangci.yml).
lint: tools
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	go vet $(PKGS)
	golangci-lint run $(PKGS)

# CI: fail when go.mod or go.sum of any module (the root one, the SDK's,
# the API's, fencing, internal/shared and each tools/*) is not what `go mod
# tidy` would make it, each on its own (GOWORK=off), as a user's build sees it.
GO_MODULES := . clientlib fencing proto internal/shared $(patsubst %/go.mod,%,$(wildcard tools/*/go.mod))
check-tidy:
	@ok=true; for m in $(GO_MODULES); do \
	  echo "go mod tidy -diff ($$m)"; \
	  (cd $$m && GOWORK=off go mod tidy -diff) || { echo "$$m: go.mod/go.sum not tidy: run 'go mod tidy' there and commit"; ok=false; }; \
	done; $$ok

# CI: fail when proto/ breaks its API (the `breaking` rules in buf.yaml)
# compared with the last release tag before HEAD or, while there is none,
# with the previous commit. BREAKING_AGAINST=<buf input> compares with
# something else, e.g. '.git#branch=main' before committing on a branch.
BREAKING_AGAINST ?=
check-breaking: tools
	@against='$(BREAKING_AGAINST)'; \
	if [ -z "$$against" ]; then \
	  if ! git rev-parse -q --verify 'HEAD~1^{commit}' >/dev/null; then \
	    echo "check-breaking: HEAD has no parent commit in this clone (first commit, or a shallow clone): nothing to compare with, skipped"; exit 0; \
	  fi; \
	  tag=$$(git describe --tags --abbrev=0 HEAD~1 2>/dev/null || true); \
	  if [ -n "$$tag" ]; then against=".git#tag=$$tag"; else against=".git#ref=HEAD~1"; fi; \
	fi; \
	echo "buf breaking --against '$$against'"; \
	buf breaking --against "$$against"

# CI: the Helm chart (deploy/helm/coordd) lints and renders with its
# defaults and with each file of its ci/ values, and what it renders is
# checked against the Kubernetes API's types (tools/helm/kubecheck, whose
# own tests show it finds the mistakes it looks for).
HELM_CHART := deploy/helm/coordd
check-helm: tools
	cd tools/helm && GOWORK=off go test -count=1 ./kubecheck
	@echo "helm template coordd $(HELM_CHART) (default values: must refuse an open cluster)"; \
	if out=$$(helm template coordd $(HELM_CHART) 2>&1); then \
	  echo "the chart's default values rendered an open, plaintext cluster"; exit 1; \
	fi; \
	echo "$$out" | grep -q 'insecure: true' || { echo "$$out"; echo "the refusal does not name insecure: true"; exit 1; }
	@set -e; for values in $(wildcard $(HELM_CHART)/ci/*.yaml); do \
	  opt=$${values:+-f $$values}; \
	  echo "helm lint --strict $(HELM_CHART) $$opt"; \
	  helm lint --strict --quiet $(HELM_CHART) $$opt; \
	  echo "helm template coordd $(HELM_CHART) $$opt | kubecheck"; \
	  helm template coordd $(HELM_CHART) --namespace coordd $$opt | kubecheck; \
	done

# Faults, repeated. First the fault matrix (internal/testkit/chaos): a cluster of
# three coordd processes behind TCP proxies, lock workers and election
# candidates as processes, and each fault ROUNDS times with etcd's default
# raft timing: kill -9, SIGSTOP (past the TTL) and partition of the
# etcd-leader member, its peers cut (clients not) from the etcd-leader member
# and from a follower's for 10 s (COORDD_CHAOS_PEER_CUT=60s for longer), a
# slow disk (fsync +200 ms, FUSE) under the etcd leader,
# kill -9 of a follower and of every member, SIGSTOP and
# kill -9 of a lock holder and of a leader, kill -9 of a lock holder while
# etcd's leadership moves every TTL/2, a full database (NOSPACE); then
# porcupine, write-order and overlap checks, fail-over times, the next
# grant after the dead holder (at most TTL + 1 s) and the sessions a
# resumed leader ended (none). SABOTAGE=unfenced (raw etcd writes) or
# SABOTAGE=deadline (holders trust their grant a TTL too long) or
# SABOTAGE=torn (each config release written as two) switches a
# mechanism off: the run must then fail. FAULTS=a,b runs only the faults
# whose names contain a or b. Then CRASHES crashes of the
# etcd-leader member of an in-process cluster, with fail-over times and
# lost sessions. CI runs the one-round, fast-raft matrix and the one-crash
# version inside make test.
ROUNDS ?= 5
CRASHES ?= 20
SABOTAGE ?=
FAULTS ?=
chaos:
	COORDD_CHAOS_ROUNDS=$(ROUNDS) COORDD_CHAOS_PRODUCTION=1 COORDD_CHAOS_SABOTAGE=$(SABOTAGE) COORDD_CHAOS_FAULTS=$(FAULTS) go test -count=1 -timeout 60m -run 'TestFaultMatrix' -v ./internal/testkit/chaos
	COORDD_CHAOS_CRASHES=$(CRASHES) go test -race -count=1 -timeout 30m -run 'TestChaos' -v ./internal/server/daemon

# Benchmarks: coordd beside raw etcd in one run, printed as ratios.
bench:
	go run ./bench

# The other systems the lock and election benchmarks run beside coordd:
# Debian's ZooKeeper 3.8 and Redis (each started by the bench, on loopback).
bench-peers:
	@test -f /usr/share/java/zookeeper.jar && command -v redis-server >/dev/null || { \
		SUDO=$$(test "$$(id -u)" = 0 || echo sudo); $$SUDO apt-get update -q && $$SUDO apt-get install -y -q zookeeper redis-server; }

# Fuzz the request validation and the decoders that skip encoding/json,
# 30s per target (FUZZTIME=5m for longer).
FUZZTIME ?= 30s
fuzz:
	go test -run=^$$ -fuzz=FuzzValidateCreate -fuzztime=$(FUZZTIME) ./internal/session
	go test -run=^$$ -fuzz=FuzzParseID -fuzztime=$(FUZZTIME) ./internal/session
	go test -run=^$$ -fuzz=FuzzValidateRequest -fuzztime=$(FUZZTIME) ./internal/lock
	go test -run=^$$ -fuzz=FuzzValidateRequest -fuzztime=$(FUZZTIME) ./internal/election
	go test -run=^$$ -fuzz=FuzzValidateWrite -fuzztime=$(FUZZTIME) ./internal/configcenter
	go test -run=^$$ -fuzz=FuzzDecodeEntry -fuzztime=$(FUZZTIME) ./internal/history

# Release archives in dist/ (emptied first): coordd and coordctl for each of
# PLATFORMS, static (CGO_ENABLED=0) and -trimpath, in
# dist/coordd_<version>_<os>_<arch>/ with README.md and LICENSE, one .tar.gz of each,
# and dist/SHA256SUMS of the tarballs (check: cd dist && sha256sum -c
# SHA256SUMS). VERSION is stamped into both (`coordd --version`,
# `coordctl --version`). Beside them, the clients as a user installs them:
# dist/python/ the Python client's sdist and wheel (built offline with
# Debian's setuptools), dist/typescript/ its npm tarball (npm pack).
VERSION ?= $(shell git describe --tags --always --dirty)
PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
release:
	rm -rf dist
	@set -e; v='$(VERSION)'; test -n "$$v" || { echo "release: VERSION is empty (no git?): give VERSION=..."; exit 1; }; \
	for p in $(PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; d=coordd_$${v}_$${os}_$${arch}; \
	  echo "dist/$$d.tar.gz"; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags "-s -w -X main.version=$$v" -o dist/$$d/coordd ./cmd/coordd; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags "-s -w -X main.version=$$v" -o dist/$$d/coordctl ./cmd/coordctl; \
	  cp README.md LICENSE dist/$$d/; \
	  tar -C dist -czf dist/$$d.tar.gz $$d; \
	done
	cd clients/python && /usr/bin/python3 -c 'from setuptools import build_meta as b; b.build_sdist("../../dist/python")'
	/usr/bin/python3 -m pip wheel --no-deps --no-build-isolation --no-index --no-cache-dir --wheel-dir dist/python dist/python/coordd-*.tar.gz
	test -d clients/typescript/node_modules || (cd clients/typescript && npm ci --no-audit --no-fund)
	mkdir -p dist/typescript && cd clients/typescript && npm run build && npm pack --pack-destination ../../dist/typescript
	cd dist && sha256sum *.tar.gz python/* typescript/* > SHA256SUMS
