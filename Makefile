# The one test command is `make test`: it runs the unit tests with the race
# detector, then builds the pinned Kubernetes binaries (cached outside the
# repository) and runs the end-to-end tests against a real kube-apiserver.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
GO ?= go
E2E_TIMEOUT ?= 30m
FUZZTIME ?= 60s

VERSION := $(shell cat VERSION)
# REVISION is the commit, with -dirty when the tree differs from it.
REVISION := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)$(shell [ -n "$$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && echo -dirty)
# cmd/coredns is a module of its own: it requires the CoreDNS the image
# ships by default (the newest), while the plugin's go.mod requires the
# oldest it supports (the floor). `make image COREDNS_VERSION=1.13.1`
# builds on another release, from the floor up (hack/coredns.sh).
COREDNS_VERSION ?= $(shell hack/coredns.sh default | sed 's/^v//')
COREDNS_FLOOR = $(shell hack/coredns.sh floor | sed 's/^v//')
# coredns -version names the k8s_event build in its commit field. The
# Dockerfile builds with the same flags.
LDFLAGS := -s -w -X github.com/coredns/coredns/coremain.GitCommit=k8s_event-$(VERSION)+$(REVISION)
PLATFORMS ?= linux/amd64 linux/arm64
# The image is IMAGE_NAME:TAG. TAG is $(COREDNS_VERSION)-$(VERSION)- and
# 12 hex digits of the image's content digest: the same code gives the same
# tag, other code another, so IfNotPresent never runs stale code. Set
# IMAGE_TAG to choose one (e.g. for a release); IMAGE_NAME to name your
# registry. `make image` prints the reference and writes it to
# IMAGE_REF_FILE; the archive's index.json names it too.
IMAGE_NAME ?= localhost/coredns-k8s-event
IMAGE_TAG ?=
IMAGE_ARCHIVE ?= bin/coredns-k8s-event.tar
IMAGE_REF_FILE ?= $(dir $(IMAGE_ARCHIVE))image-ref
# platform_bin is where `make image` builds the binary of platform $(1).
platform_bin = bin/$(subst /,-,$(1))/coredns

# NODE is "node" where a node can run (Linux, as root): then the e2e tests
# and the demo also run CoreDNS as a Pod on a real kubelet and containerd.
# Any other non-empty value (NODE=1) means the same; NODE= turns it off.
NODE ?= $(shell [ "$$(uname -s)" = Linux ] && [ "$$(id -u)" = 0 ] && echo node)

# with_tools runs its argument with KUBE_APISERVER, ETCD and KUBECTL set (and
# the node's binaries when NODE is set), building them first when missing.
# with_demo_tools builds and sets only what the demo runs.
with_tools = tools_env=$$(hack/tools.sh env $(if $(NODE),node)); set -a; eval "$$tools_env"; set +a;
with_demo_tools = tools_env=$$(hack/tools.sh demo-env $(if $(NODE),node)); set -a; eval "$$tools_env"; set +a;

.PHONY: all build build-check image plugin push release tools test test-unit test-newest test-floor test-faults test-e2e demo bench bench-fleet bench-against fuzz mutate mutate-contract clean

all: build

# build is a static CoreDNS with every in-tree plugin, kubeapi and k8s_event.
build:
	modfile=$$(hack/coredns.sh modfile $(COREDNS_VERSION)); \
		CGO_ENABLED=0 $(GO) build -C cmd/coredns $$modfile -trimpath -ldflags "$(LDFLAGS)" -o $(CURDIR)/bin/coredns .

# image cross-builds CoreDNS for PLATFORMS and writes their image, a
# multi-platform OCI index, as an archive for `ctr -n k8s.io images
# import`, `kind load image-archive` or `docker load`; no registry and no
# builder daemon are needed. The Dockerfile builds the same image.
image:
	modfile=$$(hack/coredns.sh modfile $(COREDNS_VERSION)); for p in $(PLATFORMS); do \
		CGO_ENABLED=0 GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build -C cmd/coredns $$modfile -trimpath -ldflags "$(LDFLAGS)" \
			-o $(CURDIR)/bin/$${p%/*}-$${p#*/}/coredns .; \
	done
	$(GO) run ./hack/image $(foreach p,$(PLATFORMS),-binary $(p)=$(call platform_bin,$(p))) \
		-name $(IMAGE_NAME) -tag '$(IMAGE_TAG)' -version $(VERSION) -revision $(REVISION) \
		-coredns $(COREDNS_VERSION) -out $(IMAGE_ARCHIVE) -ref-file $(IMAGE_REF_FILE)

# push pushes the image that `make image` wrote, both platforms, to IMAGE
# (REGISTRY/REPO:TAG) with the credentials of the docker config (`docker
# login`), and prints the pushed reference with its digest. A tag that
# names another image is refused unless OVERWRITE=1. The tool is the
# module hack/registry, so that the plugin's module does not require
# go-containerregistry.
IMAGE ?=
OVERWRITE ?=
push:
	$(GO) run -C hack/registry . push -archive $(abspath $(IMAGE_ARCHIVE)) $(if $(filter 1,$(OVERWRITE)),-overwrite) '$(IMAGE)'

# plugin writes the kubectl plugin (krew's coredns-k8s-event) for
# PLUGIN_PLATFORMS into PLUGIN_DIR: one archive each, with the LICENSE,
# and their krew manifest (docs/release.md).
PLUGIN_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64
PLUGIN_DIR ?= bin/plugin
plugin:
	rm -rf $(PLUGIN_DIR)
	$(GO) run ./hack/krew -version $(VERSION) -out $(PLUGIN_DIR) $(foreach p,$(PLUGIN_PLATFORMS),-platform $(p))

# release writes dist/: the static binaries of PLATFORMS, their image
# archive named by its tag, the image's reference, the kubectl plugin's
# archives and krew manifest, and SHA-256 sums.
release: image plugin
	rm -rf dist && mkdir -p dist
	cp $(PLUGIN_DIR)/* dist/
	for p in $(PLATFORMS); do \
		cp bin/$${p%/*}-$${p#*/}/coredns dist/coredns-k8s_event-$(VERSION)-$${p%/*}-$${p#*/}; \
	done
	ref=$$(cat $(IMAGE_REF_FILE)); cp $(IMAGE_ARCHIVE) "dist/coredns-k8s-event-$${ref##*:}.tar"
	cp $(IMAGE_REF_FILE) dist/image-ref
	cd dist && sha256sum * > SHA256SUMS

tools:
	hack/tools.sh install

# The unit tests come first: they need no tool, and a clone runs them
# before the tools' first build.
test: test-unit tools test-faults test-newest test-floor build-check test-e2e

# The plugin's go.mod requires the oldest CoreDNS it supports (the floor):
# test-unit runs its tests there. test-newest runs the plugin's tests
# again on the CoreDNS the image ships (cmd/coredns's), through a copy of
# go.mod raised to it; test-floor checks that a CoreDNS tree at the floor
# builds with k8s_event and keeps its own CoreDNS and client-go.
test-newest:
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	cp go.mod "$$tmp/go.mod"; cp go.sum "$$tmp/go.sum"; \
	$(GO) get -modfile="$$tmp/go.mod" github.com/coredns/coredns@$$(hack/coredns.sh default); \
	$(GO) mod tidy -modfile="$$tmp/go.mod"; \
	$(GO) list -modfile="$$tmp/go.mod" -m github.com/coredns/coredns k8s.io/client-go; \
	$(GO) vet -modfile="$$tmp/go.mod" . && $(GO) test -modfile="$$tmp/go.mod" -race -count=1 .

test-floor:
	hack/coredns.sh consumer

# build-check builds the CoreDNS of cmd/coredns and checks that it has both plugins.
build-check: build
	bin/coredns -plugins | grep -qx k8s_event
	bin/coredns -plugins | grep -qx kubeapi

test-unit:
	$(GO) test -race -count=1 ./...
	$(GO) test -C hack/registry -race -count=1 ./...

# test-faults runs the fault models over many more seeds than test-unit
# does: the stepped one (the production scheduler on a fake clock) without
# the race detector, the concurrent one (the scheduler's goroutine, writer
# goroutines, reloads and stop) with it.
FAULT_SEEDS ?= 2000
CONCURRENT_SEEDS ?= 100
test-faults:
	$(GO) test -count=1 -run '^TestFaultModel$$' -faultmodel.seeds=$(FAULT_SEEDS) -v . | grep -E '^(---|ok|FAIL|\s+faultmodel)'
	$(GO) test -race -count=1 -run '^TestFaultModelConcurrent$$' -faultmodel.concurrent=$(CONCURRENT_SEEDS) -v . | grep -E '^(---|ok|FAIL|\s+faultconc)'

# test-e2e runs the end-to-end tests; with NODE, the node tests run the
# image that `make image` writes (they read its reference from the archive).
# The packages run one at a time: the node tests of test/e2e/node and
# internal/cluster take the machine's one node in turn, and a start waits
# for it no longer than its start time-out.
test-e2e: image
	$(with_tools) K8S_EVENT_IMAGE=$(abspath $(IMAGE_ARCHIVE)) \
		$(GO) test -p 1 -tags e2e -count=1 -timeout $(E2E_TIMEOUT) ./test/e2e/... ./internal/cluster/... ./internal/install/

# demo runs a local Kubernetes and CoreDNS that reports its log lines as
# events: with NODE, CoreDNS runs as the cluster's DNS from its image,
# through deploy/k8s_event; elsewhere as a process beside the control
# plane. Ctrl-C stops everything it started. It builds only what it runs:
# the image for this machine's architecture, and only with NODE.
demo: PLATFORMS = linux/$(shell $(GO) env GOARCH)
demo: $(if $(NODE),image)
	$(GO) build -o bin/coredns-e2e ./test/cmd/coredns
	$(GO) build -o bin/demo ./cmd/demo
	$(with_demo_tools) exec bin/demo -coredns bin/coredns-e2e $(if $(NODE),-image $(IMAGE_ARCHIVE) -image-ref "$$(cat $(IMAGE_REF_FILE))")

# bench runs the listener micro-benchmarks, then test/bench: CoreDNS with and
# without k8s_event against a local control plane, driven by dnsperf. It
# reports figures against the plugin's promises; it is not part of `make test`.
bench:
	mkdir -p bin
	$(GO) test -run '^$$' -bench . -benchmem -count 5 . | tee bin/bench-micro.txt
	$(GO) build -o bin/coredns-e2e ./test/cmd/coredns
	$(GO) build -o bin/k8s-event-bench ./test/bench
	hack/tools.sh dnsperf
	$(with_tools) bin/k8s-event-bench -coredns bin/coredns-e2e -micro bin/bench-micro.txt -out bin/bench-report.md

# bench-fleet runs FLEET_REPLICAS production pipelines of k8s_event in one
# process, each with its own pod object, client and connection, writing as
# the ServiceAccount kube-system/coredns to a real kube-apiserver and etcd
# (APF on): an upstream failure shared by all, and an API outage, each with
# and without the priority level of deploy/k8s_event/flowcontrol, beside a
# bystander in kube-system. FLEET_OPTIONS are k8s_event options, one set
# per variant, '|' between sets and ';' between lines: FLEET_OPTIONS='|fleet
# 10 50' compares the defaults with `fleet 10 50`. The report is
# bin/bench-fleet.md. Not part of `make test`: it takes several minutes.
FLEET_REPLICAS ?= 1000
FLEET_OPTIONS ?=
FLEET_ARGS ?=
bench-fleet:
	mkdir -p bin
	tools_env=$$(hack/tools.sh env); set -a; eval "$$tools_env"; set +a; \
		nice -n 10 $(GO) test -tags fleetbench -run '^$$' -bench '^BenchmarkFleet$$' -benchtime 1x -timeout 3h . \
		-args -fleet.replicas '$(FLEET_REPLICAS)' -fleet.options '$(FLEET_OPTIONS)' -fleet.out bin/bench-fleet.md $(FLEET_ARGS)

# bench-against compares the listener micro-benchmarks with those of BASE
# (a commit), both built once and run in turns: `make bench-against
# BASE=v1.2.0 TURNS=20`. The report is bin/bench-against/report.txt.
BASE ?= HEAD
TURNS ?= 10
bench-against:
	hack/bench-against.sh '$(BASE)' '$(TURNS)'

# fuzz runs every fuzz target of every package for FUZZTIME.
fuzz:
	for pkg in $$($(GO) list ./...); do \
		for target in $$($(GO) test -list '^Fuzz' "$$pkg" | grep '^Fuzz' || true); do \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) "$$pkg"; \
		done; \
	done

