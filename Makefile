# One entry point. `make demo` installs what is missing and runs the demo;
# `make test` installs what is missing and runs every test tier.
VENV ?= .venv
CDC := $(VENV)/bin/cdc
PYTEST := $(VENV)/bin/pytest
RUFF := $(VENV)/bin/ruff

.PHONY: help install install-s3 demo up down status test test-long test-cluster test-scale test-fast test-integration lint format \
	bench-snapshot bench-catchup bench-streaming bench-floor bench-batch-cost bench-derived bench-resync bench-snapshot-resume bench-verify bench-class-archive bench-report chaos mutants lock compose-pin fuzz

help:
	@echo "make demo              install, start the stack, run the demo shop with a live dashboard"
	@echo "make test              install, lint, then the unit and integration tests on the real stack (CI)"
	@echo "make test-long         the long forms (the short chaos run, the schema zoo, a 10,000-key repair) and the Spark cluster test"
	@echo "make test-cluster      the services as clusters: three Kafka brokers (replicas, a broker lost), two Connect workers (a worker lost), the Spark cluster"
	@echo "make test-scale        the cluster profile at scale: a worker lost under load, 300,000 changes with no rows through the driver, the warehouse on S3"
	@echo "make test-fast         unit tests only (pure logic, seconds)"
	@echo "make test-integration  integration tests against the real stack"
	@echo "make bench-snapshot    snapshot of 2 M rows: ours, copy-to-null and Debezium's"
	@echo "make bench-catchup     1 M changes: capture alone, then apply per store"
	@echo "make bench-streaming   pgbench at 500 and 1,000 TPS: latency per store, memory, cores"
	@echo "make bench-floor       the engine's floor: the simplest Kafka -> foreachBatch -> Redis query"
	@echo "make bench-batch-cost  one micro-batch of the apply job, phase by phase, idle and at 200 changes/s"
	@echo "make bench-class-archive  a Spark driver's start with its class archive and without (no stack)"
	@echo "make bench-derived     the demo's derived data at 50 TPS: state and latency per view"
	@echo "make bench-resync      cdc resync after a lost slot against a full re-snapshot: 1 M rows, pgbench scale 2"
	@echo "make bench-snapshot-resume  a 2 M-row snapshot killed at half and resumed, against one not interrupted"
	@echo "make bench-verify      cdc verify phase by phase: the demo's data and views, pgbench's 4 tables, 14 small tables"
	@echo "make bench-report      the latest figures into docs/benchmarks.md's table"
	@echo "make chaos             the long chaos run (>= 12 min, every fault 3 times): figures to bench/results/chaos.jsonl"
	@echo "make mutants           one-line mutants of the write guards, each against its tests (all must fail)"
	@echo "make fuzz              the fuzz tests with many more examples (FUZZ_EXAMPLES=20000 each)"
	@echo "make lock              requirements.lock from pyproject.toml, hashed (UPGRADE=1: newest allowed)"
	@echo "make compose-pin       pin docker-compose.yml's images by digest (needs registry access)"
	@echo "make install | up | down | status | lint | format"

install:
	./install.sh

# and Spark's S3 connector (hadoop-aws and the AWS SDK, about 690 MB): a warehouse on
# object storage, and its test in test-long
install-s3:
	CDC_INSTALL_S3=1 ./install.sh

demo: install
	$(CDC) demo

up: install
	$(CDC) up

down:
	$(CDC) down

status:
	$(CDC) status

lint:
	$(RUFF) check .
	$(RUFF) format --check .
	$(VENV)/bin/mypy cdc

format:
	$(RUFF) format .
	$(RUFF) check --fix .

# CI's tier: every contract, on the default PostgreSQL major; everything else (the long
# forms, the other majors, the demo's own run) is `make test-long` (docs/tests.md)
test: install lint
	$(PYTEST) tests -m "not long and not chaos and not cluster and not scale" --durations=40

# the long forms, then the core tests on each other PostgreSQL major (14, 16, 17, 18)
test-long: install-s3
	$(PYTEST) tests -m "long or chaos or cluster" --durations=10
	for major in 14 16 17 18; do \
	  CDC_TEST_POSTGRES_VERSION=$$major $(PYTEST) tests -m "pg_matrix and not long" || exit 1; \
	done

# the services run as clusters (issue 69; outside CI's time budget, and in test-long):
# three KRaft brokers started by the test, the Spark standalone cluster; a pytest run
# per module, so one stack runs at a time (the broker-loss test runs its own)
test-cluster: install
	for module in $$(grep -l "mark.cluster" tests/integration/test_*.py); do \
	  $(PYTEST) $$module -m cluster --durations=5 || exit 1; \
	done

