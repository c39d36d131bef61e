# The one test command is `make test`: it builds the pinned Kubernetes
# binaries (cached outside the repository), runs the unit tests with the
# race detector, then the end-to-end tests against a real kube-apiserver.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
GO ?= go
E2E_TIMEOUT ?= 30m
FUZZTIME ?= 60s

# with_tools runs its argument with KUBE_APISERVER, ETCD and KUBECTL set,
# building them first when they are missing.
with_tools = tools_env=$$(hack/tools.sh env); set -a; eval "$$tools_env"; set +a;

.PHONY: all build build-check tools test test-unit test-e2e demo bench fuzz clean

all: build

build:
	$(GO) build -o bin/coredns ./cmd/coredns

tools:
	hack/tools.sh install

test: tools test-unit build-check test-e2e

# build-check builds the CoreDNS of cmd/coredns and checks that it has both plugins.
build-check: build
	bin/coredns -plugins | grep -qx k8s_event
	bin/coredns -plugins | grep -qx kubeapi

test-unit:
	$(GO) test -race -count=1 ./...

test-e2e:
	$(with_tools) $(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) ./test/e2e/...

# demo runs a local control plane and a CoreDNS that reports its log lines
# as events; Ctrl-C stops everything it started.
demo:
	$(GO) build -o bin/coredns-e2e ./test/cmd/coredns
	$(GO) build -o bin/demo ./test/e2e/cmd/demo
	$(with_tools) exec bin/demo -coredns bin/coredns-e2e

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

# fuzz runs every fuzz target of every package for FUZZTIME.
fuzz:
	for pkg in $$($(GO) list ./...); do \
		for target in $$($(GO) test -list '^Fuzz' "$$pkg" | grep '^Fuzz' || true); do \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) "$$pkg"; \
		done; \
	done

clean:
	rm -rf bin
