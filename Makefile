# fairqueue developer commands. Everything installs into .venv; nothing is needed by hand.
#   make demo        fair queueing demo on an embedded PostgreSQL
#   make wheel       fairqueue's wheel in dist/, to pip install into a project (README.md, "Installing")
#   make test        lint, type-check and the whole test suite (embedded PostgreSQL 18; installs
#                    headless Chromium with apt for the admin's browser test if it is missing)
#   make jdbc        PostgreSQL's JDBC jar (apt) for the Spark pipeline and its tests
#   make test-pg15   the test suite again on the machine's PostgreSQL 15 binaries, if present
#   make bench-all   every workload below in sequence. Each writes benchmarks/results/<workload>-<time>.json
#                    and appends a section to docs/benchmarks.md; PgQueuer and Procrastinate run from the
#                    benchmark-only .bench-venv (built on first use). BENCH_ARGS=--quick for a smoke run
#                    (then add --no-doc), e.g. make bench-steady BENCH_ARGS="--quick --no-doc"
#   make bench-drain   drain of 20,000 jobs: fairqueue vs PgQueuer, Procrastinate and the loop (= bench-peers)
#   make bench-steady  steady producers at 200 / 2,000 / 5,000 jobs/s: sustained rate, enqueue->start
#   make bench-fairness Bob floods, Alice trickles; 10 equally loaded channels (Jain's index)
#   make bench-claim   claim latency from 1,000 to 1,000,000 queued jobs, 10 to 10,000 channels
#   make bench-enqueue enqueue latency inside a transaction (1 busy channel / 10,000 channels)
#   make bench-enqueue-async  await fairqueue.aenqueue against fairqueue.enqueue, alternating
#   make bench-held    steady 1,000 jobs/s over 100 and 1 channels while a snapshot is held 60 s
#   make bench-rows    row operations and WAL bytes per job: fairqueue, the fair SQL floor, the loop
#   make bench-bulk    enqueue_many vs bulk_enqueue (COPY), 100,000 jobs
#   make bench-soak    1,000,000 jobs: worker memory and hot table sizes stay flat

VENV    ?= .venv
PY      := $(VENV)/bin/python
PG15    ?= /usr/lib/postgresql/15/bin
PYTEST  ?= $(PY) -m pytest -n 2 --dist loadgroup

# the first Python >= 3.12 on PATH (pyenv's python3 shim honours .python-version in this folder)
PYTHON ?= $(shell for p in python3.12 python3.13 python3; do \
	  if command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; \
	  then command -v $$p; break; fi; done)

.PHONY: demo wheel test test-pg15 lint browser jdbc clean bench-all bench-drain bench-peers bench-steady bench-fairness \
	bench-claim bench-enqueue bench-enqueue-async bench-bulk bench-soak bench-held bench-rows

$(VENV)/.installed-%: pyproject.toml
	@test -n "$(PYTHON)" || { echo "fairqueue needs Python >= 3.12 (try: pyenv install 3.12)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$*]"
	touch $@

demo: $(VENV)/.installed-embedded
	$(VENV)/bin/fairqueue demo

DIST    ?= dist
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)

# pip builds the wheel with hatchling, which it fetches from PyPI into a throwaway environment
wheel:
	@test -n "$(PYTHON)" || { echo "fairqueue needs Python >= 3.12 (try: pyenv install 3.12)"; exit 1; }
	$(PYTHON) -m pip wheel --no-deps -q -w $(DIST) .
	@echo "built $(DIST)/fairqueue-$(VERSION)-py3-none-any.whl"

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint browser jdbc
	$(PYTEST)

# $(call apt_need,CHECK,PACKAGES,WHAT FOR): installs Debian PACKAGES unless the shell test CHECK passes
define apt_need
	@if $(1); then :; \
	else \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  echo "installing $(2) (apt) for $(3)"; \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(2) >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null 2>&1 && \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(2) >/dev/null; } || \
	  echo "could not install $(2): $(3) will fail"; \
	fi
endef

# headless Chromium and its driver, for the Django admin's browser test
browser:
	$(call apt_need,command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1,chromium chromium-driver,the admin browser test)

# PostgreSQL's JDBC driver for the Spark pipeline (Spark cannot fetch it from Maven here)
jdbc:
	$(call apt_need,[ -f /usr/share/java/postgresql.jar ] || [ -n "$$FAIRQUEUE_JDBC_JAR" ],libpostgresql-jdbc-java,the Spark tests)

test-pg15: $(VENV)/.installed-dev
	@if [ -x "$(PG15)/postgres" ]; then \
	  FAIRQUEUE_TEST_PG_BINDIR=$(PG15) $(PYTEST) -m "not slow and not spark"; \
	else echo "no PostgreSQL 15 binaries in $(PG15): skipped"; fi

BENCH_ARGS ?=
# make bench-<name> runs python -m benchmarks.<bench_module_<name>>
bench_module_drain    := peers
bench_module_peers    := peers
bench_module_steady   := steady
bench_module_fairness := fairness
bench_module_claim    := claim_latency
bench_module_enqueue  := enqueue_latency
bench_module_bulk     := bulk_enqueue
bench_module_soak     := soak
bench_module_held     := held_snapshot
bench_module_rows     := row_costs

$(addprefix bench-,drain peers steady fairness claim enqueue bulk soak held rows): $(VENV)/.installed-dev
	$(PY) -m benchmarks.$(bench_module_$(@:bench-%=%)) $(BENCH_ARGS)

bench-enqueue-async: $(VENV)/.installed-dev
	$(PY) -m benchmarks.enqueue_latency --async $(BENCH_ARGS)

# in sequence, never in parallel (each one wants the whole machine)
bench-all: $(VENV)/.installed-dev
	$(MAKE) --no-print-directory -j1 bench-drain bench-steady bench-fairness bench-claim bench-enqueue bench-enqueue-async \
	  bench-bulk bench-soak bench-held bench-rows BENCH_ARGS="$(BENCH_ARGS)"

clean:
	rm -rf $(VENV) .bench-venv .pytest_cache .mypy_cache .ruff_cache dist build
