# hvdtrain: `make demo` and `make test` install whatever is missing first (scripts/setup.sh).
#
# STACK picks the TensorFlow/Keras stack, each in a virtualenv of its own in the checkout:
#   keras3 (default)  TensorFlow 2.21, Keras 3, hvdtrain's own Horovod binding   .venv
#   keras2            TensorFlow 2.15, Keras 2, Horovod's own Keras layer        .venv-keras2
STACK ?= keras3
OTHER_STACK ?= $(if $(filter keras3,$(STACK)),keras2,keras3)
venv_of = $(if $(filter keras3,$(1)),.venv,.venv-$(1))
VENV ?= $(call venv_of,$(STACK))
OTHER_VENV := $(call venv_of,$(OTHER_STACK))
NP ?= 2
PY := $(VENV)/bin/python
# PYTHON (e.g. make demo PYTHON=python3.12) picks the interpreter of $(STACK)'s venv; the other
# stack that make test, bench and guarantees set up beside it keeps its own (keras2: 3.11 only).
SETUP = HVDTRAIN_STACK=$(1) HVDTRAIN_VENV=$(2) $(if $(filter-out $(STACK),$(1)),PYTHON=) bash scripts/setup.sh

# The venv's horovodrun, hvdtrain and python must be what every rank finds on PATH.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# TensorFlow's log level and Open MPI's run-as-root permission are set by hvdtrain itself
# (hvdtrain/launch/rank_process.py, hvdtrain/launch/launchers.py), not here.

.PHONY: install demo lint test test-core test-fast unit guarantees bench bench-check bench-quick bench-migration bench-network horovod-examples compat image fresh-machine clean

install:
	@$(call SETUP,$(STACK),$(VENV))

# The main job: $(NP) Horovod ranks (MPI where mpirun is installed, else Gloo: run_scripts/local.sh)
# train a CNN on scikit-learn's built-in digits.
demo: install
	run_scripts/local.sh $(NP) --preset digits

# ruff over hvdtrain/, benchmarks/ and tests/, mypy over hvdtrain/ and the benchmarks (configured
# in pyproject.toml), seconds:
# mypy checks that distributed/keras2.py and distributed/keras3.py both provide distributed/binding.py's KerasBinding.
define run_lint
	$(VENV)/bin/ruff check hvdtrain benchmarks tests
	$(VENV)/bin/mypy
endef

lint:
	@$(call SETUP,$(STACK),$(VENV)) --with-test-tools
	$(run_lint)

# The lint first (as `make lint`), then the whole suite on $(STACK) (unit tests, real multi-rank
# runs under horovodrun and mpirun), its multi-rank tests in one lane and beside them the
# correctness core on $(OTHER_STACK), one launcher per test, in turn (OTHER_STACK= skips it), then
# $(STACK)'s unit tests and the fault tests; then the SLURM tests alone (scripts/test_lanes.sh).
test:
	@$(call SETUP,$(STACK),$(VENV)) --with-test-tools
	$(run_lint)
	$(if $(OTHER_STACK),@$(call SETUP,$(OTHER_STACK),$(OTHER_VENV)))
	scripts/test_lanes.sh $(VENV) $(if $(OTHER_STACK),$(OTHER_VENV))

# The correctness core (and the unit tests) on $(STACK) alone.
test-core:
	@$(call SETUP,$(STACK),$(VENV))
	$(PY) -m pytest -m "core or not multirank"

# The quick lane: the unit tests and a few multi-rank smoke tests, each under one launcher (in
# turn: both are used), on two workers (pytest-xdist): most of them wait on a subprocess.
# $(OTHER_STACK)'s venv too: doctor's fault test borrows its Horovod, built for another TensorFlow.
test-fast:
	@$(call SETUP,$(STACK),$(VENV)) --with-test-tools
	$(if $(OTHER_STACK),@$(call SETUP,$(OTHER_STACK),$(OTHER_VENV)))
	$(PY) -m pytest -n 2 --launcher-turns other -m "not multirank or smoke"

# Only the tests that need no launcher (seconds).
unit: install
	$(PY) -m pytest -m "not multirank"

# docs/guarantees.md from runs: the Keras usage patterns of tests/guarantees_worker.py through the
# library path at 2 ranks, one job per stack (a few minutes), verdicts and figures per stack
# (tests/multirank/test_guarantees.py holds each stack to its column). Results in runs/guarantees.
guarantees:
	@$(call SETUP,keras3,.venv)
	@$(call SETUP,keras2,.venv-keras2)
	$(PY) scripts/guarantees.py --venv .venv --venv .venv-keras2 --out docs/guarantees.md

# Every benchmark on an idle machine, both stacks (under half an hour on 2 cores, more or less
# by machine: benchmarks/README.md, "make bench's budget"): figures, tables and plots into
# benchmarks/results, each benchmark's time into all.json, and the results section of
# benchmarks/README.md rewritten from those files. $(OTHER_VENV) is the other stack (tax,
# stacks, phases, and peers' MWMS and PS on Keras 3); Horovod's own
# tensorflow2_synthetic_benchmark.py (HOROVOD_SYNTHETIC=path, from Horovod's repository, tag
# v0.28.1) runs with $(HOROVOD_VENV)'s Python, as it cannot run on Keras 3. BENCH_ARGS adds
# options (e.g. --rounds 2).
HOROVOD_VENV ?= $(if $(filter keras3,$(STACK)),.venv-keras2,$(VENV))
bench: bench-check install
	@$(call SETUP,$(OTHER_STACK),$(OTHER_VENV))
	@$(if $(filter $(HOROVOD_VENV),$(OTHER_VENV) $(VENV)),,$(call SETUP,keras2,$(HOROVOD_VENV)))
	$(VENV)/bin/hvdtrain bench all --out benchmarks/results --readme benchmarks/README.md \
		--other-venv $(OTHER_VENV) --horovod-venv $(HOROVOD_VENV) \
		--horovod-synthetic $(HOROVOD_SYNTHETIC) $(BENCH_ARGS)

