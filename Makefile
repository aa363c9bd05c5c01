# bootc-fleet. `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO ?= go
BIN := bin
K8S_VERSION ?= 1.37.2
ENVTEST_ASSETS ?= $(HOME)/.cache/bootc-fleet/envtest/$(K8S_VERSION)
CRD_DIR := packaging/crd
GOTEST_FLAGS ?=
# The version the binaries print and the images are tagged with.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
IMAGE_REPO ?= quay.io/bootc-fleet
# Global options of buildah/podman; vfs works as root anywhere, also nested.
BUILDER_OPTS ?= --storage-driver vfs
# golangci-lint v2, pinned in its own module (tools/golangci-lint/go.mod) so
# its dependencies stay out of the product's; built from the module proxy on
# first use and cached by the go command.
GOLANGCI_LINT := $(GO) tool -modfile=tools/golangci-lint/go.mod golangci-lint
# Assets are built once from the Go module proxy (~6 min cold) and reused.
KUBEBUILDER_ASSETS = $(shell ENVTEST_KUBECTL=1 K8S_VERSION=$(K8S_VERSION) bash tests/envtest/install-envtest.sh $(ENVTEST_ASSETS))

##@ General
.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-12s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Build
.PHONY: build
build: ## Build bootc-fleet-agent, bootc-fleet-coordinator and the kubectl plugin kubectl-bootc_fleet into bin/, as the release does (static, stripped).
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o $(BIN)/ ./cmd/bootc-fleet-agent ./cmd/bootc-fleet-coordinator ./cmd/kubectl-bootc_fleet

.PHONY: image
image: ## Build the coordinator and agent images (buildah or podman) as OCI archives in bin/images/, tagged $(VERSION).
	BUILDER_OPTS="$(BUILDER_OPTS)" IMAGE_REPO="$(IMAGE_REPO)" bash packaging/build-images.sh --version "$(VERSION)" --out $(BIN)/images

