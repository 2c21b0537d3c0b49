# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= dev,pettingzoo,alfworld,tensorboard,peft

.PHONY: venv demo test lint bench clean

venv: $(VENV)/.installed

# CPU torch first: `torch==2.13.0` resolves to a local CPU wheel where one is offered; elsewhere plain torch.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q "torch==2.13.0" || $(PY) -m pip install -q "torch>=2.4,<2.15"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

demo: venv
	$(PY) scripts/demo.py

test: venv
	$(PY) -m pytest -q --durations=10

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: venv
	$(PY) scripts/bench_advantages.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
