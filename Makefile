# The two commands of the quick start, and the steps they need on a fresh machine.
#   make image ENGINE=llama   build + verify one engine image on this machine's local base
#   make test                 the whole test suite (what CI runs)
ENGINE ?= llama
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup image images test lint render render-check bench fuzz-relay clean
SECONDS ?= 600

# Host prerequisites (debootstrap, Python packages) - idempotent, quick when already done.
setup: $(VENV)/.ready
$(VENV)/.ready: requirements-dev.txt requirements-dev.lock scripts/setup-host
	bash scripts/setup-host $(VENV)
	touch $@

image: setup
	$(PY) build.py --engine $(ENGINE) --local

images: setup
	$(PY) build.py --all --local

test: setup
	$(PY) -m pytest -n 2 --dist loadgroup --no-loadscope-reorder --durations=25

lint: setup
	$(VENV)/bin/ruff check .
	$(PY) build.py --all --render-only --out .cache/rendered
	for f in .cache/rendered/*/Dockerfile; do $(VENV)/bin/hadolint --config .hadolint.yaml $$f || exit 1; done
	$(VENV)/bin/actionlint .github/workflows/*.yml

# rendered/<engine>/Dockerfile is committed (generated): regenerate after any spec or template change.
render: setup
	$(PY) -m bakery.recipe.rendered

render-check: setup
	$(PY) -m bakery.recipe.rendered --check

bench: setup
	$(PY) bench/run.py

# bakery-relay's fuzz harness for longer than the suite's run (docs/tests.md).
fuzz-relay: setup
	$(PY) -m tests.worker.relay_fuzz --seconds $(SECONDS)

clean:
	rm -rf $(VENV) .cache out
