# Set-up and entry points. Each target creates its virtual environment on first use:
#   make demo       .venv-demo: the runtime requirements only (no torch, transformers, seqio,
#                   TensorFlow), then the demo's default run -> demo_output/
#   make demo-full  the same venv, every task x every strategy (P_max per head too) and 5
#                   calibration seeds -> demo_output_full/
#   make test       .venv: the runtime requirements and the test extras, then every test on 2
#                   workers (pytest-xdist, spread by test: --dist loadgroup; the tests marked
#                   with one xdist_group share a worker)
#   make test-fast  the same venv, the fast lane: every test but the integration kinds (the
#                   markers cli, multiprocess, docs, tpu_compile, bench and slow; setup.cfg says
#                   what each means), on 2 workers; a test of the lane slower than 10 s fails
#                   (--unmarked-limit, tests/conftest.py): give it its marker
#   make docs       the same venv, the docs site (mkdocs.yml: docs/ and the API reference from
#                   the docstrings) built in strict mode into site/; tests/project/docs_test.py builds it
#                   too, so `make test` fails where this does
#   make test-newest-jax
#                   .venv-newest-jax: Python 3.12 (what Colab and a GPU image run) with the newest
#                   jax/jaxlib the package index serves and the lm_eval extra, then the tests
#                   marked newest_jax (the model, attention, calibration, checkpoints, schedules
#                   and the lm-eval model; .ci/run runs it); those that need torch or TensorFlow
#                   skip there
PYTHON ?= python3
VENV := .venv
DEMO_VENV := .venv-demo
NEWEST_VENV := .venv-newest-jax
# Python 3.12 as a fresh machine has it: python3.12 on PATH if it runs, else pyenv's newest 3.12.
PYTHON312 ?= $(shell for p in python3.12 "$$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; \
	do "$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && echo "$$p"; \
	done | tail -n 1)
# The markers that take a test out of the fast lane (tests/conftest.py: INTEGRATION_MARKERS).
INTEGRATION := cli or multiprocess or docs or tpu_compile or bench or slow
PYTEST_XDIST := -n 2 --dist loadgroup
# More pytest arguments for the test targets, e.g. `make test-fast PYTEST_ARGS='-k calibration'`.
PYTEST_ARGS ?=

.PHONY: demo demo-full test test-fast test-newest-jax docs venv demo-venv clean

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

# No torch, transformers or TensorFlow here (no CPU wheel of torch on this disk for 3.12): the
# tests that need them skip, saying so; the 3.11 suite (make test) runs them.
$(NEWEST_VENV)/.installed: setup.cfg
	@test -n "$(PYTHON312)" || { echo 'make test-newest-jax: no Python 3.12 (python3.12 on PATH' \
	  'or under pyenv); set PYTHON312=/path/to/python3.12' >&2; exit 1; }
	$(PYTHON312) -m venv $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(NEWEST_VENV)/bin/python -m pip install -q --upgrade -e '.[lm_eval]' jax jaxlib 'jax[tpu]' \
	  'pytest>=8' 'pytest-xdist>=3.5'
	touch $@

venv: $(VENV)/.installed

demo-venv: $(DEMO_VENV)/.installed

demo: demo-venv
	$(DEMO_VENV)/bin/python -m t5align.demo

demo-full: demo-venv
	$(DEMO_VENV)/bin/python -m t5align.demo --full --output_dir=demo_output_full

test: venv
	$(VENV)/bin/python -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

test-fast: venv
	$(VENV)/bin/python -m pytest $(PYTEST_XDIST) -m 'not ($(INTEGRATION))' --unmarked-limit=10 $(PYTEST_ARGS)

test-newest-jax: $(NEWEST_VENV)/.installed
	$(NEWEST_VENV)/bin/python -c 'import sys, jax, jaxlib, flax; print("Python", sys.version.split()[0], "jax", jax.__version__, "jaxlib", jaxlib.__version__, "flax", flax.__version__)'
	$(NEWEST_VENV)/bin/python -m pytest $(PYTEST_XDIST) -m newest_jax $(PYTEST_ARGS)

docs: venv
	$(VENV)/bin/python -m mkdocs build --strict

clean:
	rm -rf $(VENV) $(DEMO_VENV) $(NEWEST_VENV) site
