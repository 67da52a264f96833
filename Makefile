# tdreplay — developer entry points. `make serve` and `make test` set everything up.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SCHEMA ?= schemas/
ROOT   ?= ./tdreplay-data
HOST   ?= 127.0.0.1
PORT   ?= 8000
TOKEN_FILE ?=

.PHONY: setup dev serve demo test test-long test-deploy lint typecheck check bench bench-peers schema wheel clean redis chromium image base-image wheelhouse docker

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	# torch first: the CPU build pinned here avoids gigabytes of CUDA wheels
	$(BIN)/pip install "torch==2.13.0" || $(BIN)/pip install torch --index-url https://download.pytorch.org/whl/cpu

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -e ".[test]"
	touch $@

setup: $(VENV)/.installed          ## create .venv and install tdreplay (editable) with test tools

redis:                             ## make sure redis-server is installed (the tests start their own)
	@command -v redis-server >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-server; \
	  else echo "install redis-server (e.g. brew install redis)"; exit 1; fi; }

chromium:                          ## make sure chromium is installed (the /status page's browser test drives it)
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium; \
	  else echo "no chromium: the /status browser test will be skipped (install chromium to run it)"; fi; }

# HOST other than loopback needs a token: TOKEN_FILE=path (or TDREPLAY_TOKEN in the environment)
serve: setup                       ## run the service on the embedded default (memmap, no Redis)
	$(BIN)/tdreplay serve --schema $(SCHEMA) --root $(ROOT) --host $(HOST) --port $(PORT) --restore --checkpoint-on-shutdown $(if $(TOKEN_FILE),--token-file $(TOKEN_FILE))

demo: setup                        ## a storage-only walk-through: extend, sample, checkpoint, export
	$(BIN)/python -m tdreplay.storage.demo --root $(ROOT)

lint: setup
	$(BIN)/ruff check storage service client codec system cli adapters examples tests bench
	$(BIN)/ruff format --check storage service client codec system cli adapters examples tests bench

typecheck: setup
	$(BIN)/mypy

# the suite in TEST_JOBS processes, a test file each at a time (its module's servers shared)
TEST_JOBS ?= 3
test: setup redis chromium lint typecheck   ## lint, type-check and run the test suite (not the Docker tests)
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not docker and not ray and not slow"

# the example trainings and the GPU check script (each in processes of its own), and TorchRL's
# RayCollector into the buffer on a real local Ray runtime (loopback only; Ray and its actors
# are slow to start): ~2 min
test-long: setup redis   ## run the example, bench-script and Ray tests (not part of make test; .ci/run runs them)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_JOBS) --dist loadfile -m "slow or ray" tests

# ---------------------------------------------------------------- the image
# `make image` builds the server image with no network inside the build: every wheel is prepared
# here, on the host, into WHEELS (torch pinned, the CPU build from TORCH_INDEX when that index
# answers, else what this host's pip finds); the Dockerfile installs them in a build stage and
# keeps only the venv. Where no registry is reachable: make base-image, then
# make image BASE_IMAGE=tdreplay-base:bookworm.
IMAGE       ?= tdreplay:0.1.0
BASE_IMAGE  ?= python:3.11-slim-bookworm
DEBIAN_BASE ?= tdreplay-base:bookworm
WHEELS      ?= deploy/docker/wheels
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
DOCKER      ?= docker
CONSTRAINTS := deploy/docker/constraints.txt

$(WHEELS)/.complete: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	rm -rf $(WHEELS) && mkdir -p $(WHEELS)
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --dest $(WHEELS) --timeout 20 --retries 1 \
	  --index-url $(TORCH_INDEX) "torch==2.13.0" \
	  || $(BIN)/python -m pip download -q --no-deps --only-binary=:all: --dest $(WHEELS) "torch==2.13.0"
	# every dependency at its pinned version; async-timeout for Pythons before 3.11.3 (Debian 12's
	# 3.11.2), where redis-py needs it; setuptools and wheel build tdreplay inside the image
	$(BIN)/python -m pip wheel -q --wheel-dir $(WHEELS) --find-links $(WHEELS) --constraint $(CONSTRAINTS) \
	  . async-timeout setuptools wheel
	rm -f $(WHEELS)/tdreplay-*.whl   # the image installs tdreplay from its own copy of the source
	touch $@

