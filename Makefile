# Set-up and everyday targets. `make test` and `make demo` work on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# The project installed editable as a path in a .pth file (setuptools' compat mode), not
# through the import hook of the default mode: the hook's module (and pathlib) loaded at the
# start of every Python of the venv, 15 ms of each start's 30 ms, and the suite starts
# thousands (commands, node agents, units, enrolments).
EDITABLE := --config-settings editable_mode=compat

.PHONY: test test-fast test-py310 bytecode native compiler browser netns demo bench chaos wheelhouse clean

$(STAMP): setup.cfg pyproject.toml
	@# uv resolves, downloads and byte-compiles in parallel: a fresh .venv in ~12 s where pip
	@# took 25-35 s (README, design notes). The venv is made without pip (ensurepip alone
	@# took 3 s) and uv comes from this Python's pip; pip itself (the nodes' wheelhouse
	@# carries it) is installed with the rest. pip where uv cannot be had.
	@test -x $(BIN)/python || $(PYTHON) -m venv --without-pip $(VENV)
	@if $(PYTHON) -m pip --python $(BIN)/python install -q --disable-pip-version-check uv \
	      >/dev/null 2>&1 || { $(BIN)/python -m ensurepip -q >/dev/null 2>&1 && \
	      $(BIN)/python -m pip install -q --disable-pip-version-check uv >/dev/null 2>&1; }; then \
	  echo "$(BIN)/uv pip install --compile-bytecode $(EDITABLE) -e '.[test]' pip"; \
	  $(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode $(EDITABLE) -e '.[test]' pip; \
	else \
	  echo "$(BIN)/python -m pip install -e '.[test]' (no uv)"; \
	  { $(BIN)/python -m pip --version >/dev/null 2>&1 || $(BIN)/python -m ensurepip -q; } && \
	  $(BIN)/python -m pip install -q --upgrade pip && \
	  $(BIN)/python -m pip install -q $(EDITABLE) -e '.[test]'; \
	fi
	@touch $(STAMP)

# Compile the project's modules once: with PYTHONDONTWRITEBYTECODE set (as on CI machines)
# every test process, node agent and unit would otherwise compile them again.
# Pytest's assertion rewriting of the test modules is cached the same way, by one collection,
# instead of by each of the TEST_WORKERS processes rewriting all of them again.
bytecode: $(STAMP) native
	@$(BIN)/python -m compileall -q -j 2 elasticslice troy bench tests
	@PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest --collect-only -q -p no:cacheprovider >/dev/null

# The whole suite, in parallel: TEST_WORKERS processes (most tests wait on servers, boots and
# subprocesses: with 6 the 2 cores were idle 6.7% of a fresh-clone run, when every worker
# waited at once; with 7, 3.5% and the run 273 s where 6 took 280-305 s; 8 spent more CPU
# on contention), worksteal for tests of very different lengths. The fast tier is
# CPU-bound: FAST_WORKERS.
TEST_WORKERS ?= 7
FAST_WORKERS ?= 4
PYTEST_ARGS  ?=
# The tests' files (pytest's tmp_path: the box's nodes, their environments) on tmpfs where
# there is one: the suite boots about a hundred nodes that create and delete thousands of
# files, and on ext4 creating files among recently deleted ones cost the kernel up to 2 s
# of CPU per node environment (perf: ext4's recently_deleted()), 0.16 s on tmpfs. Pytest
# keeps the last 3 runs' folders there (0700 each), as under /tmp; the folder itself is 0755
# (a test runs a node as user nobody from it). TEST_TMPDIR= : $TMPDIR as it is.
TEST_TMPDIR ?= $(shell test -d /dev/shm && test -w /dev/shm && echo /dev/shm/elasticslice-tests-$$(id -u))
TMP_ENV := $(if $(TEST_TMPDIR),mkdir -p $(TEST_TMPDIR) && chmod 755 $(TEST_TMPDIR) && TMPDIR=$(TEST_TMPDIR))
test:
	@$(MAKE) --no-print-directory -j2 browser netns bytecode
	$(TMP_ENV) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The optional C modules, built next to their sources with this Python's compiler (a second
# or two; rebuilt when a source changes): troy/_spawn.c runs units' processes without the GIL
# (troy.native), elasticslice/rspec/_fastrspec.c reads RSpecs at about libxml2's own speed
# against the libxml2 headers in lxml's wheel (docs/rspec.md, "Performance"). Without a
# compiler, one line each says Python does the work (the same results).
native: $(STAMP) compiler
	@$(BIN)/python -m troy.native
	@$(BIN)/python -m elasticslice.rspec.fastbuild
	@$(BIN)/python -m elasticslice.rpc.fastxmlbuild

# A C compiler (Debian's gcc) for the C modules: installed when missing where this is
# root on Debian; elsewhere Python does their work. After netns, before browser: one
# apt-get at a time.
compiler: netns
	@command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q --no-install-recommends gcc libc6-dev >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && \
	      apt-get install -y -q --no-install-recommends gcc libc6-dev >/dev/null; } && \
	    echo "compiler: installed Debian's gcc (the C modules)"; \
	  else echo "compiler: no C compiler and not root on Debian: Python does the C modules' work"; fi; }