# mutate runs a mutation tester over the root package: each mutant is a
# small change of the code that the unit tests must catch. Not part of
# `make test`: it takes a while. MUTATE_EXCLUDE narrows it; `make
# mutate-contract` runs it over the scheduler, its token buckets and its
# policies (scheduler, ratelimit, queue, cache, correlator, hitters, end).
GREMLINS_VERSION ?= v0.6.0
MUTATE_EXCLUDE ?= $$^
# A mutant whose tests run this many times longer than the tests of the
# code itself is "timed out": the tests hang on it, so it is caught.
MUTATE_TIMEOUT ?= 3
mutate:
	mkdir -p bin
	K8S_EVENT_FAULT_SEEDS=100 K8S_EVENT_CONCURRENT_SEEDS=4 $(GO) run github.com/go-gremlins/gremlins/cmd/gremlins@$(GREMLINS_VERSION) unleash \
		--timeout-coefficient $(MUTATE_TIMEOUT) --workers 2 -E '^(test|hack|internal|cmd|tools)/' -E '$(MUTATE_EXCLUDE)' \
		--output bin/mutate.json . | tee bin/mutate.txt

mutate-contract:
	$(MAKE) mutate MUTATE_EXCLUDE='(^|/)(account|check|event|format|hook|k8s_event|metrics|pipeline|pod|setup|shape|writer)\.go$$$$'

clean:
	rm -rf bin dist
