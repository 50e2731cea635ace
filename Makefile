# hvdtrain: `make demo` and `make test` install whatever is missing first (scripts/setup.sh).
VENV ?= .venv
NP ?= 2
PY := $(VENV)/bin/python

# The venv's horovodrun, hvdtrain and python must be what every rank finds on PATH.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# TensorFlow's log level and Open MPI's run-as-root permission are set by hvdtrain itself
# (hvdtrain/launching.py), not here.

.PHONY: install demo test test-fast unit bench bench-quick clean

install:
	@HVDTRAIN_VENV=$(VENV) bash scripts/setup.sh

# The main job: $(NP) Horovod ranks (Gloo) train a CNN on scikit-learn's built-in digits.
demo: install
	run_scripts/local.sh $(NP) --preset digits

# The whole suite: unit tests, then real multi-rank runs under horovodrun (Gloo) and mpirun.
test:
	@HVDTRAIN_VENV=$(VENV) bash scripts/setup.sh --with-test-tools
	$(PY) -m pytest

# The quick lane: the unit tests and a few multi-rank smoke tests under both launchers.
test-fast:
	@HVDTRAIN_VENV=$(VENV) bash scripts/setup.sh --with-test-tools
	$(PY) -m pytest -m "not multirank or smoke"

# Only the tests that need no launcher (seconds).
unit: install
	$(PY) -m pytest -m "not multirank"

# The scaling benchmarks (about 15 minutes on 2 cores): figures, tables and plots into
# benchmarks/results, and the results section of benchmarks/README.md rewritten.
# HOROVOD_SYNTHETIC=path/to/tensorflow2_synthetic_benchmark.py adds Horovod's own benchmark.
bench: install
	$(VENV)/bin/hvdtrain bench all --out benchmarks/results --readme benchmarks/README.md \
		$(if $(HOROVOD_SYNTHETIC),--horovod-synthetic $(HOROVOD_SYNTHETIC))

# A smoke test of every benchmark (a few minutes), into benchmarks/quick.
bench-quick: install
	$(VENV)/bin/hvdtrain bench all --quick --out benchmarks/quick

clean:
	rm -rf runs .pytest_cache
