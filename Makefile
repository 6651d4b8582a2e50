# edgeagent — the project's vocabulary. CI calls `make test` (through .ci/run).
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
# nethttpomithttp2 leaves net/http's bundled HTTP/2 out (0.5 MiB): the
# status endpoint is plain HTTP/1.1. packaging.BuildTags must match.
TAGS    := nethttpomithttp2
BUILD   := CGO_ENABLED=0 $(GO) build -trimpath -tags '$(TAGS)' -ldflags '$(LDFLAGS)'
ARGS    ?=
# Packages with fuzz targets and the targets' names, for `make fuzz`.
# `make test` gives each target a count (20000x), not a duration: Go 1.26's
# fuzz coordinator can fail a duration-bounded run with a bare "context
# deadline exceeded" when its deadline races a worker (golang/go#75804,
# fixed in Go 1.27), which failed a CI run with no crasher written.
FUZZTIME ?= 60s

.PHONY: build test test-race test-window test-armv7 bench fuzz demo cross deb lint check clean

build:
	$(BUILD) -o bin/edgeagent ./cmd/edgeagent

# `cross` and the nfpm tool build first, outside the test timeout, so the
# packaging tests find the build cache warm. The two longest packages are
# named first so that they start first: in ./... order window came last
# and ran alone for its last minutes (make test took 637 s, session 49).
# test-race and test-window run side by side.
test: lint cross
	$(GO) tool nfpm --version >/dev/null
	$(MAKE) --no-print-directory -j2 test-race test-window
	$(MAKE) --no-print-directory fuzz FUZZTIME=20000x

test-race:
	$(GO) test -race -timeout 9m ./testrig/ ./window/ ./...

# The window stage's stream tests run one case each under -race
# (firstUnderRace); every case runs here, six times faster without it,
# beside test-race.
test-window:
	$(GO) test -timeout 5m ./window/

# 32-bit ARM, the CPU of many gateways: vet every package for it (an
# untyped constant past 2^31 in an int), and run the engine's, storage's,
# wire format's and config's tests under user-mode emulation (qemu-arm-static,
# which .ci/run installs). The two tests that start a copy of their own
# binary are skipped: the emulator is not registered with the kernel here.
ARMV7_PKGS := ./window/... ./buffer/... ./internal/... ./uplink/wire/... ./config/...
test-armv7:
	GOOS=linux GOARCH=arm GOARM=7 CGO_ENABLED=0 $(GO) vet ./...
	GOOS=linux GOARCH=arm GOARM=7 CGO_ENABLED=0 $(GO) test -exec qemu-arm-static -timeout 20m \
	  -skip '^(TestDeterminismAcrossKills|TestCrashBeforeLocalPublish)$$' $(ARMV7_PKGS)

bench: build
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m ./... | tee bench.txt

fuzz:
	@for dir in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -r -n1 dirname | sort -u); do \
	  for t in $$(grep -h '^func Fuzz' $$dir/*_test.go | sed 's/func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
	    echo "fuzz $$dir $$t $(FUZZTIME)"; \
	    $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$dir || exit 1; \
	  done; \
	done

# The rig runs as a built binary, not through `go run`, which exits 1
# after a Ctrl-C whatever the program returned. The rig takes the
# terminal's foreground for itself, so a Ctrl-C does not reach make either
# (make would exit by the signal after the summary): `make demo` exits
# with the rig's status, 0 after a pass (docs/testrig.md).
demo: build
	$(GO) build -o bin/edgerig ./testrig/cmd/edgerig
	bin/edgerig demo --agent bin/edgeagent $(ARGS)

cross:
	mkdir -p dist
	GOOS=linux GOARCH=arm GOARM=6 $(BUILD) -o dist/edgeagent-linux-armv6 ./cmd/edgeagent
	GOOS=linux GOARCH=arm GOARM=7 $(BUILD) -o dist/edgeagent-linux-armv7 ./cmd/edgeagent
	GOOS=linux GOARCH=arm64 $(BUILD) -o dist/edgeagent-linux-arm64 ./cmd/edgeagent
	GOOS=linux GOARCH=amd64 $(BUILD) -o dist/edgeagent-linux-amd64 ./cmd/edgeagent

deb: cross
	$(GO) run ./packaging/cmd/mkdeb -dist dist -version '$(VERSION)'

lint:
	@bad=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$bad" ]; then echo "gofmt needed: $$bad"; exit 1; fi
	$(GO) vet ./...

check: lint test

clean:
	rm -rf bin dist bench.txt demo-data