# the cluster profile at scale (issue 68; outside CI's time budget): a Spark standalone
# master and two workers started by the test, the local S3 server; under load with a
# worker lost, a 300,000-change catch-up with no rows through the driver, the warehouse
# on S3 verified and repaired
test-scale: install-s3
	$(PYTEST) tests -m scale --durations=5

test-fast:
	$(PYTEST) tests/unit -q

test-integration:
	$(PYTEST) tests/integration

# each benchmark starts the local stack if it is not up, prints its figures and
# appends them to bench/results/<name>.jsonl
bench-snapshot: up
	$(VENV)/bin/python bench/snapshot_throughput.py

bench-catchup: up
	$(VENV)/bin/python bench/catchup.py

bench-streaming: up
	$(VENV)/bin/python bench/streaming.py

bench-floor: up
	$(VENV)/bin/python bench/floor.py

bench-batch-cost: up
	$(VENV)/bin/python bench/batch_cost.py

bench-derived: up
	$(VENV)/bin/python bench/derived.py

bench-resync: up
	$(VENV)/bin/python bench/resync.py

bench-snapshot-resume: up
	$(VENV)/bin/python bench/snapshot_resume.py

bench-class-archive: install
	$(VENV)/bin/python bench/class_archive.py

bench-verify: up
	$(VENV)/bin/python bench/verify.py --dataset demo
	$(VENV)/bin/python bench/verify.py --dataset pgbench --scale 2
	$(VENV)/bin/python bench/verify.py --dataset small

bench-report:
	$(VENV)/bin/python bench/report.py --write

# a stack of its own on free ports; every fault kind 3 times under load, then every store
# compared with PostgreSQL; prints its figures and appends them to bench/results/chaos.jsonl
chaos: install
	$(VENV)/bin/python -m tests.chaos.run --minutes 12 --rounds 3 --results bench/results/chaos.jsonl

# one-line mutants of the guards (positions, TOAST, deletes, the snapshot seam, verify),
# each run against the tests meant to kill it on a shared stack of its own
mutants: install
	$(VENV)/bin/python -m tests.mutants

# requirements.lock: every Python package install.sh installs (the project's dependencies, its
# dev extra, and pip + setuptools for the --no-build-isolation install of the project itself),
# exact versions with the sha256 of every published file, for Linux, macOS and Windows.
# It keeps the pins already in the lock; UPGRADE=1 moves each to the newest pyproject allows.
# uv (the resolver) lives in a venv of its own under .cache, not in the project's.
LOCK_UV_VERSION := 0.13.9
LOCK_TOOLS := .cache/lock-tools
lock:
	@test -x $(LOCK_TOOLS)/bin/uv || { python3 -m venv $(LOCK_TOOLS) \
		&& $(LOCK_TOOLS)/bin/pip install --quiet uv==$(LOCK_UV_VERSION); }
	printf 'pip\nsetuptools>=68\n' | $(LOCK_TOOLS)/bin/uv pip compile --quiet pyproject.toml - \
		--extra dev --universal --python-version 3.11 --generate-hashes \
		--custom-compile-command "make lock" $(if $(UPGRADE),--upgrade) -o requirements.lock

# rewrite every `image: name:tag` of docker-compose.yml as `name:tag@sha256:<digest>` (the
# digest of the tag's multi-platform index today); needs Docker with registry access
compose-pin:
	@command -v docker >/dev/null || { echo "compose-pin: needs the docker client" >&2; exit 1; }
	@for ref in $$(sed -n 's/^ *image: *\([^@ ]*\).*/\1/p' docker-compose.yml); do \
		digest=$$(docker buildx imagetools inspect "$$ref" --format '{{json .Manifest.Digest}}' | tr -d '"') \
			&& case "$$digest" in sha256:*) ;; *) false;; esac \
			|| { echo "compose-pin: cannot resolve $$ref" >&2; exit 1; }; \
		sed -i.bak "s|^\( *image: *\)$$ref\(@sha256:[0-9a-f]*\)\{0,1\}\( .*\)\{0,1\}$$|\1$$ref@$$digest|" \
			docker-compose.yml && rm -f docker-compose.yml.bak; \
		echo "$$ref@$$digest"; \
	done

# the fuzz tests of everything that parses outside input (tests/unit/*/test_fuzz_*.py), each
# with FUZZ_EXAMPLES examples instead of the fast tier's few hundred
fuzz:
	HYPOTHESIS_PROFILE=fuzz $(PYTEST) tests/unit/*/test_fuzz_*.py -q