# Debian's Chromium, for the tests that take screenshots of what users watch (the Dask
# dashboard, troy plot: docs/*.png): installed when missing where this is root on Debian
# (make test runs it beside the venv's set-up); elsewhere those pictures are not taken.
browser: compiler
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && \
	      apt-get install -y -q --no-install-recommends chromium >/dev/null; } && \
	    echo "browser: installed Debian's chromium (the tests' screenshots)"; \
	  else echo "browser: no chromium and not root on Debian: no screenshots in the tests"; fi; }

# Debian's iproute2 (ip), util-linux (nsenter) and nftables (nft), for the box's node networks
# (docs/emulator.md, "The node's network"; tests/elasticslice/emulator/test_network.py):
# installed when missing where this is root on Debian; elsewhere nodes share this machine's
# network (one warning) and the network tests are skipped. Before browser, which waits for
# it: two apt-get at once would fight over dpkg's lock.
NETNS_DEBS := iproute2 util-linux nftables
netns:
	@{ PATH="$$PATH:/usr/sbin:/sbin"; command -v ip && command -v nsenter && command -v nft; \
	  } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q --no-install-recommends $(NETNS_DEBS) >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && \
	      apt-get install -y -q --no-install-recommends $(NETNS_DEBS) >/dev/null; } && \
	    echo "netns: installed Debian's $(NETNS_DEBS) (the box's node networks)"; \
	  else echo "netns: no ip, nsenter or nft and not root on Debian: nodes share this machine's network"; fi; }

# The fast tier, for every edit: unit and in-process tests (no emulator, Dask or demo)
test-fast: $(STAMP) bytecode
	$(TMP_ENV) $(BIN)/python -m pytest -m "not slow" -n $(FAST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The fast tier on Python 3.10, the oldest the project runs on (Ubuntu 22.04's): a venv of
# its own in $(VENV)/py310 from PY310 (pyenv's 3.10, else python3.10 on PATH), made once.
# tests/test_python_versions.py imports every module there when it exists.
PY310 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.10.*/bin/python3.10) $(shell command -v python3.10 2>/dev/null))
PY310_VENV := $(VENV)/py310
$(PY310_VENV)/.installed-stamp: setup.cfg pyproject.toml | $(STAMP)
	@test -n "$(PY310)" || { echo "test-py310: no python3.10 here (make test-py310 PY310=...)"; exit 1; }
	@test -x $(PY310_VENV)/bin/python || $(BIN)/uv venv -q --python $(PY310) $(PY310_VENV) 2>/dev/null || \
	  $(PY310) -m venv $(PY310_VENV)
	@$(BIN)/uv pip install -q --python $(PY310_VENV)/bin/python --compile-bytecode $(EDITABLE) -e '.[test]' pip 2>/dev/null || \
	  { $(PY310_VENV)/bin/python -m ensurepip -q && $(PY310_VENV)/bin/python -m pip install -q $(EDITABLE) -e '.[test]'; }
	@touch $@
test-py310: $(PY310_VENV)/.installed-stamp
	@$(PY310_VENV)/bin/python -m troy.native
	@$(PY310_VENV)/bin/python -m elasticslice.rspec.fastbuild
	@$(PY310_VENV)/bin/python -m elasticslice.rpc.fastxmlbuild
	@$(PY310_VENV)/bin/python -m compileall -q -j 2 elasticslice troy bench tests
	$(TMP_ENV) $(PY310_VENV)/bin/python -m pytest -m "not slow" -n $(FAST_WORKERS) --dist worksteal -p no:cacheprovider $(PYTEST_ARGS)

demo: $(STAMP) netns native
	$(BIN)/python bin/demo $(DEMO_ARGS)

# every benchmark, one table, figures in bench/results/latest.json (BENCH_ARGS=--quick: smoke)
bench: $(STAMP) native
	$(BIN)/python -m pip install -q $(EDITABLE) -e '.[bench]'
	$(BIN)/python -m bench $(BENCH_ARGS)

# the chaos suite: seeded faults during real workflows, then the invariants (docs/chaos.md)
CHAOS_ARGS ?= --runs 20 --seed 1 --json bench/results/chaos.json
CHAOS_SITES_ARGS ?= --runs 6 --seed 101 --sites 2 --json bench/results/chaos-sites.json
chaos: $(STAMP)
	$(BIN)/python -m bench.chaos $(CHAOS_ARGS)
	$(BIN)/python -m bench.chaos $(CHAOS_SITES_ARGS)

# the nodes' software: the wheelhouse of what this environment runs (README "Node software");
# cached in $(VENV)/var/wheelhouse. WHEELHOUSE_ARGS="--python 3.10 --platform manylinux_2_35_x86_64"
WHEELHOUSE_ARGS ?=
wheelhouse: $(STAMP)
	$(BIN)/python -m elasticslice.pilots.wheelhouse $(WHEELHOUSE_ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache elasticslice/rspec/_fastrspec*.so troy/_spawn*.so \
		elasticslice/rpc/_fastxmlrpc*.so
