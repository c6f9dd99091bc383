# llmfleet: the two commands (`make demo`, `make test`) and their parts.
# The tools go into the checkout (.venv/); every built test artifact (the host image, llama.cpp,
# the models, the vLLM venv, the gates' stamps) is built once per machine into the artifact cache
# $(LLMFLEET_CACHE) (scripts/artifact-cache.py), keyed by its inputs, and linked from the
# checkout's .cache/, which keeps only this checkout's own state (podman storage, collections
# link, logs). The only system changes are apt packages (scripts/host-setup.sh).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ROOT := $(CURDIR)
PYTHON ?= python3.11
VENV := $(ROOT)/.venv
CACHE := $(ROOT)/.cache
# The machine-wide artifact cache (docs/testing.md, "The artifact cache"); `make clean-cache` empties it.
LLMFLEET_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/llmfleet
STAMP := $(VENV)/.requirements-$(shell sha256sum requirements.txt | cut -c1-12)
DEMO_INVENTORY ?= inventories/demo
DEMO_TUNE_INVENTORY ?= inventories/demo-uneven
SCENARIO ?=
# Molecule scenarios run side by side in this many lanes (scripts/run-molecule.sh; the scenarios
# with a RUN_ALONE file run first, by themselves). MOLECULE_LANES=1: one at a time, as before.
MOLECULE_LANES ?= 2
# pytest-xdist workers for `make unit` and `make manifests` (PYTEST_JOBS=0: one process, as before).
# Whole test files go to one worker (--dist loadfile), so a module's fixtures still render once.
PYTEST_JOBS ?= 2
PYTEST_PAR = -n $(PYTEST_JOBS) --dist loadfile
# tests/unit: the files in collection order, which tests/conftest.py starts with the files holding
# a `slow` test. xdist's default re-sorts them by test count, which sent the one-test files of
# 1-4 minutes (test_lock_flow.py, test_k3s_install.py) last, to run alone after the other worker
# was done (docs/testing.md, "Test time").
UNIT_PAR = $(PYTEST_PAR) --no-loadscope-reorder

export PATH := $(VENV)/bin:$(PATH)
export CACHE
export LLMFLEET_CACHE
export CONTAINERS_CONF := $(CACHE)/podman/containers.conf
export CONTAINERS_STORAGE_CONF := $(CACHE)/podman/storage.conf
export ANSIBLE_COLLECTIONS_PATH := $(CACHE)/collections
export ANSIBLE_CONFIG := $(ROOT)/ansible.cfg
export GGML_NO_BACKTRACE := 1
export PY_COLORS := 0
export ANSIBLE_FORCE_COLOR := 0
export ANSIBLE_NOCOLOR := 1
export NO_COLOR := 1

.PHONY: help venv link host-setup images vulkan-image test-artifacts vllm-artifacts vulkan-artifacts arm64-artifacts arm64-images setup lint unit \
        docs-check manifests \
        build-check browser molecule demo-check demo-mixed-check demo-gpu-check demo-tune-check test demo demo-down requirements clean clean-cache \
        sanity docs docs-lint galaxy-check gates

help:
	@echo "make demo       bring up the demo fleet and serve a model split across it"
	@echo "make demo-down  remove the demo fleet"
	@echo "make test       every check: lint, unit, docs, the ecosystem's gates, manifests, build, molecule"
	@echo "parts: make lint | unit | docs-check | manifests | build-check | browser | molecule [SCENARIO=name]"
	@echo "       make demo-check (the demo end to end: site.yml, verify, the chat page in a browser)"
	@echo "       make demo-mixed-check (inventories/demo-mixed: an arm64 worker under qemu-user beside x86_64 hosts)"
	@echo "       make demo-gpu-check (inventories/demo-gpu: Vulkan devices (lavapipe) on the head and a worker, checked per device)"
	@echo "       make demo-tune-check (demo-uneven up, then the README's tune.yml line on it)"
	@echo "       make test-artifacts | vllm-artifacts | images | venv | setup (all of them)"
	@echo "       make vulkan-artifacts (llama.cpp's Vulkan flavour: .cache/llama.cpp-vulkan, .cache/dist-vulkan)"
	@echo "       make vulkan-image (the Vulkan test-host image: lavapipe; for inventories/demo-gpu)"
	@echo "       make arm64-artifacts (llama.cpp cross-built for arm64: .cache/llama.cpp-arm64, .cache/dist-arm64)"
	@echo "       make arm64-images (the arm64 host image under qemu-user: localhost/llmfleet-host:bookworm-arm64)"
	@echo "       make clean-cache (empty the machine's artifact cache $(LLMFLEET_CACHE))"
	@echo "the ecosystem's gates: make sanity [SANITY='--test pep8'] | docs | docs-lint | galaxy-check"
	@echo "       make gates (the three, each skipped while its inputs are unchanged; GATES_FORCE=1)"

