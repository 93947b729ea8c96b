# Set-up and everyday targets. `make test` and `make demo` work on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: test demo bench chaos clean

$(STAMP): setup.cfg pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

demo: $(STAMP)
	$(BIN)/python bin/demo $(DEMO_ARGS)

# every benchmark, one table, figures in bench/results/latest.json (BENCH_ARGS=--quick: smoke)
bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m bench $(BENCH_ARGS)

# the chaos suite: seeded faults during real workflows, then the invariants (docs/chaos.md)
CHAOS_ARGS ?= --runs 20 --seed 1 --json bench/results/chaos.json
chaos: $(STAMP)
	$(BIN)/python -m bench.chaos $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
