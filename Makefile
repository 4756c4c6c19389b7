# FreeScale developer entry points. `make demo` and `make test` each set up .venv first, so either
# works alone on a fresh machine.
VENV := .venv
PY := $(VENV)/bin/python
FREESCALE := $(VENV)/bin/freescale
DEMO_DIR ?= demo_out

.PHONY: setup demo test lint bench clean

setup:
	bash scripts/setup.sh

demo: setup
	$(FREESCALE) demo --out $(DEMO_DIR)
	$(FREESCALE) stats $(DEMO_DIR)/prepared --out $(DEMO_DIR)/stats

test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: setup
	$(PY) benchmarks/bench_balance.py
	$(PY) benchmarks/bench_prepare.py
	$(PY) benchmarks/bench_stats.py
	$(PY) benchmarks/bench_bubbles.py
	$(PY) benchmarks/bench_pec.py
	$(PY) benchmarks/bench_online.py
	$(PY) benchmarks/bench_simulate.py
	$(PY) benchmarks/bench_quality.py
	$(PY) benchmarks/bench_zch.py

clean:
	rm -rf $(DEMO_DIR) .pytest_cache .ruff_cache