$(STAMP): requirements.txt
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.txt
	@rm -f $(VENV)/.requirements-* && touch $@

venv: $(STAMP)

# The checkout is the collection: link it where ansible looks for llmfleet.cluster.
link:
	@mkdir -p $(CACHE)/collections/ansible_collections/llmfleet
	@ln -sfn $(ROOT) $(CACHE)/collections/ansible_collections/llmfleet/cluster

host-setup:
	@bash scripts/host-setup.sh

images: host-setup
	@bash scripts/build-host-image.sh

# The Vulkan test-host image (localhost/llmfleet-host:bookworm-vulkan: the host image plus the Vulkan
# loader, Mesa's lavapipe and vulkaninfo), its own artifact-cache entry, built only when asked
# (inventories/demo-gpu, demo-gpu-check; docs/vulkan.md): the other fleets never pay for it.
vulkan-image: images
	@bash scripts/build-host-image-vulkan.sh

test-artifacts: venv
	@PY=$(VENV)/bin/python bash scripts/test-artifacts.sh

vllm-artifacts:
	@bash scripts/vllm-artifacts.sh

# llama.cpp's Vulkan flavour (ubuntu-vulkan-x64) from the pinned source, its own cache entry
# (scripts/build-llama-cpp.sh vulkan; docs/vulkan.md). `make test` needs it for demo-gpu-check.
vulkan-artifacts: venv host-setup
	@PY=$(VENV)/bin/python bash scripts/build-llama-cpp.sh vulkan

# llama.cpp's ubuntu-arm64 flavour cross-built on x86_64, its own cache entry, at the lowest CPU
# priority (scripts/build-llama-cpp.sh arm64; docs/testing.md). Not part of `make test`.
arm64-artifacts: venv host-setup
	@PY=$(VENV)/bin/python nice -n 19 bash scripts/build-llama-cpp.sh arm64

# The arm64 test-host image (scripts/build-host-image.sh arm64: debootstrap --arch=arm64 under
# qemu-user, localhost/llmfleet-host:bookworm-arm64), its own cache entry, at the lowest CPU
# priority. Only when asked (the mixed demo fleet, inventories/demo-mixed): not in `make setup`.
arm64-images: host-setup
	@nice -n 19 bash scripts/build-host-image.sh arm64

# Everything `make test` needs built, the vLLM venv beside the llama.cpp build.
setup: venv link host-setup images
	@LLMFLEET_VLLM_ARTIFACTS=1 PY=$(VENV)/bin/python bash scripts/test-artifacts.sh

lint: venv link
	yamllint -s .
	ruff check .
	ruff format --check .
	ansible-lint --offline --profile production -q
	antsibull-changelog lint
	antsibull-changelog lint-changelog-yaml --strict changelogs/changelog.yaml

unit: venv link
	pytest -q $(UNIT_PAR) tests/unit

docs-check: venv link
	@bash scripts/check-plugin-docs.sh

# The Kubernetes manifest tests also run the rendered pods' commands on podman hosts.
manifests: venv link images test-artifacts
	pytest -q $(PYTEST_PAR) tests/manifests

build-check: venv
	pytest -q tests/build

browser: venv link host-setup
	pytest -q tests/browser

# molecule/vllm_lws needs the vLLM venv: built (or linked from the artifact cache) when it runs,
# that is with no SCENARIO or when SCENARIO names it.
molecule: venv link images test-artifacts $(if $(SCENARIO),$(if $(filter vllm_lws,$(SCENARIO)),vllm-artifacts),vllm-artifacts)
	@mkdir -p $(LLMFLEET_CACHE)/ccache
	@LLMFLEET_MOLECULE_LANES=$(MOLECULE_LANES) bash scripts/run-molecule.sh $(SCENARIO)

# The demo end to end: site.yml on the demo fleet (ending in verify.yml), then the chat page in a
# real browser; the fleet is removed afterwards unless it was running before.
demo-check: venv link host-setup images test-artifacts
	@bash scripts/demo-check.sh $(DEMO_INVENTORY)

# The mixed fleet (inventories/demo-mixed: an x86_64 head and worker, an arm64 worker under
# qemu-user) end to end: site.yml ending in verify.yml, then each host's uname -m, installed
# flavour and llama.cpp buffers checked in verify's table; removed afterwards unless running before.
DEMO_MIXED_INVENTORY ?= inventories/demo-mixed
demo-mixed-check: venv link host-setup images test-artifacts arm64-images arm64-artifacts
	@bash scripts/demo-mixed-check.sh $(DEMO_MIXED_INVENTORY)

