# The two commands of the README: `make run` (install, then start on the embedded defaults) and
# `make test` (install, then run the whole suite). Both bootstrap .venv idempotently.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=
PYTEST_ARGS ?=
# Two pytest-xdist workers, each module whole and the tests on the shared Ray cluster in one group,
# in file order (tests/conftest.py).
# TEST_WORKERS=0: one process, in file order.
TEST_WORKERS ?= 2

.PHONY: install run test bench lint clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test,render]"
	@touch $(STAMP)

install: $(STAMP)

# `make run` also starts a render worker next to the node when Chromium is installed (WORKER=0: don't).
CHROMIUM := $(shell test -x /usr/bin/chromium && echo /usr/bin/chromium || command -v chromium 2>/dev/null)
WORKER ?= 1
WITH_WORKER := $(if $(and $(CHROMIUM),$(filter-out 0,$(WORKER))),--with-worker,)

run: $(STAMP)
	$(BIN)/prerender-ray up $(WITH_WORKER) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

# ruff over the tree (pyflakes, import order) and mypy over every module (see pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy prerender_ray

bench: $(STAMP)
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
