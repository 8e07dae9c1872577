# Set-up and entry points. Each target creates its virtual environment on first use:
#   make demo       .venv-demo: the runtime requirements only (no torch, transformers, seqio,
#                   TensorFlow), then the demo's default run -> demo_output/
#   make demo-full  the same venv, every task x every strategy (P_max per head too) and 5
#                   calibration seeds -> demo_output_full/
#   make test       .venv: the runtime requirements and the test extras, then pytest on 2
#                   workers (pytest-xdist, one test file per worker)
PYTHON ?= python3
VENV := .venv
DEMO_VENV := .venv-demo

.PHONY: demo demo-full test venv demo-venv clean

$(VENV)/.installed: setup.cfg
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[test]'
	touch $@

$(DEMO_VENV)/.installed: setup.cfg
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install -q --upgrade pip
	$(DEMO_VENV)/bin/python -m pip install -q -e .
	touch $@

venv: $(VENV)/.installed

demo-venv: $(DEMO_VENV)/.installed

demo: demo-venv
	$(DEMO_VENV)/bin/python -m t5align.demo

demo-full: demo-venv
	$(DEMO_VENV)/bin/python -m t5align.demo --full --output_dir=demo_output_full

test: venv
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile

clean:
	rm -rf $(VENV) $(DEMO_VENV)
