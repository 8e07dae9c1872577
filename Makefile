# Set-up and entry points. Each target creates .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test venv clean

$(VENV)/.installed: setup.cfg
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m t5align.demo

test: venv
	$(PY) -m pytest

clean:
	rm -rf $(VENV)
