# Development entry points. The README's two commands (demo.sh, tests/run.sh) stay the way in;
# these are the pieces, for working on one part.
PY ?= .venv/bin/python
E2E ?=

.PHONY: help venv lint unit e2e bpf sim all

help:
	@echo "make lint   ruff over the tree"
	@echo "make unit   host unit tests (seconds)"
	@echo "make e2e    the end-to-end suite in the test VM (E2E='src/tests/e2e/test_x.py' for some)"
	@echo "make bpf    the kernel-program tests in the VM (sched_ext gate, probes, inside probe)"
	@echo "make sim    the policy simulator's validation against the committed VM sweep"
	@echo "make all    lint, unit, e2e"

venv:
	@test -x $(PY) || python3 -m venv .venv
	@$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,bench]' ruff

lint: venv
	$(PY) -m ruff check .

unit: venv
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

e2e:
	EXECGATE_E2E_ARGS="$(E2E)" tests/vm/run.sh test results/vm-test

bpf:
	EXECGATE_E2E_ARGS="src/tests/e2e/test_bpf_gate.py src/tests/e2e/test_bpf_probes.py \
		src/tests/e2e/test_inside_agent.py" tests/vm/run.sh test results/vm-bpf

sim: venv
	$(PY) -m bench.sim validate docs/replay/sweep/results.json.gz

all: lint unit e2e
