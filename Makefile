# Two commands for a newcomer:  make demo  (set up + run the demo)   make test  (run the tests)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test docs docs-serve benchmark clean

setup: $(STAMP)

# --no-compile: compiling all 25,000 modules (TensorFlow's, Airflow's...) took 60 s of the setup;
# Python compiles the few it imports, once, when it first imports them.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet --no-compile -e ".[test,examples]"
	touch $(STAMP)

demo: setup
	$(BIN)/mop-airflow demo

test: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25

# The documentation site (docs/, mkdocs.yml): built strict, so a broken link or a missing object fails.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# The warm shard slots against task-parallel trials and plain Keras (the README's row; about 2 minutes
# on 2 cores); docs/performance.md gives every benchmark's command and its current figures.
benchmark: setup
	$(BIN)/python benchmarks/warm_shards.py --model cnn --configs 4 --iterations 3 --shards 2

clean:
	rm -rf .mop_home .pytest_cache build/site