bench-check:
	@test -n "$(HOROVOD_SYNTHETIC)" && test -f "$(HOROVOD_SYNTHETIC)" || { echo "make bench:" \
	"set HOROVOD_SYNTHETIC to Horovod's examples/tensorflow2/tensorflow2_synthetic_benchmark.py" \
	"(github.com/horovod/horovod, tag v0.28.1)" >&2; exit 2; }

# A Horovod script moved to Keras 3 (issue 51): Horovod's tensorflow2_synthetic_benchmark.py
# (HOROVOD_SYNTHETIC) through hvdtrain.horovod on .venv, against it unchanged with Horovod's own
# module on .venv-keras2, at 1 and 2 ranks in interleaved rounds (about 15 minutes on 2 cores):
# benchmarks/results/migration.md. On an idle machine only.
bench-migration: bench-check
	@$(call SETUP,keras3,.venv)
	@$(call SETUP,keras2,.venv-keras2)
	.venv/bin/hvdtrain bench migration --out benchmarks/results \
		--horovod-synthetic $(HOROVOD_SYNTHETIC) --horovod-venv .venv-keras2 $(BENCH_ARGS)

# Scaling where the network is the bottleneck (issue 53): 2 ranks on 2 network-namespace hosts
# whose link tc shapes to each of NETWORK_SPEEDS Gbit/s, hvdtrain's ways to reduce and Horovod's
# script (HOROVOD_SYNTHETIC) against one host, with the cost model's prediction of each step
# beside it: benchmarks/results/network.md. As root, on an idle machine only (about an hour on
# 2 cores for MobileNetV2 at 224x224: over make bench's half hour, so a target of its own).
# NETWORK_MODEL=resnet50 (with NETWORK_OUT=benchmarks/results/network-resnet50 and its own
# speeds) for ResNet-50's 102 MB of gradients.
NETWORK_MODEL ?= mobilenetv2
NETWORK_SPEEDS ?= 0.07,0.2,1
NETWORK_SYSTEMS ?= hvdtrain,hvdtrain-fp16,hvdtrain-gloo,hvdtrain-gloo-overlap,horovod,horovod-gloo
NETWORK_OUT ?= benchmarks/results
bench-network: bench-check
	@$(call SETUP,keras3,.venv)
	@$(call SETUP,keras2,.venv-keras2)
	.venv/bin/hvdtrain bench network --out $(NETWORK_OUT) --model $(NETWORK_MODEL) \
		--speeds $(NETWORK_SPEEDS) --systems $(NETWORK_SYSTEMS) \
		--horovod-synthetic $(HOROVOD_SYNTHETIC) --horovod-venv .venv-keras2 $(BENCH_ARGS)

# Horovod's own TensorFlow 2 examples and test/parallel/test_tensorflow2_keras.py (tag v0.28.1 of
# HOROVOD_REPO=path, a work tree or git directory of github.com/horovod/horovod) at $(NP) ranks on
# .venv (Keras 3) against hvdtrain.horovod, their import line swapped (about 10 minutes on 2 cores;
# not part of make test): benchmarks/results/horovod-examples (scripts/horovod_examples.py).
horovod-examples:
	@test -n "$(HOROVOD_REPO)" && test -e "$(HOROVOD_REPO)" || { echo "make horovod-examples:" \
	"set HOROVOD_REPO to a checkout of github.com/horovod/horovod (tag v0.28.1)" >&2; exit 2; }
	@$(call SETUP,keras3,.venv)
	.venv/bin/python scripts/horovod_examples.py --horovod $(HOROVOD_REPO) --venv .venv --np $(NP)

# A smoke test of every benchmark (a few minutes), into benchmarks/quick.
bench-quick: install
	$(VENV)/bin/hvdtrain bench all --quick --out benchmarks/quick

# The TensorFlow range measured (hours: Horovod built once per version): every minor version
# from 2.15 to 2.21 in a fresh venv from the wheel, then the correctness core; a table into
# benchmarks/results/compat-DATE.md. COMPAT_VERSIONS="2.19.1 2.21.0" picks versions, and
# COMPAT_PYTHONS="3.12 3.13" the Pythons each runs on (default python3.11).
compat:
	scripts/compat.sh /tmp/hvdtrain-compat $(COMPAT_VERSIONS)

# The container image hvdtrain:latest of the default stack, with podman, as root (tens of minutes
# and gigabytes; not part of make test): container/README.md. container/train_two.sh then trains
# 2 ranks across two containers of it.
image:
	scripts/build_image.sh

# The README's quick-start block as a newcomer types it, in a container of a bare Debian 12 made
# with mmdebstrap, `make test` run as `make test-fast` (tens of minutes, as root; not part of make
# test): benchmarks/results/fresh-machine-DATE.md and its log in runs/fresh-machine
# (scripts/fresh_machine.sh).
fresh-machine:
	scripts/fresh_machine.sh

clean:
	rm -rf runs .pytest_cache
