# Two commands a newcomer needs:  `make run`  (set up, then train on the embedded default)
#                                 `make test` (set up, then run the test suite)
# Both create the virtualenv in .venv on first use.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

# torch and torchvision must come from one build. Some machines configure pip (find-links) with a
# local CPU-only torch wheel that PyPI's torchvision cannot be imported beside; where pip has
# find-links configured, install the pair from the package index alone.
PIP_FIND_LINKS_CONFIGURED := $(strip $(PIP_FIND_LINKS)$(shell $(PYTHON) -m pip config list 2>/dev/null | grep -i 'find-links'))
PIP_ENV := $(if $(PIP_FIND_LINKS_CONFIGURED),env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null,)

.PHONY: setup run test test-deployment bench claims clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP_ENV) $(BIN)/python -m pip install --upgrade pip
	$(PIP_ENV) $(BIN)/python -m pip install -e '.[dev]'
	$(BIN)/python -c "import torch, torchvision; print('torch', torch.__version__, '/ torchvision', torchvision.__version__)"
	touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/secfed train

# Two pytest-xdist workers, one torch thread each, the last tests' work stolen by whichever worker is
# free. tests/conftest.py makes OpenMP wait passively (without it the two workers' spinning threads
# made the training tests 3–7× slower). 342 s for 1,070 tests on a clean clone on the 2-core VM on
# 2026-11-27, against 560–645 s in one process (bench/RESULTS.md, "make test").
test: setup
	$(BIN)/python -m pytest -n auto --maxprocesses 2 --dist worksteal

test-deployment: setup
	$(BIN)/python -m pytest -m deployment

bench: setup test-deployment
	$(BIN)/python bench/bench_eval.py
	$(BIN)/python bench/bench_runtime.py
	$(BIN)/python bench/bench_secagg.py
	$(BIN)/python bench/bench_flower.py
	$(BIN)/python bench/bench_privacy.py

# Every published claim, re-decided (resumable: rerun to continue; hours on 2 cores — see bench/claims.py)
claims: setup
	$(BIN)/python bench/claims.py --publish

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
