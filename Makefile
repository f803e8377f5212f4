# kl — one binary (build/kl), unit tests under ASan/UBSan, fuzz targets.
#
#   make            build/kl (optimized)
#   make test       unit + corpus tests under AddressSanitizer and UndefinedBehaviorSanitizer
#   make demo       install missing packages, build, synthesize a tiny checkpoint and audit it
#   make fuzz       build the libFuzzer targets (clang) and run each for FUZZ_SECONDS
#   make install    build/kl to $(DESTDIR)$(PREFIX)/bin (PREFIX default /usr/local)
#   make portable   build/portable/kl with liburing, libaio, libcrypto and libpcre2-8 linked statically
#                   and libcjson.so.1 beside it (found through an $ORIGIN rpath: no LD_LIBRARY_PATH),
#                   for machines without the -dev packages (the GPU machine); copy the folder whole

CC       ?= cc
CSTD     := -std=c11 -D_GNU_SOURCE
WARN     := -Wall -Wextra -Werror -Wno-unused-parameter
CFLAGS   ?= -O2 -g
CPPFLAGS := -I. -I/usr/include/cjson
LDLIBS   := -luring -laio -lcrypto -lcjson -lpcre2-8 -lmicrohttpd -lpthread -lm
ASANFLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lrt -lm -lpthread)

