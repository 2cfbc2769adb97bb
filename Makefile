# tandem - one Makefile for the library, the binary, tests and benchmarks.
#
#   make            bin/tandem and build/libtandem.a
#   make deps       install missing Debian packages (root, idempotent, fast)
#   make test       unit tests (Criterion), PyTorch comparisons, MPI tests,
#                   command-level tests; the kernel suites again on the
#                   AVX2 and portable paths (build/avx2, build/portable)
#   make asan-test  unit tests under AddressSanitizer + UBSan
#   make bench      benchmarks side by side with the peers
#   make demo       train on fortunes, save a checkpoint, sample from it
#   make fuzz       libFuzzer harnesses (tests/fuzz), clang + ASan + UBSan
#
# -march=native is deliberate: the forward GEMM and attention kernels use
# AVX-512, or AVX2 + FMA, when the build machine has it.  The portable path
# computes every element with the same sequence of fused multiply-adds, so
# results are bit-identical whichever path is compiled (tests/test_gemm.c
# and tests/test_attention.c check this; `make test` also builds the AVX2
# and portable paths in build/avx2 and build/portable and runs the kernel
# suites there, so every path is checked on an AVX-512 machine too).
# -ffp-contract=off: the compiler must never fuse a*b+c on its own; every
# FMA in the numerics is written explicitly, so the arithmetic is the same
# in every code path that shares a kernel.
# -fvect-cost-model=dynamic (-O3's): -O2's "very cheap" model leaves scalar
# every loop whose trip count is not known to be a multiple of the vector
# width (AdamW, SwiGLU, the norms).  Vectorising elementwise loops keeps
# their bits, and GCC does not reorder floating-point reductions without
# -ffast-math, which tandem never uses.

CC       := mpicc
BUILD    ?= build
PKGS     := openblas hdf5-openmpi libcjson libmicrohttpd libpcre2-8 libutf8proc cairo fontconfig libpng libjpeg
OPT      ?= -O2
CFLAGS   := -std=c11 $(OPT) -g -Wall -Wextra -Wshadow -march=native \
            -ffp-contract=off -fno-math-errno -fvect-cost-model=dynamic \
            -D_GNU_SOURCE -MMD -MP -I. \
            $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(EXTRA_CFLAGS)
LDLIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lm -lpthread
LDFLAGS  := $(EXTRA_LDFLAGS)

LIB_DIRS := core core/ops core/model core/tok core/chat core/chat/jinja core/image comm checkpoint checkpoint/hf checkpoint/gguf train train/quant infer infer/server rl obs plan
LIB_SRC  := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
LIB      := $(BUILD)/libtandem.a

UNIT_SRC := $(wildcard tests/test_*.c) tests/fixture.c
UNIT_OBJ := $(UNIT_SRC:%.c=$(BUILD)/obj/%.o)
UNIT_BIN := $(BUILD)/tests/unit
MPI_SRC  := $(wildcard tests/mpi_*.c)
MPI_BIN  := $(MPI_SRC:tests/%.c=$(BUILD)/tests/%)
# Renders chat templates for tests/cli/chat.sh: whole conversation files, bare
# templates with variables and random batches (`tandem tokenize --chat` renders one).
TOOL_BIN := $(BUILD)/tests/chat_render
BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

# The default build puts the binary in bin/; other trees (asan) keep theirs inside.
BIN      := $(if $(filter build,$(BUILD)),bin/tandem,$(BUILD)/bin/tandem)

.PHONY: all deps test unit isa-unit asan-test bench demo demo-vision fuzz clean check-features
all: check-features $(BIN)

deps:
	@./tandem.sh deps

# Say once which optional pieces this build found.
check-features:
	@for p in $(PKGS) criterion; do \
	  if pkg-config --exists $$p; then v=$$(pkg-config --modversion $$p); echo "tandem: found $$p $$v"; \
	  else echo "tandem: MISSING $$p (run: make deps)"; fi; done
	@if grep -q avx512f /proc/cpuinfo 2>/dev/null; then echo "tandem: kernels: AVX-512"; \
	 elif grep -q avx2 /proc/cpuinfo 2>/dev/null && grep -q ' fma' /proc/cpuinfo 2>/dev/null; then \
	   echo "tandem: kernels: AVX2 + FMA (no AVX-512 on this CPU)"; \
	 else echo "tandem: kernels: portable (no AVX2 or AVX-512 on this CPU)"; fi

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BIN): $(BUILD)/obj/main.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(UNIT_BIN): $(UNIT_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) -lcriterion

