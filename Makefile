# One entry point. `make demo` installs what is missing and runs the demo;
# `make test` installs what is missing and runs every test tier.
VENV ?= .venv
CDC := $(VENV)/bin/cdc
PYTEST := $(VENV)/bin/pytest
RUFF := $(VENV)/bin/ruff

.PHONY: help install demo up down status test test-fast test-integration lint format

help:
	@echo "make demo              install, start the stack, run the demo shop with a live dashboard"
	@echo "make test              install, lint, then every test (unit + integration on the real stack)"
	@echo "make test-fast         unit tests only (pure logic, seconds)"
	@echo "make test-integration  integration tests against the real stack"
	@echo "make install | up | down | status | lint | format"

install:
	./install.sh

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

format:
	$(RUFF) format .
	$(RUFF) check --fix .

test: install lint
	$(PYTEST) tests

test-fast:
	$(PYTEST) tests/unit -q

test-integration:
	$(PYTEST) tests/integration
