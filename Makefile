# Two entry points: `make demo` and `make test`. Both create and reuse .venv. `make wheel`: the manylinux wheel.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MXVENV := .venv-mxnet
WHEELVENV := .venv-wheel
# torch 2.14.1 / torchvision 0.29.1 are the pair that import together on this machine.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
PYTEST_ARGS ?=
# pytest-xdist processes: most tests wait on the processes they start (DDP ranks, CLI runs, the S3 server),
# so two of them keep both cores busy; PYTEST_WORKERS=0 runs the suite in one process.
PYTEST_WORKERS ?= 2

.PHONY: demo test wheel interop-venv clean

$(VENV)/.installed: pyproject.toml setup.py imgpipe/image/_jpeg_region.c imgpipe/image/_jpeg_shrink.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet $(TORCH_PINS) -e '.[dev,dali,remote]'
	touch $@

# The stamp is written only once the interpreter really imports mxnet.
$(MXVENV)/.installed: tools/interop-requirements.txt
	$(PYTHON) -m venv --clear $(MXVENV)
	$(MXVENV)/bin/python -m pip install --quiet -r tools/interop-requirements.txt
	$(MXVENV)/bin/python -c "import mxnet"
	touch $@

# A stamp left over a deleted or broken venv is dropped, so the venv is rebuilt.
interop-venv:
	@$(MXVENV)/bin/python -c "import mxnet" 2>/dev/null || rm -f $(MXVENV)/.installed
	@$(MAKE) --no-print-directory $(MXVENV)/.installed

# The build tools of make wheel (tools/wheel-requirements.txt says why each), apart from .venv.
$(WHEELVENV)/.installed: tools/wheel-requirements.txt
	$(PYTHON) -m venv --clear $(WHEELVENV)
	$(WHEELVENV)/bin/python -m pip install --quiet -r tools/wheel-requirements.txt
	touch $@

# dist/: the sdist, and a manylinux wheel with the pinned libjpeg-turbo inside (tools/build_wheel.py, docs/install.md).
wheel: $(WHEELVENV)/.installed
	$(WHEELVENV)/bin/python tools/build_wheel.py --dist dist

demo: $(VENV)/.installed
	$(PY) tools/demo.py

# ruff first (seconds; config in pyproject.toml). IMGPIPE_STRICT_DEPS=1: a missing or broken MXNet venv or DALI
# fails the run instead of skipping (tests/conftest.py). tests/test_install.py builds the wheel with make wheel's venv.
test: $(VENV)/.installed interop-venv $(WHEELVENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	IMGPIPE_STRICT_DEPS=1 IMGPIPE_MXNET_PYTHON=$(abspath $(MXVENV))/bin/python IMGPIPE_WHEEL_PYTHON=$(abspath $(WHEELVENV))/bin/python \
		$(PY) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(MXVENV) $(WHEELVENV) demo dist
