# voicebot: `make run` sets everything up and starts the bot; `make test` sets up and runs the whole test suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= config.yaml

.PHONY: run test system-deps venv bench clean

system-deps:
	@if ! ldconfig -p | grep -q libopus.so; then \
		echo "installing libopus0 (Discord voice needs it)"; \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq libopus0; \
		else sudo apt-get update -qq && sudo apt-get install -y -qq libopus0; fi; \
	fi

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: system-deps $(BIN)/.installed

run: venv
	$(BIN)/python -m bot --config $(CONFIG) models download
	$(BIN)/python -m bot --config $(CONFIG) run

test: venv
	$(BIN)/python -m pytest -q -p no:cacheprovider; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests were collected: failing"; exit 1; fi; exit $$rc

bench: venv
	$(BIN)/python -m bot --config $(CONFIG) bench

clean:
	rm -rf $(VENV) build *.egg-info
