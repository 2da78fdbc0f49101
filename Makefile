# Two commands do all set-up on a fresh machine:
#   make fit    venv + install + prepare the embedded corpus + the smoke run (CPU, a few minutes)
#   make test   venv + install + the whole test suite, one worker per core (pytest-xdist)
#   make docs   the documentation site, built into build/site (tests/test_site.py builds it too, in make test)
#   make test-fast   the inner loop: unit and numerical tests, no processes started, nothing long (-m "not slow")
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# workers for pytest-xdist; `--dist loadfile` keeps a file's tests on one worker, so a module fixture (one fit
# read by several tests) is built once; `--no-loadscope-reorder` hands out the files in the order
# tests/conftest.py gives them (heaviest first) rather than xdist's (most tests first)
PYTEST_WORKERS ?= auto
PYTEST := $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: fit test test-fast install prepare clean tensorboard benchmark slurm browser docs

# SLURM and munge (Debian's slurm-wlm, munge): tests/test_slurm.py starts a one-node cluster of its own on this
# machine. Installed with apt-get where the set-up runs as root (CI does); elsewhere it says what to run.
slurm:
	@if [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ] && command -v sbatch >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing slurm-wlm and munge (apt-get) for tests/test_slurm.py"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null; } || \
	  echo "warning: apt-get could not install slurm-wlm and munge: tests/test_slurm.py will fail"; \
	else echo "warning: SLURM is not installed and this is not root: tests/test_slurm.py will fail; run as root: apt-get install slurm-wlm munge"; fi

# A headless Chromium (Debian's chromium-headless-shell): tests/test_site.py opens the built documentation in it.
# Installed with apt-get where the set-up runs as root (CI does); elsewhere it says what to run.
browser:
	@if command -v chromium-headless-shell >/dev/null || command -v chromium >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing chromium-headless-shell (apt-get) for tests/test_site.py"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium-headless-shell >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium-headless-shell >/dev/null; } || \
	  echo "warning: apt-get could not install chromium-headless-shell: tests/test_site.py will fail"; \
	else echo "warning: no headless Chromium and this is not root: tests/test_site.py will fail; run as root: apt-get install chromium-headless-shell"; fi

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch is pinned inside pyproject (same resolve), so pip takes the local CPU build of torch 2.13.0
	$(BIN)/pip install -q -e '.[test,docs]'
	# litdata pulls a CUDA torchvision that breaks `import lightning` (torchvision::nms): remove it
	$(BIN)/pip uninstall -y -q torchvision || true
	$(BIN)/python -c "import lightning, litdata, torch, scalevec_lit.callbacks; print('import check ok: torch', torch.__version__, 'lightning', lightning.__version__)"
	touch $(STAMP)

install: $(STAMP)

prepare: $(STAMP)
	$(BIN)/python -m scalevec_lit prepare --if-missing

fit: prepare
	$(BIN)/python -m scalevec_lit fit --config recipes/smoke.yaml

test: $(STAMP) slurm browser
	$(PYTEST) --durations=30 $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PYTEST) -m "not slow" --durations=15 $(PYTEST_ARGS)

# the documentation site (README as the front page, the guides, the API reference from the docstrings), built
# with --strict into build/site; open build/site/index.html, or serve it: python -m http.server -d build/site
docs: $(STAMP)
	$(BIN)/python tools/build_docs.py

tensorboard: $(STAMP)
	$(BIN)/tensorboard --logdir runs

clean:
	rm -rf runs data/prepared
