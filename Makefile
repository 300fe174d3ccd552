# Two entry points: `make demo` and `make test`. Both create and reuse .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MXVENV := .venv-mxnet
# torch 2.14.1 / torchvision 0.29.1 are the pair that import together on this machine.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
PYTEST_ARGS ?=

.PHONY: demo test interop-venv clean

$(VENV)/.installed: pyproject.toml setup.py imgpipe/loaders/_jpeg_region.c imgpipe/_jpeg_shrink.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet $(TORCH_PINS) -e '.[dev,dali]'
	touch $@

$(MXVENV)/.installed: tools/interop-requirements.txt
	$(PYTHON) -m venv $(MXVENV)
	$(MXVENV)/bin/python -m pip install --quiet -r tools/interop-requirements.txt
	touch $@

interop-venv: $(MXVENV)/.installed

demo: $(VENV)/.installed
	$(PY) tools/demo.py

test: $(VENV)/.installed $(MXVENV)/.installed
	IMGPIPE_MXNET_PYTHON=$(abspath $(MXVENV))/bin/python $(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(MXVENV) demo