$(BUILD)/tests/mpi_%: $(BUILD)/obj/tests/mpi_%.o $(BUILD)/obj/tests/fixture.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/chat_render: $(BUILD)/obj/tests/chat_render.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

unit: $(BIN) $(UNIT_BIN) $(MPI_BIN) $(TOOL_BIN)

# The other kernel paths, each in its own tree (tests/run.sh runs them):
# AVX2 + FMA (built when the CPU has both) and portable (the x86-64
# baseline: no AVX, no FMA instructions).  On an AVX-512 machine
# -march=native alone never compiles them.  Only what the kernel suites
# need is built there: core/ and the optimizer, and the unit tests of the
# code with ISA-specific paths (grep __AVX512F__ and vexp: GEMM, attention,
# the exp of softmax / cross-entropy / SwiGLU, GELU's erf and exp, and
# their users, MoE and the model), linked as $(BUILD)/tests/kernels.
KERNEL_TESTS := tests/test_gemm.c tests/test_attention.c tests/test_softmax.c tests/test_swiglu.c \
                tests/test_moe.c tests/test_model.c tests/test_gelu.c tests/fixture.c
KERNEL_SRC   := $(foreach d,core core/ops core/model,$(wildcard $(d)/*.c)) train/optim.c
KERNEL_OBJ   := $(KERNEL_TESTS:%.c=$(BUILD)/obj/%.o) $(KERNEL_SRC:%.c=$(BUILD)/obj/%.o)
# The AVX2 path is built for Haswell's ISA (AVX2, FMA, F16C, BMI2) whatever
# the host, so that nothing newer (AVX-512, AVX-VNNI, GFNI ...) that
# -march=native would allow reaches it: what this suite runs is what an
# AVX2-only machine runs (tests/run.sh checks the binary's instructions).
ISA_AVX2_FLAGS     := -march=haswell -mtune=generic
ISA_PORTABLE_FLAGS := -march=x86-64 -mtune=generic

$(BUILD)/tests/kernels: $(KERNEL_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) -lcriterion

isa-unit:
	@if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then \
	  $(MAKE) --no-print-directory BUILD=$(BUILD)/avx2 EXTRA_CFLAGS="$(ISA_AVX2_FLAGS)" $(BUILD)/avx2/tests/kernels; \
	else echo "tandem: AVX2 + FMA kernels not built: this CPU has no AVX2 or no FMA"; fi
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/portable EXTRA_CFLAGS="$(ISA_PORTABLE_FLAGS)" \
	  $(BUILD)/portable/tests/kernels

test: deps
	@$(MAKE) --no-print-directory unit isa-unit
	@BUILD=$(BUILD) ./tests/run.sh

# Sanitized build in its own tree; runs the unit suite only (MPI and the
# command-level tests run in `make test`).
asan-test: deps
	@$(MAKE) --no-print-directory BUILD=build/asan OPT=-O1 \
	  EXTRA_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  EXTRA_LDFLAGS="-fsanitize=address,undefined" unit
	@BUILD=build/asan ./tests/run.sh --unit-only

bench: deps
	@$(MAKE) --no-print-directory $(BIN) $(BENCH_BIN)
	@BUILD=$(BUILD) ./bench/run.sh

# The demo: fortunes -> tokens -> a few minutes of training on both cores ->
# a checkpoint -> a sample from it through the inference engine -> the
# run's figures (tandem plot: runs/demo/plots/*.png, *.svg).
DEMO_DATA := $(BUILD)/fortunes.bin
demo: deps
	@$(MAKE) --no-print-directory $(BIN)
	@test -s $(DEMO_DATA) || ./bin/tandem data prepare --input /usr/share/games/fortunes --output $(DEMO_DATA)
	./bin/tandem train configs/demo.json data=$(DEMO_DATA)
	./bin/tandem eval --ckpt runs/demo --data $(DEMO_DATA) --seq-len 256
	./bin/tandem generate --ckpt runs/demo --prompt "A computer" --max-tokens 300 --temperature 0.8 --seed 7
	@echo "the demo's figures (docs/observability.md):"
	./bin/tandem plot runs/demo

# The vision demo (docs/vision.md): the shapes task of SPEC section 13,
# 30000 train and 1000 held-out images -> a small VLM trained on them mixed
# with fortunes text, on both cores (dp = 2 over MPI: the same run as one
# process, tests/mpi/vision_dp.sh) -> its answers about the held-out images
# through the engine; fails below 95% on colour or shape.
VDEMO_DIR := $(BUILD)/vision_demo
VDEMO_MPI ?= mpirun --oversubscribe --allow-run-as-root -np 2
demo-vision: deps
	@$(MAKE) --no-print-directory $(BIN)
	@test -s $(DEMO_DATA) || ./bin/tandem data prepare --input /usr/share/games/fortunes --output $(DEMO_DATA)
	./bin/tandem data images --output $(VDEMO_DIR)/train --n 30000 --seed 1
	./bin/tandem data images --output $(VDEMO_DIR)/heldout --n 1000 --seed 2
	bash -c 'time $(VDEMO_MPI) ./bin/tandem train configs/vision_demo.json dp=2 data=$(DEMO_DATA) images=$(VDEMO_DIR)/train'
	./bin/tandem eval-vision --ckpt runs/vision_demo --images $(VDEMO_DIR)/heldout --show 6 \
	  --check "What color is the shape?" --check "What shape is this?" --min-accuracy 0.95

# libFuzzer harnesses tests/fuzz/fuzz_<name>.c, each linked with the few
# sources it tests (FUZZ_SRC_<name>: no MPI, no HDF5), built by clang with
# ASan + UBSan and run for FUZZ_TIME seconds per harness on its seeds
# tests/fuzz/corpus/<name> (read only; tests/fuzz/seeds_<name>.py, when
# present, writes generated seeds into the build corpus) and
# build/fuzz/corpus/<name> (where new inputs go), with the dictionary
# tests/fuzz/<name>.dict when present.  A crash stops the run and leaves its
# input as build/fuzz/<name>-crash-*: once fixed, add it to
# tests/fuzz/corpus/<name>, which the unit tests replay.
#   make fuzz                          every harness
#   make fuzz-safetensors FUZZ_TIME=300
FUZZ       ?= $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_TIME  ?= 60
FUZZ_CC    ?= clang
FUZZ_SRC_safetensors := checkpoint/hf/safetensors.c core/common.c core/dtype.c
FUZZ_SRC_st_index    := $(FUZZ_SRC_safetensors)
FUZZ_SRC_chat        := $(wildcard core/chat/*.c core/chat/jinja/*.c) core/common.c
FUZZ_SRC_tok         := $(filter-out core/tok/tok_cmd.c,$(wildcard core/tok/*.c)) core/common.c
FUZZ_SRC_api         := infer/server/server_api.c infer/server/server_image.c $(wildcard core/image/image*.c) \
                        $(sort $(FUZZ_SRC_tok) $(FUZZ_SRC_chat))
FUZZ_SRC_hf_config   := checkpoint/hf/hf_config.c checkpoint/hf/families.c checkpoint/hf/safetensors.c \
                        core/model/config.c core/model/topology.c core/model/model.c core/common.c core/dtype.c \
                        core/ops/gemm.c core/ops/rope.c core/pool.c core/rng.c
FUZZ_SRC_image       := $(wildcard core/image/image*.c) core/common.c
FUZZ_LIBS  := $(shell pkg-config --libs openblas libcjson libutf8proc libpcre2-8 libpng libjpeg 2>/dev/null) -lpthread -lm
FUZZ_FLAGS := -std=c11 -g -O1 -D_GNU_SOURCE -I. -fsanitize=fuzzer,address,undefined \
              -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
              $(shell pkg-config --cflags openblas libcjson libutf8proc libpcre2-8 libpng libjpeg 2>/dev/null)

.SECONDEXPANSION:
$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $$(FUZZ_SRC_$$*)
	@command -v $(FUZZ_CC) >/dev/null || { echo "fuzz: $(FUZZ_CC) not found (./tandem.sh deps installs it)"; exit 1; }
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $< $(FUZZ_SRC_$*) -o $@ $(FUZZ_LIBS)

fuzz: $(FUZZ:%=$(BUILD)/fuzz/fuzz_%)
	@for h in $(FUZZ); do \
	  mkdir -p $(BUILD)/fuzz/corpus/$$h tests/fuzz/corpus/$$h; echo "fuzz: $$h for $(FUZZ_TIME) s"; \
	  if [ -f tests/fuzz/seeds_$$h.py ]; then /usr/bin/python3 tests/fuzz/seeds_$$h.py $(BUILD)/fuzz/corpus/$$h || exit 1; fi; \
	  $(BUILD)/fuzz/fuzz_$$h -max_total_time=$(FUZZ_TIME) -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
	    -print_final_stats=1 $$([ -f tests/fuzz/$$h.dict ] && echo -dict=tests/fuzz/$$h.dict) \
	    -artifact_prefix=$(BUILD)/fuzz/$$h- $(BUILD)/fuzz/corpus/$$h tests/fuzz/corpus/$$h || exit 1; \
	done

fuzz-%:
	@$(MAKE) --no-print-directory fuzz FUZZ=$*

clean:
	rm -rf build bin

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
