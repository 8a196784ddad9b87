# Two commands for a newcomer:  make demo  (set up + run the demo)   make test  (run the tests)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-hosts test-install docs docs-serve benchmark clean

setup: $(STAMP)

# The installed modules are compiled here, on every core (31 s on 2 cores, against pip's 60 s on one):
# where PYTHONDONTWRITEBYTECODE is set (as in many containers and CI images) Python never writes the
# bytecode it compiles, so every process compiled TensorFlow's, Keras's and Airflow's sources again on
# import: 12 s of CPU to import TensorFlow instead of 4.5, 17.6 s for a task host's preload instead of
# 7.4 (2-core AMD EPYC, 2026-11-29). Bytecode is read whatever that variable says. A file that does not
# compile (a package's Python 2 example) is never imported: compileall's exit code is not the setup's.
# The editable install maps operators/ and plugins/ to mop_airflow.operators and .plugins (package-dir, as
# the layout asks), so setuptools installs a finder and prints a note on every setup ("be careful with
# folders named like your package"): the checkout's layout is the one it means, and the note is hidden.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet --no-compile -e ".[test,examples]"
	$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") >/dev/null || true
	touch $(STAMP)

# The demo keeps everything in the checkout's .mop_home (`make clean` deletes it), through MOP_HOME, the
# variable every process reads (the demo, Airflow's, its tasks'), not the ~/mop_airflow default.
# From a shell, `export MOP_HOME=$PWD/.mop_home` reaches the same project.
demo: setup
	MOP_HOME=$(CURDIR)/.mop_home $(BIN)/mop-airflow demo

# Three workers on two cores: two take the files that need a real scheduler (each on an embedded Airflow
# of its own), which mostly wait on heartbeat, stall and wait bounds, while the third computes (tests/conftest.py).
# 1,729 tests in 17:53 (6 % of the CPU idle); 22:04 before (18 % idle), with two workers and one such Airflow
# (quiet 2-core AMD EPYC, 2026-11-29).
# The 10,000 simulated schedules first, alone on every core (marked `cores`: beside the other files on 2 cores
# they took 224.5 s of the 180 allowed), printing their line of figures (-s), then the rest three files at a time.
test: setup
	$(BIN)/python -m pytest -q -s -m cores
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=25 -m "not cores"

# The search across hosts (tests/test_hosts.py): network namespaces as a control host, a storage host and
# four shard hosts, a host cut off, lost and replaced, a queue no host serves. Needs root; `make test` skips it.
test-hosts: setup
	MOP_TEST_HOSTS=1 $(BIN)/python -m pytest -q tests/test_hosts.py

# Every page's install line in a fresh virtual environment, the base install for real (tests/test_install.py):
# about 5 minutes where pip finds the wheels near, a quarter of an hour and more where it downloads TensorFlow
# and Airflow (.ci/run runs it beside make test-hosts).
test-install: setup
	MOP_TEST_INSTALL=1 $(BIN)/python -m pytest -q tests/test_install.py

# The documentation site (docs/, mkdocs.yml): built strict, so a broken link or a missing object fails.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# The warm shard slots against task-parallel trials and plain Keras, 3 runs in turn (the README's row; about
# 6 minutes on 2 cores); docs/performance.md gives every benchmark's command and its current figures.
benchmark: setup
	$(BIN)/python benchmarks/warm_shards.py --model cnn --configs 4 --iterations 3 --shards 2 --runs 3

clean:
	rm -rf .mop_home .pytest_cache build/site

# The deployment tests (tests/deploy/): docker/worker.Dockerfile built with podman, every Airflow container of the
# official Helm chart's rendering and every Airflow service of docker/docker-compose.yaml started from it, a search
# through each. As root, with podman, runc, debootstrap and redis-server (.ci/run installs them); every container,
# image, volume and network they make is removed at the end.
# MOP_DEPLOY_IMAGE and MOP_DEPLOY_DEBIAN name images built before (`python -m tests.deploy.prebuild`, yours
# to remove), as .ci/run builds them beside make test-hosts.
.PHONY: test-deploy
test-deploy: setup
	MOP_DEPLOY_TESTS=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/deploy --durations=10