LIB_DIRS := common loader audit convert synth engine serve
LIB_SRC  := $(sort $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c)))
CLI_SRC  := $(sort $(wildcard cli/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
HDRS     := $(sort $(foreach d,$(LIB_DIRS) cli tests kernels,$(wildcard $(d)/*.h)))

B  ?= build
BA ?= $(B)/asan

LIB_OBJ  := $(LIB_SRC:%.c=$(B)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(B)/obj/%.o)
ALIB_OBJ := $(LIB_SRC:%.c=$(BA)/obj/%.o)
ACLI_OBJ := $(CLI_SRC:%.c=$(BA)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BA)/%)
REPLAY_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(BA)/replay_%)
# tokenizer parity with OpenAI's tiktoken core (node; packages from scripts/install-deps.sh)
TEST_SCRIPTS := tests/tokenizer/parity.sh
# kl serve through the official openai npm client (node; packages from scripts/install-deps.sh)
TEST_SCRIPTS += tests/serve/client.sh
# 32 streaming clients against kl serve, every reply equal to the request served alone
TEST_SCRIPTS += tests/serve/soak.sh
# make install (PREFIX, DESTDIR) and make portable (runs from any folder without LD_LIBRARY_PATH)
TEST_SCRIPTS += tests/install.sh
# the README's example commands, top to bottom (all but the 9 GB ones)
TEST_SCRIPTS += tests/readme.sh
# every GPU kernel starts with KL_GPU_GRID_WAIT() (programmatic launches in decode graphs)
TEST_SCRIPTS += tests/gpu_wait.sh
# kernels/skinny.cu's kernels run on the CPU at lane level against double (no GPU needed)
TEST_SCRIPTS += tests/gpu/skinny_lanes.sh

.PHONY: all test demo fuzz portable install clean deps gpu gpu-kl gpu-compile gpu-trace
all: $(B)/kl

$(B)/obj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(WARN) $(CFLAGS) $(CPPFLAGS) -c $< -o $@

$(BA)/obj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(WARN) $(ASANFLAGS) $(CPPFLAGS) -c $< -o $@

$(B)/libkl.a: $(LIB_OBJ)
	@rm -f $@; ar rcs $@ $^

$(BA)/libkl.a: $(ALIB_OBJ)
	@mkdir -p $(BA); rm -f $@; ar rcs $@ $^

$(B)/kl: $(CLI_OBJ) $(B)/libkl.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(B)/libkl.a $(LDLIBS)

$(BA)/kl: $(ACLI_OBJ) $(BA)/libkl.a
	$(CC) $(ASANFLAGS) -o $@ $(ACLI_OBJ) $(BA)/libkl.a $(LDLIBS)

# Tests may call the CLI's commands directly: link them with the cli objects except main.
ACLI_NOMAIN := $(filter-out $(BA)/obj/cli/main.o,$(ACLI_OBJ))

$(BA)/test_%: tests/test_%.c tests/testutil.h $(BA)/libkl.a $(ACLI_NOMAIN) $(HDRS)
	$(CC) $(CSTD) $(WARN) $(ASANFLAGS) $(CPPFLAGS) -o $@ $< $(ACLI_NOMAIN) $(BA)/libkl.a $(LDLIBS) $(CHECK_LIBS)

$(BA)/replay_%: tests/fuzz/%.c tests/fuzz/replay_main.c $(BA)/libkl.a $(HDRS)
	$(CC) $(CSTD) $(WARN) $(ASANFLAGS) $(CPPFLAGS) -o $@ $< tests/fuzz/replay_main.c $(BA)/libkl.a $(LDLIBS)

test: $(BA)/kl $(TEST_BIN) $(REPLAY_BIN) gpu-compile
	@KL_BIN=$(abspath $(BA)/kl) sh tests/run_tests.sh $(TEST_BIN) $(REPLAY_BIN) $(TEST_SCRIPTS)

# The CUDA and HIP paths must keep compiling where nvcc / hipcc are installed (device tests
# run on the GPU machine: scripts/gpu/, or `make GPU=cuda gpu` there).
gpu-compile:
	@if [ -x "$(NVCC)" ] || command -v "$(NVCC)" >/dev/null 2>&1; then $(MAKE) --no-print-directory GPU=cuda gpu; \
	else echo "make test: no nvcc, the CUDA path was not compiled"; fi
	@if command -v "$(HIPCC)" >/dev/null 2>&1; then $(MAKE) --no-print-directory GPU=hip gpu; \
	else echo "make test: no hipcc, the HIP path was not compiled"; fi

demo:
	@sh scripts/demo.sh

# ---- fuzzing (clang, libFuzzer) ----
FUZZ_SECONDS ?= 60
BF ?= $(B)/fuzz
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(BF)/%)
$(BF)/%: tests/fuzz/%.c $(LIB_SRC) $(HDRS)
	@mkdir -p $(BF)
	clang $(CSTD) -g -O1 -fsanitize=fuzzer,address,undefined $(CPPFLAGS) -o $@ $< $(LIB_SRC) $(LDLIBS)
fuzz: $(FUZZ_BIN)
	@for f in $(FUZZ_BIN); do n=$$(basename $$f); mkdir -p build/fuzz-corpus/$$n; \
	  echo "fuzz: $$n for $(FUZZ_SECONDS) s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=build/fuzz-$$n- build/fuzz-corpus/$$n tests/fuzz/corpus/$$n || exit 1; done

# ---- installing ----
PREFIX ?= /usr/local
install: $(B)/kl
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(B)/kl $(DESTDIR)$(PREFIX)/bin/kl

# ---- portable binary for the GPU machine ----
# Debian ships no static cJSON (libcjson-dev has only the .so): the shared library travels
# beside the binary, which finds it through an $ORIGIN rpath.
BP ?= $(B)/portable
portable: $(B)/libkl.a $(CLI_OBJ)
	@mkdir -p $(BP)
	$(CC) -o $(BP)/kl $(CLI_OBJ) $(B)/libkl.a -Wl,-Bstatic -luring -laio -lcrypto -lpcre2-8 \
	  -lmicrohttpd -Wl,-Bdynamic -lcjson -lgnutls -lpthread -lm -ldl -Wl,-rpath,'$$ORIGIN'
	cp -L /usr/lib/x86_64-linux-gnu/libcjson.so.1 $(BP)/

# ---- GPU build (make GPU=cuda gpu, or GPU=hip): kl with the GPU backend, and the device tests ----
# One source: kernels/gpu.h maps the HIP runtime names to CUDA under nvcc.  $(BG)/kl is linked
# like `make portable` (static liburing, libaio, libcrypto, libpcre2-8; libcjson beside it) plus
# the GPU runtime (static cudart; libamdhip64 for HIP), so the folder runs on the GPU machine.
GPU_ARCH ?= sm_90
HIP_ARCH ?= gfx90a
NVCC     ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) nvcc)
HIPCC    ?= hipcc
CUDA_LIB ?= $(dir $(realpath $(NVCC)))../lib64
ifeq ($(GPU),cuda)
GPUCC    := $(NVCC) -std=c++17 -O3 -arch=$(GPU_ARCH) -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter
GPU_LIBS := -L$(CUDA_LIB) -lcudart_static -lrt
else ifeq ($(GPU),hip)
GPUCC    := $(HIPCC) --offload-arch=$(HIP_ARCH) -std=c++17 -O3 -Wall -Wextra -Werror -Wno-unused-parameter
GPU_LIBS := -lamdhip64
# HIP marks every runtime call nodiscard; the device tests free and time without checking each
GPU_TEST_FLAGS := -Wno-unused-result
# .cu is not a HIP suffix for clang: name the language for the source only
GPU_X    := -x hip
GPU_XEND := -x none
endif
BG       ?= $(B)/gpu-$(GPU)
GPU_SRC  := $(sort $(wildcard kernels/*.cu))
GPU_OBJ  := $(GPU_SRC:kernels/%.cu=$(BG)/%.o)
GPU_TEST := $(patsubst tests/gpu/%.cu,$(BG)/%,$(sort $(wildcard tests/gpu/test_*.cu)))
GPU_HDRS := $(wildcard kernels/*.h kernels/*.cuh tests/gpu/*.h) common/err.h common/mxfp4_format.h
GLIB_OBJ := $(LIB_SRC:%.c=$(BG)/obj/%.o)
GCLI_OBJ := $(CLI_SRC:%.c=$(BG)/obj/%.o)

$(BG)/%.o: kernels/%.cu $(GPU_HDRS)
	@mkdir -p $(BG)
	$(GPUCC) -I. -c $(GPU_X) $< -o $@

$(BG)/obj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(WARN) $(CFLAGS) $(CPPFLAGS) -DKL_GPU=1 -c $< -o $@

$(BG)/kl: $(GCLI_OBJ) $(GLIB_OBJ) $(GPU_OBJ)
	$(CXX) -o $@ $(GCLI_OBJ) $(GLIB_OBJ) $(GPU_OBJ) -Wl,-Bstatic -luring -laio -lcrypto -lpcre2-8 \
	  -lmicrohttpd -Wl,-Bdynamic -lcjson -lgnutls $(GPU_LIBS) -lpthread -lm -ldl -Wl,-rpath,'$$ORIGIN'
	cp -L /usr/lib/x86_64-linux-gnu/libcjson.so.1 $(BG)/

# device tests: exit 77 (skip) without a GPU; they link libkl.a for kl_err
$(BG)/test_%: tests/gpu/test_%.cu $(GPU_OBJ) $(B)/libkl.a $(GPU_HDRS) $(wildcard tests/gpu/*.h)
	$(GPUCC) $(GPU_TEST_FLAGS) -I. -o $@ $(GPU_X) $< $(GPU_XEND) $(GPU_OBJ) $(B)/libkl.a $(GPU_TEST_LIBS) -lm
# test_load runs the fill of engine/gpu_plan.c, whose reader and schema need these (linked as
# $(BG)/kl is: libcjson.so.1 beside it)
STATIC_A = $(shell $(CC) -print-file-name=$(1))
$(BG)/test_load: GPU_TEST_LIBS = $(call STATIC_A,liburing.a) $(call STATIC_A,libaio.a) \
  $(call STATIC_A,libcrypto.a) -lcjson -lpthread -ldl -Xlinker -rpath -Xlinker '$$ORIGIN'

# test_nccl: NCCL beside the CUDA runtime (found at run time on the GPU machine: see
# scripts/gpu/engine.sh); RCCL where HIP has it; else it builds as a test that skips
ifeq ($(GPU),cuda)
NCCL_LIB := $(wildcard $(CUDA_LIB)/libnccl.so)
$(BG)/test_nccl: GPU_TEST_LIBS = $(if $(NCCL_LIB),-L$(CUDA_LIB) -lnccl)
$(BG)/test_nccl: GPU_TEST_FLAGS += $(if $(NCCL_LIB),,-DKL_NO_COLLECTIVES)
else ifeq ($(GPU),hip)
RCCL_LIB := $(firstword $(wildcard /opt/rocm/lib/librccl.so /usr/lib/x86_64-linux-gnu/librccl.so))
$(BG)/test_nccl: GPU_TEST_LIBS = $(if $(RCCL_LIB),-lrccl)
$(BG)/test_nccl: GPU_TEST_FLAGS += $(if $(RCCL_LIB),,-DKL_NO_COLLECTIVES)
endif

# the kernel timeline of a CUDA program (CUDA_INJECTION64_PATH; tests/gpu/kernel_trace.c),
# CUPTI copied beside it for the GPU machine
ifeq ($(GPU),cuda)
CUDA_INC := $(dir $(realpath $(NVCC)))../include
$(BG)/libkernel_trace.so: tests/gpu/kernel_trace.c
	@mkdir -p $(BG)
	$(CC) $(CSTD) $(WARN) -O2 -fPIC -shared -I$(CUDA_INC) -o $@ $< -L$(CUDA_LIB) -lcupti \
	  -Wl,-rpath,'$$ORIGIN'
	cp -L $(CUDA_LIB)/libcupti.so.13 $(BG)/
gpu-trace: $(BG)/libkernel_trace.so
endif

.SECONDARY: $(GPU_OBJ) $(GLIB_OBJ) $(GCLI_OBJ)
gpu-kl: $(BG)/kl
gpu: $(BG)/kl $(GPU_TEST)
	@[ -n "$(GPU)" ] || { echo "make gpu: say GPU=cuda or GPU=hip"; exit 2; }

deps:
	sh scripts/install-deps.sh

clean:
	rm -rf build