.PHONY: generate
generate: ## Regenerate deepcopy code and CRD YAML from api/, and the chart's static templates.
	$(GO) tool controller-gen object paths=./api/...
	$(GO) tool controller-gen crd paths=./api/... output:crd:artifacts:config=$(CRD_DIR)
	$(GO) run ./packaging/crdpatch $(CRD_DIR)/*.yaml
	bash packaging/gen-chart.sh

.PHONY: chart
chart: ## Regenerate packaging/chart/templates/ from packaging/ (all but the templated Deployment).
	bash packaging/gen-chart.sh

##@ Release
.PHONY: release
release: ## Build release VERSION=vX.Y.Z into bin/release/VERSION: binaries and images (linux/amd64, linux/arm64), manifests, chart, SHA256SUMS.
	@[[ "$(origin VERSION)" == "command line" || "$(origin VERSION)" == environment ]] || { echo "make release needs VERSION=vX.Y.Z"; exit 2; }
	@[[ "$(VERSION)" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$$ ]] || { echo "VERSION=$(VERSION) is not vX.Y.Z"; exit 2; }
	@grep -q '^## $(VERSION)\b' CHANGELOG.md || { echo "CHANGELOG.md has no '## $(VERSION)' section"; exit 2; }
	VERSION="$(VERSION)" KUBECTL="$(KUBEBUILDER_ASSETS)/kubectl" HELM="$$(bash packaging/install-helm.sh)" \
	  BUILDER_OPTS="$(BUILDER_OPTS)" IMAGE_REPO="$(IMAGE_REPO)" bash packaging/release.sh $(BIN)/release/$(VERSION)

##@ Demo
.PHONY: demo
demo: ## Roll v1 -> v2 -> v2.1, a bad v3 the canary catches and rolls back, then v4, live over 8 nodes running the real agent, real coordinator, local API server; check I1-I5.
	KUBEBUILDER_ASSETS="$(KUBEBUILDER_ASSETS)" $(GO) run ./cmd/bootc-fleet-demo $(DEMO_FLAGS)

##@ Check
.PHONY: verify
verify: ## gofmt, go vet, golangci-lint, the programs link no test code, and generated files up to date.
	@out=$$(gofmt -l $$(git ls-files '*.go') 2>&1); if [[ -n "$$out" ]]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@if $(GO) list -deps ./cmd/... | grep -x testing; then echo "./cmd/... links package testing"; exit 1; fi
	$(GOLANGCI_LINT) run ./...
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	  cp -r api $(CRD_DIR) packaging/chart/templates "$$tmp"/; \
	  $(MAKE) --no-print-directory generate >/dev/null; \
	  if ! git diff --quiet --no-index "$$tmp/api" api || ! git diff --quiet --no-index "$$tmp/crd" $(CRD_DIR) || \
	     ! git diff --quiet --no-index "$$tmp/templates" packaging/chart/templates; then \
	    git diff --no-index "$$tmp/api" api || true; git diff --no-index "$$tmp/crd" $(CRD_DIR) || true; \
	    git diff --no-index "$$tmp/templates" packaging/chart/templates || true; \
	    echo "generated files are out of date: run 'make generate' (or 'make chart') and commit"; exit 1; fi

.PHONY: lint
lint: ## golangci-lint (.golangci.yml): govet, staticcheck, revive, unused, errorlint, funlen (80 lines, product code).
	$(GOLANGCI_LINT) run ./...

.PHONY: envtest
envtest: ## Build (once) the kube-apiserver and etcd the tests run against.
	@echo "KUBEBUILDER_ASSETS=$(KUBEBUILDER_ASSETS)"

.PHONY: test
test: ## Run every test, including those against a real kube-apiserver + etcd.
	KUBEBUILDER_ASSETS="$(KUBEBUILDER_ASSETS)" BOOTC_FLEET_REQUIRE_ENVTEST=1 $(GO) test $(GOTEST_FLAGS) -count=1 -timeout 40m ./...

.PHONY: chaos
chaos: ## Randomized fault campaign over SEEDS seeds (default 100), BATCH (default 20) pools at a time.
	KUBEBUILDER_ASSETS="$(KUBEBUILDER_ASSETS)" BOOTC_FLEET_REQUIRE_ENVTEST=1 $(GO) test -count=1 -timeout 180m ./tests/fleet \
	  -run '^TestChaos$$' -v -seeds $${SEEDS:-100} -batch $${BATCH:-20} 2>&1 | grep --line-buffered -E '^(chaos|--- |FAIL|ok|PASS)|violated|problem:|replay:|^ +\+|^ +(node|lease) '

.PHONY: bench
bench: ## Benchmarks: parsers, decision, planner, resolver, agent idle cost, fleet scale.
	KUBEBUILDER_ASSETS="$(KUBEBUILDER_ASSETS)" $(GO) test -count=1 -run '^$$' -bench . -benchmem -timeout 30m \
	  ./api/... ./internal/... ./tests/fleet/...

.PHONY: bench-bound
bench-bound: ## Rollout vs its lower bound, from the pool's creation and from an image change: BENCH_NODES=100 (1000,5000 on a quiet machine), BENCH_AGENTS=real,light, BENCH_RUNS=1 (5: the median of 5), BENCH_FILTER.
	KUBEBUILDER_ASSETS="$(KUBEBUILDER_ASSETS)" BOOTC_FLEET_REQUIRE_ENVTEST=1 BENCH_NODES="$${BENCH_NODES:-100}" BENCH_RUNS="$${BENCH_RUNS:-1}" \
	  $(GO) test -count=1 -run '^$$' -bench '^BenchmarkRolloutBound$$'"$${BENCH_FILTER:-}" -benchtime 1x -timeout 120m ./tests/fleet/

.PHONY: fuzz
fuzz: ## Run every fuzz target in the tree (each func Fuzz* of a _test.go) for FUZZTIME (default 20s).
	@found=$$(grep -r --include='*_test.go' --exclude-dir=.git --exclude-dir=testdata -o '^func Fuzz[A-Za-z0-9_]*' . | sort -u); \
	  if [[ -z "$$found" ]]; then echo "no fuzz targets found"; exit 1; fi; \
	  while IFS=: read -r file fn; do \
	    dir=$$(dirname "$$file"); target=$${fn#func }; \
	    echo "== $$dir $$target"; \
	    $(GO) test "$$dir" -run '^$$' -fuzz "^$$target\$$" -fuzztime "$${FUZZTIME:-20s}"; \
	  done <<< "$$found"