wheelhouse: $(WHEELS)/.complete    ## the wheels `make image` installs (WHEELS)

docker:                            ## make sure a Docker engine answers (installs docker.io and starts dockerd when absent)
	@$(DOCKER) info >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  command -v dockerd >/dev/null 2>&1 || { $$SUDO apt-get update -qq && \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap docker-compose; }; \
	  $$SUDO sh -c 'nohup dockerd >/var/log/tdreplay-dockerd.log 2>&1 &'; \
	  for i in $$(seq 60); do $(DOCKER) info >/dev/null 2>&1 && exit 0; sleep 1; done; \
	  echo "dockerd did not start: see /var/log/tdreplay-dockerd.log"; exit 1; }

base-image: docker                 ## a Debian bookworm base with python3 made with debootstrap (tag DEBIAN_BASE; built once)
	DOCKER=$(DOCKER) deploy/docker/base-image.sh $(DEBIAN_BASE)

image: $(WHEELS)/.complete         ## build the server image IMAGE on BASE_IMAGE (no network inside the build)
	$(DOCKER) build --network none --build-arg BASE_IMAGE=$(BASE_IMAGE) -t $(IMAGE) .
	@$(DOCKER) image inspect --format 'built {{index .RepoTags 0}}: {{.Size}} bytes' $(IMAGE)

# the image, compose and a second container against a real Docker engine (minutes; builds the
# debootstrap base once and the image on it)
test-deploy: setup docker base-image   ## run tests/deploy against a real dockerd (not part of make test)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m docker tests/deploy

BENCH_ARGS ?=
bench: setup                       ## benchmarks (not tests): ratios against baselines in the same run (BENCH_ARGS="--quick --json out.json")
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# DeepMind Reverb in an environment of its own: dm-reverb 0.14.0 (its last release) has wheels
# for CPython 3.8-3.11 on x86-64 Linux only, and wants TensorFlow 2.15 (the CPU build will do)
PEERS        ?= .venv-peers
PEERS_PYTHON ?= $(shell command -v python3.11 2>/dev/null || echo $(PYTHON))
PEERS_JSON   ?= bench/results/peers.json
PEERS_ARGS   ?=
$(PEERS)/.installed:
	rm -rf $(PEERS) && $(PEERS_PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/pip install -q --upgrade pip
	$(PEERS)/bin/pip install -q "dm-reverb==0.14.0" "tensorflow-cpu==2.15.*" "numpy<2"
	touch $@

bench-peers: setup                 ## tdreplay next to DeepMind Reverb, same workloads, one run (~7 min; PEERS_ARGS=--quick)
	@$(MAKE) --no-print-directory $(PEERS)/.installed || { rm -rf $(PEERS); \
	  echo "bench-peers skipped: DeepMind Reverb could not be installed with $(PEERS_PYTHON) (dm-reverb 0.14.0 needs CPython 3.8-3.11 on x86-64 Linux; set PEERS_PYTHON=python3.11)"; \
	  exit 0; }
	@if [ -f $(PEERS)/.installed ]; then \
	  $(BIN)/python bench/peers_bench.py --peers-python $(PEERS)/bin/python --json $(PEERS_JSON) $(PEERS_ARGS); fi

schema: setup                      ## regenerate schemas/table.schema.json from the pydantic models
	$(BIN)/python -c "from tdreplay.storage.spec import main; main()"

wheel: setup                       ## build the wheel and check it installs and imports in a clean venv
	$(BIN)/python -m build --wheel --outdir dist .
	rm -rf /tmp/tdreplay-wheel-check && $(PYTHON) -m venv /tmp/tdreplay-wheel-check
	/tmp/tdreplay-wheel-check/bin/pip install -q "torch==2.13.0" || true
	/tmp/tdreplay-wheel-check/bin/pip install -q dist/tdreplay-*.whl
	cd /tmp && /tmp/tdreplay-wheel-check/bin/python -c "import tdreplay.storage, tdreplay.client, tdreplay.service, tdreplay.codec, tdreplay.system, tdreplay.cli, importlib.util as u; assert u.find_spec('storage') is None and u.find_spec('service') is None and u.find_spec('client') is None; print('wheel ok')"

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache tdreplay-data $(WHEELS)
