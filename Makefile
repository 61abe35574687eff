# make test: everything CI runs. make demo: the stale-read demo on a local cluster.
GO ?= go
# A count, not a duration: with -fuzztime=10s, go1.26's fuzz coordinator
# sometimes reports its own deadline as a failure, "context deadline
# exceeded" with no input written (golang/go#75804, fixed in go1.27; seen
# on FuzzLex in this repository). 100000 runs take 4-9 s a target here.
FUZZTIME ?= 100000x

.PHONY: readpath allocs pgrywsqlx test test-pg19-emulated test-pg18 test-pgbouncer pgbouncer test-docker unit vet generate generate-check dockertest redisstore otel prometheus fuzz fuzz-all difftest ormcheck demo bench postgres check-long

test: postgres pgbouncer vet
	@./scripts/pg-version.sh "" "Debian's server: every test, with -race"
	$(GO) test -race -count=1 ./...
	$(MAKE) -j2 --output-sync=target difftest ormcheck pgrywsqlx dockertest redisstore otel prometheus fuzz generate-check readpath allocs
	$(MAKE) test-pg19-emulated test-pg18 test-pgbouncer

# The generated classifier table matches what the server says.
generate-check: generate
	git diff --exit-code -- internal/sqlclass/builtin_gen.go

# The tests that start servers, on another PostgreSQL version (18 comes
# from npm). No PostgreSQL is built from source.
SERVER_TESTS = -run '^(TestIntegration|TestRoundTrips|TestHistory|TestTransparency)'
# The randomized checkers in the runs after the first (which runs their
# defaults, with -race): their faults and grammar are the same on every
# server, so these runs sample fewer: transparency programs (20 in the
# first), pgx's front end's (10), and history checker operations (7000).
# Every run draws new seeds, so the runs add up over CI's history.
SECOND_RUN_PROGRAMS = 5
SECOND_RUN_PGX_PROGRAMS = 3
SECOND_RUN_HISTORY_OPS = 1500
SECOND_RUN = PGRYW_TRANSPARENCY_PROGRAMS=$(SECOND_RUN_PROGRAMS) PGRYW_TRANSPARENCY_PGX_PROGRAMS=$(SECOND_RUN_PGX_PROGRAMS) PGRYW_HISTORY_OPS=$(SECOND_RUN_HISTORY_OPS)

# PostgreSQL 19 is in no registry these machines reach: its WAIT FOR runs
# through pgtest's emulation (PGRYW_EMULATE_PG19=1), a protocol-level
# stand-in in front of each real standby that reports server_version 19.0
# and answers WAIT FOR by 19.0's rules, so wait_method=auto sends it. The
# integration suite (whose TestIntegrationWaitForLockRule asserts the rules
# fired where expected), the history checker and the ORM check run through
# it. It says nothing about 19's speed or its other changes: make
# test-docker with postgres:19 is the real server.
test-pg19-emulated: postgres
	@./scripts/pg-version.sh "" "integration suite, history checker and ORM check through the WAIT FOR emulation (replicas report 19.0)"
	PGRYW_EMULATE_PG19=1 $(SECOND_RUN) $(GO) test -count=1 $(SERVER_TESTS) -skip '^TestIntegrationPooler' .
	cd internal/ormcheck && PGRYW_EMULATE_PG19=1 $(GO) test -count=1 ./...

# The server suite against the official postgres images, one version after
# another, on a machine with a Docker engine (CI has none): how to prove a
# release against the real PostgreSQL 19. DOCKER_VERSIONS picks them, e.g.
# make test-docker DOCKER_VERSIONS=19. Without an engine it fails.
DOCKER_VERSIONS ?= 19 18 17 16 15
test-docker:
	@for v in $(DOCKER_VERSIONS); do \
		echo "== postgres:$$v (Docker): integration suite, history checker"; \
		PGRYW_EXPECT_MAJOR=$$v $(GO) -C internal/dockertest run ./cmd/pgdocker -require -image postgres:$$v \
			$(GO) test -count=1 $(SERVER_TESTS) . || exit 1; \
	done

