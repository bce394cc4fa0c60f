# The book's entry points. On a fresh machine `make book` and `make test` set everything up.
SHELL := /bin/bash
.DEFAULT_GOAL := help

BOOTSTRAP_PYTHON ?= python3
VENV ?= .venv
REFERENCE ?= nvidia-h200
PY ?= 3.12
# The wheels a notebook needs beyond torch and triton (with everything they depend on).
NOTEBOOK_PKGS ?= papermill ipykernel nbclient myst-nb numpy pandas matplotlib tqdm prometheus-client

# The Triton release installed where torch brings none (its CPU build): the reference machine's.
TRITON ?= 3.6.0
# The Triton a reader gets with torch 2.13 from PyPI: the book's kernels are compiled with it too.
TRITON_NEXT ?= 3.7.1
TRITON_NEXT_DIR := .cache/triton-$(TRITON_NEXT)
# What `make check-kernels` compiles: one configuration of each code path (ALL=1: every configuration)
KERNELS := $(if $(ALL),,--paths)

# pytest workers of `make test` (each takes whole test files; CI's machine has two cores)
TEST_WORKERS ?= 2

# The browser of `make check-html`: Debian's Chromium, installed when missing (as root, or with sudo).
CHROMIUM ?= /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

# PYTHON=... on the command line uses that interpreter as it is (a GPU node with its own torch);
# otherwise the targets create and use the pinned virtual environment in $(VENV): the book's part
# for `make book`, all of it for the rest.
ifeq ($(origin PYTHON),command line)
BOOK_ENV :=
ENV :=
else
PYTHON := $(VENV)/bin/python
BOOK_ENV := $(VENV)/.book-installed
ENV := $(VENV)/.installed
endif

export IPYTHONDIR := $(CURDIR)/tools/ipython
export PYDEVD_DISABLE_FILE_VALIDATION := 1
unexport MPLBACKEND

.PHONY: help book test check-html check-kernels devices measure notebooks wheelhouse check-fresh mutants clean distclean

help:
	@echo "make book         build the site into _build/html from the committed notebooks"
	@echo "make test         the whole suite: unit tests, kernels on the CPU, notebook smoke runs, nbval, book build,"
	@echo "                  and the browser check of every page"
	@echo "make check-html   build the site, open every page in headless Chromium, screenshots in _build/screenshots"
	@echo "make check-kernels compile the book's kernels for sm_90a without a GPU, on Triton $(TRITON) and $(TRITON_NEXT)"
	@echo "                  (one configuration of each code path; ALL=1: every configuration the chapters launch)"
	@echo "make mutants      mutation testing of the ideas, the engine and the results store; fails below 85% killed"
	@echo "make measure      run every notebook in measure mode on this machine's GPU (chapter order)"
	@echo "make devices      replay every other device's results in results/ for the book's devices page"
	@echo "make notebooks    re-execute the committed notebooks in replay mode, in place (REFERENCE=$(REFERENCE))"
	@echo "make wheelhouse   download the notebooks' wheels for Python $(PY) into .whl/ (for an offline GPU node)"
	@echo "make check-fresh  list stale results (code or inputs changed) and damaged or leftover files"
	@echo "make clean        remove build outputs (distclean: the virtual environment too)"

$(VENV)/.book-installed: requirements-book.txt constraints.txt
	$(BOOTSTRAP_PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check -r requirements-book.txt
	touch $@

$(VENV)/.installed: $(VENV)/.book-installed requirements.txt pyproject.toml
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
	$(VENV)/bin/python -m pip show -q triton 2>/dev/null || \
	  $(VENV)/bin/python -m pip install -q --disable-pip-version-check triton==$(TRITON)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(VENV)/bin/python -m pip check
	touch $@

book: $(BOOK_ENV)
	$(PYTHON) -c "import sys; from jupyter_book.cli.main import main; sys.exit(main())" build . -W -n --keep-going
	@echo "The book is built: open _build/html/index.html"

test: $(ENV) $(CHROMIUM)
	$(PYTHON) -m ruff check lib tests tools notebooks
	$(MAKE) check-kernels
	BOOK_REQUIRE_BROWSER=1 $(PYTHON) -m pytest -n $(TEST_WORKERS) --dist loadfile
	$(MAKE) check-html

check-kernels: $(ENV) $(TRITON_NEXT_DIR)/.installed
	$(PYTHON) tools/check_kernels.py $(KERNELS)
	PYTHONPATH=$(TRITON_NEXT_DIR) $(PYTHON) tools/check_kernels.py $(KERNELS)

$(TRITON_NEXT_DIR)/.installed:
	$(PYTHON) -m pip install -q --disable-pip-version-check --no-deps --target $(TRITON_NEXT_DIR) triton==$(TRITON_NEXT)
	touch $@

mutants: $(ENV)
	rm -rf mutants
	mkdir -p .cache
	# a mutant that loops for ever grows its memory: each is capped at 8 GB
	ulimit -v 8000000; $(PYTHON) -m mutmut run --max-children 2 > .cache/mutmut.log 2>&1 || (tail -20 .cache/mutmut.log; exit 1)
	$(PYTHON) tools/mutation_score.py --at-least 0.85

check-html: $(ENV) $(CHROMIUM)
	$(MAKE) book
	$(PYTHON) tools/site/check_html.py _build/html --chromium $(CHROMIUM)

$(CHROMIUM):
	@command -v apt-get >/dev/null || { echo "$(CHROMIUM) is missing and this is not a Debian system: install \
	  Chromium and run make with CHROMIUM=<its path>"; exit 1; }
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium

measure: $(ENV)
	$(PYTHON) tools/book.py run --mode measure

devices: $(ENV)
	$(PYTHON) tools/book.py devices

notebooks: $(ENV)
	$(PYTHON) tools/book.py run --mode replay --reference $(REFERENCE)

wheelhouse: $(ENV)
	rm -rf .whl && mkdir -p .whl
	$(PYTHON) -m pip download -q --disable-pip-version-check --dest .whl -c constraints.txt \
	  --only-binary=:all: --implementation cp --python-version $(PY) \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
	  $(NOTEBOOK_PKGS)
	@echo "$$(ls .whl | wc -l) wheels, $$(du -sh .whl | cut -f1), in .whl/. On the GPU node:"
	@echo "  python3 -m pip install --no-index --find-links .whl $(NOTEBOOK_PKGS)"
	@echo "  make measure PYTHON=python3"

check-fresh: $(ENV)
	$(PYTHON) tools/book.py check-fresh

clean:
	rm -rf _build .pytest_cache .ruff_cache mutants
	find . -name __pycache__ -not -path "./$(VENV)/*" -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) .whl .cache
