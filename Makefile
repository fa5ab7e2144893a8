# Two commands for a new machine: `make run` and `make test` (README).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint typecheck format bench docs clean

# pyproject.toml states ranges; constraints.txt the exact versions every machine runs.
CONSTRAINTS := -c constraints.txt

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and exactly (constraints.txt): an unpinned torch would pull a multi-GB
	# CUDA build.
	$(BIN)/python -m pip install -q $(CONSTRAINTS) torch
	$(BIN)/python -m pip install -q $(CONSTRAINTS) -e ".[logs,tensorboard,yaml,test,dev]"
	# Optional: ONNX export and its check (its test is skipped where these do not install).
	-$(BIN)/python -m pip install -q $(CONSTRAINTS) -e ".[onnx,test-onnx]"
	# Optional: the Triton steps (run on the CPU by their tests in Triton's interpreter).
	-$(BIN)/python -m pip install -q $(CONSTRAINTS) -e ".[gpu]"
	# Optional: the documentation build (its test is skipped where this does not install).
	-$(BIN)/python -m pip install -q $(CONSTRAINTS) -e ".[docs]"
	# The C++ time loop now, not at the first training (without a compiler: the PyTorch loop).
	-$(BIN)/python -m rnnkit build-native
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python examples/char_lm/main_job.py

# The suite runs on every core (pytest-xdist: one process each, every test alone in one of
# them); `make test WORKERS=0` runs it in this one process, in file order.
WORKERS ?= auto

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(WORKERS)

# The inner loop: everything but the tests marked slow (tests/conftest.py), in ~2.5 min.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n $(WORKERS) -m "not slow and not soak"

CSRC := src/rnnkit/csrc/*.cpp src/rnnkit/csrc/*.h

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/clang-format --dry-run --Werror $(CSRC)
	# Imports go only down the layers ([tool.importlinter] in pyproject.toml).
	$(BIN)/lint-imports --no-cache

# The annotations of src/rnnkit and benchmarks/ against torch's and numpy's
# (pyproject.toml: [tool.mypy]).
typecheck: $(STAMP)
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/clang-format -i $(CSRC)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_recurrent.py

# The documentation site (docs/*.md and the API reference from the docstrings) in site/;
# --strict: a broken link or anchor, or a docstring that does not parse, is an error.
docs: $(STAMP)
	$(BIN)/python -m pip install -q $(CONSTRAINTS) -e ".[docs]"
	$(BIN)/python -m mkdocs build --strict

clean:
	rm -rf $(VENV) build site src/*.egg-info
