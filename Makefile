# Two commands do all set-up on a fresh machine:
#   make lab    install (once) and open the labs in JupyterLab
#   make test   install (once) and run every test: pytest + nbval over every lab
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.parlab-installed
EXTRAS := torch,tf,lab,test

.PHONY: install lab test test-fast test-gpu bench student clear-outputs clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --constraint constraints.txt --editable ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

# Jupyter refuses to start as root unless told to; containers (Docker, some cloud
# machines) often run as root, so say it only there.
ROOT_FLAG = $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root,)

lab: install
	$(VENV)/bin/jupyter lab $(ROOT_FLAG) \
		--ServerApp.contents_manager_class=parlab.labserver.LabsContentsManager labs/

# One pytest run covers the package tests and every notebook (nbval, lax: outputs with
# timings are not compared; a failing cell or assertion fails). A hung cell fails too.
# Each lab runs once: the browser test, run last, opens what nbval executed (conftest.py).
test: install
	$(PY) -m pytest -p no:cacheprovider -rs --durations=30 --nbval-lax --nbval-current-env \
		--nbval-cell-timeout=600 tests labs

# The GPU test run: the tests marked gpu, then every lab with the GPU(s) visible, in the
# default device mode and in shared-GPU mode (scripts/test-gpu.sh; docs/gpu.md).
# Without a CUDA GPU it says so in one line and succeeds. No install step: on a bare GPU
# machine (Python + CUDA torch, no internet) it installs its tools from wheels/, made
# elsewhere by scripts/gpu-wheels.sh.
test-gpu:
	@scripts/test-gpu.sh

# The quick loop while working on the code: the package's tests without the notebooks,
# the browser, and the tests marked slow (soaks, torchrun, TensorFlow, student copies run).
test-fast: install
	$(PY) -m pytest -p no:cacheprovider -rs -m "not browser and not slow" tests

bench: install
	$(PY) -m parlab bench

# The copy of the labs to hand to students: solutions replaced, outputs removed.
student: install
	$(PY) -m parlab student-copy --force labs student

# Notebooks are committed without outputs.
clear-outputs: install
	$(VENV)/bin/jupyter nbconvert --clear-output --inplace labs/*.ipynb

clean:
	rm -rf $(VENV) student labs/traces
