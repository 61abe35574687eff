# make test: everything CI runs. make demo: the stale-read demo on a local cluster.
GO ?= go
FUZZTIME ?= 10s

.PHONY: test unit vet fuzz fuzz-all difftest ormcheck demo bench postgres

test: postgres vet
	$(GO) test -race -count=1 ./...
	$(MAKE) difftest ormcheck fuzz

postgres:
	@./scripts/ensure-postgres.sh

vet:
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || (echo "gofmt needed" >&2; exit 1)
	$(GO) vet ./...

unit:
	$(GO) test -count=1 -short ./...

# The differential classifier test links the real PostgreSQL parser (cgo); it
# lives in its own module so pgryw's users never build it.
difftest:
	cd internal/pgquerycheck && $(GO) test -count=1 ./...

# CI fuzzes the lexer and the classifier for a short fixed time. The DSN and
# LSN fuzz targets run their seed corpus in every `go test`; fuzz them with
# `make fuzz-all`.
# sqlx and GORM on pgryw against real replicas; its own module, so pgryw's
# users never download them.
ormcheck:
	cd internal/ormcheck && $(GO) test -count=1 ./...

fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzClassify$$' -fuzztime=$(FUZZTIME) ./internal/sqlclass
	$(GO) test -run='^$$' -fuzz='^FuzzLex$$' -fuzztime=$(FUZZTIME) ./internal/sqlclass

fuzz-all: fuzz
	$(GO) test -run='^$$' -fuzz='^FuzzParseDSN$$' -fuzztime=$(FUZZTIME) .
	$(GO) test -run='^$$' -fuzz='^FuzzParse$$' -fuzztime=$(FUZZTIME) ./internal/lsn

demo: postgres
	$(GO) run ./cmd/rywbench -demo

bench: postgres
	$(GO) run ./cmd/rywbench
