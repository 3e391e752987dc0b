# Two entry points for users: `make demo` and `make test`. Both build .venv on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch is pinned first to the CPU build that pip resolves locally, so nothing later pulls a CUDA torch.
TORCH_SPEC ?= torch==2.13.0
# Test processes: one a core on the 2-core machines CI runs on (tests/conftest.py starts the longest files first).
TEST_WORKERS ?= 2

.PHONY: demo test lint venv clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check shardinfer tests bench tools examples
	$(BIN)/mypy shardinfer
	$(BIN)/python -m pytest -q -x -n $(TEST_WORKERS) --dist loadfile --durations=15

demo: $(STAMP)
	$(BIN)/python examples/demo/run_demo.py

lint: $(STAMP)
	$(BIN)/ruff check shardinfer tests bench tools examples
	$(BIN)/ruff format --check shardinfer tests bench tools examples
	$(BIN)/mypy shardinfer

clean:
	rm -rf $(VENV)