# (The pooler churn and repoint tests, which say nothing of the server's
# version, run in the first server run only.)
test-pg18: postgres
	@bindir=$$(./scripts/ensure-pg18.sh) && \
	./scripts/pg-version.sh "$$bindir" "integration suite (standbys copied from a stopped primary)" && \
	PGRYW_PG_BINDIR=$$bindir PGRYW_EXPECT_MAJOR=18 $(SECOND_RUN) $(GO) test -count=1 $(SERVER_TESTS) -skip '^TestIntegrationPooler' .

postgres:
	@./scripts/ensure-postgres.sh

pgbouncer:
	@./scripts/ensure-pgbouncer.sh

# Through PgBouncer (Debian's package, 1.18 on Debian 12), one per node on
# loopback (PGRYW_PGBOUNCER): the read-your-writes, transaction, watermark
# and token tests, the history checker and the ORM check, in transaction
# mode (pgx in exec mode) and in session mode; the transparency
# checker in session mode with every server connection used by one client
# only (PGRYW_PGBOUNCER_FRESH=1: what one client leaves in a session, a
# placeholder setting DISCARD ALL keeps, would make pgx's own answers depend
# on which server connection it got). The churn and repoint tests
# (TestIntegrationPooler*) start bouncers of their own in every server run.
POOLER_TESTS = -run '^(TestIntegration(ReadYourWrites|ShortBudgetReadsPrimary|OnTimeoutError|OffIsStale|TransactionsAndSessions|CommitThenFailMovesWatermark|CancelledAfterCommitMovesWatermark|RunOnPrimaryMovesWatermark|MonotonicReads|MonotonicAcrossNodes|ReadsDoNotRaisePoolWatermark|ExecBlockSemantics|OwnSchemaChange|DeferredCaptureSeenElsewhere|SessionTokenAcrossPools|PoolReadYourWrites|SqlcStyle)|TestHistory)$$'
test-pgbouncer: postgres pgbouncer
	@for m in transaction session; do \
		echo "== PgBouncer $$(pgbouncer --version | head -1 | cut -d' ' -f2), $$m mode: integration subset, history checker, ORM check"; \
		PGRYW_PGBOUNCER=$$m PGRYW_HISTORY_OPS=3000 $(GO) test -count=1 $(POOLER_TESTS) . || exit 1; \
		(cd internal/ormcheck && PGRYW_PGBOUNCER=$$m $(GO) test -count=1 ./...) || exit 1; \
	done
	@echo "== PgBouncer, session mode, one client per server connection: transparency checker"
	PGRYW_PGBOUNCER=session PGRYW_PGBOUNCER_FRESH=1 PGRYW_TRANSPARENCY_PROGRAMS=$(SECOND_RUN_PROGRAMS) $(GO) test -count=1 -run '^TestTransparency$$' .

# Regenerates internal/sqlclass/builtin_gen.go (keywords and read-only
# built-in functions) from a server the harness starts.
generate: postgres
	$(GO) generate ./internal/sqlclass

# staticcheck (honnef.co/go/tools), pinned, from the Go module proxy; the
# separate modules are checked too.
STATICCHECK = $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2

vet:
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || (echo "gofmt needed" >&2; exit 1)
	$(GO) vet ./...
	$(STATICCHECK) ./...
	cd internal/ormcheck && $(GO) vet ./... && $(STATICCHECK) ./...
	cd internal/pgquerycheck && $(GO) vet ./... && $(STATICCHECK) ./...
	cd internal/dockertest && $(GO) vet ./... && $(STATICCHECK) ./...
	cd redisstore && $(GO) vet ./... && $(STATICCHECK) ./...
	cd otel && $(GO) vet ./... && $(STATICCHECK) ./...
	cd prometheus && $(GO) vet ./... && $(STATICCHECK) ./...
	cd pgrywsqlx && $(GO) vet ./... && $(STATICCHECK) ./...