# The GPU fleet (inventories/demo-gpu: a head and a worker with a real Vulkan device, Mesa's
# lavapipe, beside a CPU worker) end to end: site.yml ending in verify.yml, then every planned
# device's buffers in verify's table against the plan, then the README's tune.yml line on it (each
# device priced by the profile); removed afterwards unless running before.
DEMO_GPU_INVENTORY ?= inventories/demo-gpu
demo-gpu-check: venv link host-setup images test-artifacts vulkan-image vulkan-artifacts
	@bash scripts/demo-gpu-check.sh $(DEMO_GPU_INVENTORY)

# The demo fleet as the user's playground: make demo, then the README's tune.yml line on it as
# printed (it measures through the fleet's TLS front, decides and says so); removed afterwards
# unless it was running before. DEMO_TUNE_INVENTORY: inventories/demo-uneven by default.
demo-tune-check: venv link images test-artifacts
	@bash scripts/demo-tune-check.sh $(DEMO_TUNE_INVENTORY)

# The ecosystem's gates (docs/development.md): ansible-test sanity, the role READMEs and the docs
# site, antsibull-docs' lint, galaxy-importer on the built tarball. `make test` runs them through
# `make gates`, each skipped while the files it reads are unchanged since it last passed
# (scripts/gate-cache.sh, stamps in .cache/gates; GATES_FORCE=1 runs them anyway).
SANITY ?=
sanity: venv link host-setup
	@bash scripts/sanity.sh $(SANITY)

docs: venv link
	@bash scripts/build-docs.sh

docs-lint: venv link
	antsibull-docs lint-collection-docs --plugin-docs .
	pytest -q tests/docs

galaxy-check: venv
	@bash scripts/galaxy-check.sh

# What each gate reads (git pathspecs): sanity every file; docs-lint the plugins, roles and docs
# and the tools that build them; galaxy-check what the tarball holds (galaxy.yml's build_ignore
# leaves the rest out) and its own script.
SANITY_INPUTS := .
DOCS_LINT_INPUTS := plugins roles meta docs galaxy.yml README.md LICENSE pyproject.toml tests/docs \
	tests/conftest.py scripts/build-docs.sh scripts/docsite scripts/role-readme.md.j2
GALAXY_CHECK_INPUTS := . ':!tests' ':!molecule' ':!bench' ':!inventories/demo' ':!changelogs/fragments'
gates: venv link host-setup
	@bash scripts/gate-cache.sh sanity $(SANITY_INPUTS) -- $(MAKE) --no-print-directory sanity
	@bash scripts/gate-cache.sh docs-lint $(DOCS_LINT_INPUTS) -- $(MAKE) --no-print-directory docs-lint
	@bash scripts/gate-cache.sh galaxy-check $(GALAXY_CHECK_INPUTS) -- $(MAKE) --no-print-directory galaxy-check

# Every part in order (setup, lint, unit, docs-check, gates, manifests, build-check, browser,
# molecule, demo-check, demo-mixed-check, demo-gpu-check, demo-tune-check), stopping at the first that fails, then each part's seconds
# (scripts/make-test.sh; also in .cache/make-test-times.txt).
test:
	@MAKE="$(MAKE)" bash scripts/make-test.sh

# An inventory with an arm64 host (demo_podman.arch: arm64, as inventories/demo-mixed) also needs the
# arm64 image and llama.cpp's ubuntu-arm64 build (each from the artifact cache when built before);
# one with a Vulkan host (llama_cpp_flavour: ubuntu-vulkan-x64, as inventories/demo-gpu) the Vulkan
# image and build.
demo_arm64 = $(if $(shell grep -rls 'arch: arm64' $(1) 2>/dev/null),arm64-images arm64-artifacts)
demo_vulkan = $(if $(shell grep -rls 'ubuntu-vulkan-x64' $(1) 2>/dev/null),vulkan-image vulkan-artifacts)

demo: venv link images test-artifacts $(call demo_arm64,$(DEMO_INVENTORY)) $(call demo_vulkan,$(DEMO_INVENTORY))
	@bash scripts/demo.sh up $(DEMO_INVENTORY)

demo-down: venv link
	@bash scripts/demo.sh down $(DEMO_INVENTORY)

# Regenerate the fully pinned requirements.txt from requirements.in.
requirements:
	rm -rf $(CACHE)/req-venv && $(PYTHON) -m venv $(CACHE)/req-venv
	$(CACHE)/req-venv/bin/pip install -q -r requirements.in
	$(CACHE)/req-venv/bin/pip freeze --exclude-editable | grep -v '^pip==' > requirements.txt

clean:
	rm -rf build tests/output .pytest_cache .ruff_cache

# Empty the machine's artifact cache (every checkout on this machine rebuilds on its next run).
clean-cache:
	@python3 scripts/artifact-cache.py clean
