# The two commands of the README: `make run` (install, then start on the embedded defaults) and
# `make test` (install, then run the whole suite). Both bootstrap .venv idempotently.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=
PYTEST_ARGS ?=
# Four pytest-xdist workers on two cores: the suite waits more than it computes (the in-process
# modules spent 400 s of wall on 145 s of CPU, asleep in graces, timeouts and windows of real time;
# the Ray groups wait on their clusters), so more lanes overlap the waits with work: four took 325 s
# where three took 351 and two 434-467. Each module whole and the tests on the shared Ray cluster in
# one group, in file order (tests/conftest.py). TEST_WORKERS=0: one process, in file order.
TEST_WORKERS ?= 4

.PHONY: install lock run test test-latest bench lint clean sim

# Installs exactly what requirements.lock pins (hashes checked, build tools included), so a fresh
# machine gets what CI tested; the project itself goes in editable, with no dependency resolution.
# pip compiles what it installs but not an editable project: compiled here, every process (each Ray
# actor, each CLI call) loads its bytecode instead of compiling the sources again, also where
# PYTHONDONTWRITEBYTECODE is set (a stale file is ignored: Python checks each source's mtime).
$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --require-hashes --no-deps -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	$(BIN)/python -m compileall -q prerender_ray tests bench >/dev/null
	@touch $(STAMP)

# The modules of prerender_ray/native/modules.txt compiled with mypyc, again whenever one of them
# changes; where they cannot be (no compiler), the build says why and they run from source.
NATIVE := prerender_ray/native/manifest.json
NATIVE_SOURCES := $(shell grep -v '^\#' prerender_ray/native/modules.txt)
$(NATIVE): $(STAMP) prerender_ray/native/modules.txt prerender_ray/native/build.py $(NATIVE_SOURCES)
	$(BIN)/python -m prerender_ray.native.build

install: $(STAMP) $(NATIVE)

# Regenerate the lock from pyproject.toml's ranges with uv from PyPI: keeps the pinned versions that
# still fit and adds what is new; `make lock UPGRADE=--upgrade` moves every pin to the newest allowed.
UPGRADE ?=
lock:
	@test -x $(VENV)-tools/bin/uv || ($(PYTHON) -m venv $(VENV)-tools && $(VENV)-tools/bin/pip install -q uv)
	$(VENV)-tools/bin/uv pip compile pyproject.toml requirements-build.in --extra test --extra render \
	  --generate-hashes --universal --python-version 3.11 $(UPGRADE) -o requirements.lock

# The suite against the newest releases pyproject.toml allows (not the lock), in its own venv: finds
# the next release that breaks us before a user does.
test-latest:
	@test -x $(VENV)-latest/bin/python || $(PYTHON) -m venv $(VENV)-latest
	$(VENV)-latest/bin/python -m pip install -q --upgrade pip
	$(VENV)-latest/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e ".[test,render]"
	$(VENV)-latest/bin/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

# `make run` also starts a render worker next to the node when Chromium is installed (WORKER=0: don't).
CHROMIUM := $(shell test -x /usr/bin/chromium && echo /usr/bin/chromium || command -v chromium 2>/dev/null)
WORKER ?= 1
WITH_WORKER := $(if $(and $(CHROMIUM),$(filter-out 0,$(WORKER))),--with-worker,)

run: $(STAMP) $(NATIVE)
	$(BIN)/prerender-ray up $(WITH_WORKER) $(ARGS)

test: $(STAMP) $(NATIVE)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

# The simulated cluster over more seeds than CI's fixed set (tests/sim/): `make sim SEEDS=500`;
# SIM_ARGS passes more (`--first 5000 --steps 200 --nodes 5 --strays`, `--script minority`). PYTHONHASHSEED is fixed so
# that a printed seed replays the same way in another process.
SEEDS ?= 200
SIM_ARGS ?=
sim: $(STAMP) $(NATIVE)
	PYTHONHASHSEED=0 $(BIN)/python -m tests.sim $(SEEDS) $(SIM_ARGS)

# ruff over the tree (pyflakes, import order) and mypy over every module (see pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy prerender_ray

bench: $(STAMP) $(NATIVE)
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(VENV)-latest $(VENV)-tools .pytest_cache .hypothesis build/native $(NATIVE)
	find -L prerender_ray -name '*.so' -delete