unit:
	$(GO) test -count=1 -short ./...

# The differential classifier test links the real PostgreSQL parser (cgo); it
# lives in its own module so pgryw's users never build it.
difftest:
	cd internal/pgquerycheck && $(GO) test -count=1 ./...

# CI fuzzes the lexer and the classifier for a short fixed time. The DSN and
# LSN fuzz targets run their seed corpus in every `go test`; fuzz them with
# `make fuzz-all`.
# The Docker provider (its own module: users never download dockertest).
# Without a Docker engine, as on CI, its tests check that it steps aside.
dockertest:
	cd internal/dockertest && $(GO) test -count=1 ./...

# The Redis TokenStore (its own module); its tests start a real
# redis-server on loopback, installing Debian's package when missing.
redisstore:
	cd redisstore && $(GO) test -race -count=1 ./...

# OpenTelemetry span attributes, and otelsql wrapping pgryw (with its
# sqlcommenter comments) without changing a route; its own module, tested
# against a real primary and replica.
otel:
	cd otel && $(GO) test -race -count=1 ./...

# The Prometheus collector for the per-node stats (its own module), scraped
# over HTTP with a real primary and replica behind it.
prometheus:
	cd prometheus && $(GO) test -race -count=1 ./...

# sqlx, as its users write it, through pgrywsqlx (its own module) against
# real replicas, compared with pgx.
pgrywsqlx:
	cd pgrywsqlx && $(GO) test -race -count=1 ./...

# sqlx and GORM on pgryw against real replicas; its own module, so pgryw's
# users never download them.
ormcheck:
	cd internal/ormcheck && $(GO) test -count=1 ./...

fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzClassify$$' -fuzztime=$(FUZZTIME) ./internal/sqlclass
	$(GO) test -run='^$$' -fuzz='^FuzzLex$$' -fuzztime=$(FUZZTIME) ./internal/sqlclass
	$(GO) test -run='^$$' -fuzz='^FuzzNodeProbe$$' -fuzztime=$(FUZZTIME) ./internal/sqlclass

fuzz-all: fuzz
	$(GO) test -run='^$$' -fuzz='^FuzzParseDSN$$' -fuzztime=$(FUZZTIME) .
	$(GO) test -run='^$$' -fuzz='^FuzzParse$$' -fuzztime=$(FUZZTIME) ./internal/lsn

demo: postgres
	$(GO) run ./cmd/rywbench -demo

bench: postgres
	$(GO) run ./cmd/rywbench

# The randomized history checker (TestHistory) and the transparency checker
# (TestTransparency) for a long run each, without -race:
# make check-long HISTORY_DURATION=30m [HISTORY_SEED=N] [TRANSPARENCY_SEED=N]
# replays a schedule.
HISTORY_DURATION ?= 10m
HISTORY_SEED ?=
TRANSPARENCY_SEED ?=
check-long: postgres
	PGRYW_HISTORY_DURATION=$(HISTORY_DURATION) PGRYW_HISTORY_SEED=$(HISTORY_SEED) \
		$(GO) test -count=1 -timeout=0 -v -run '^TestHistory$$' .
	PGRYW_TRANSPARENCY_DURATION=$(HISTORY_DURATION) PGRYW_TRANSPARENCY_SEED=$(TRANSPARENCY_SEED) \
		$(GO) test -count=1 -timeout=0 -v -run '^TestTransparency$$' .

# Which root files one steady replica read runs code in (coverage of a
# fake-server read; no PostgreSQL needed), held to TestReadPathFiles' bound.
readpath:
	./scripts/readpath.sh

# The allocation tests, without -race (under it sync.Pool drops what it is
# given, and counts mean nothing): pgryw allocates what pgx does.
allocs:
	$(GO) test -count=1 -run 'Allocs$$' .
