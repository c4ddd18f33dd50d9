#!/usr/bin/env bash
# Build llama.cpp's llama-batched-bench and llama-quantize from source and convert HF checkpoints to GGUF (f32, then
# the quantized types of $TYPES), for the llama.cpp baselines of bench/. Everything goes under .cache/llamacpp/
# (git-ignored).
#
#   tools/build_llamacpp.sh [MODEL_DIR ...]        # e.g. models/demo-target .cache/models/random-82m
#
# Steps (each skipped when its output exists, so re-running is cheap):
#   1. download the llama-cpp-python sdist (it vendors the llama.cpp sources) with pip;
#   2. unpack it;
#   3. configure (Release, no CUDA/Metal/curl/OpenSSL, no tests/examples/server). CPU=noamx (the default):
#      -DGGML_NATIVE=OFF with each of AVX2, FMA, F16C, BMI2, AVX-VNNI and AVX-512 (F, VBMI, VNNI, BF16) on when
#      /proc/cpuinfo lists it, and AMX off, because on CPUs that advertise AMX the quantized AMX kernels of the
#      vendored ggml die with "Illegal instruction"; CPU=native: -DGGML_NATIVE=ON. Each mode and set of
#      extensions has its own build directory;
#   4. build the llama-batched-bench and llama-quantize targets, with at most $JOBS (default 2) jobs;
#   5. make a converter venv at .cache/llamacpp/venv (gguf from the vendored gguf-py with the numpy it requires,
#      sentencepiece) that sees torch/transformers of the project venv through a .pth file appended at the end of
#      sys.path, so the venv's own numpy wins (nothing is installed into the project venv);
#   6. make a scratch copy of convert_hf_to_gguf.py and its conversion/ package in which an unrecognised BPE
#      pre-tokenizer hash (ours) falls back to "gpt-2" instead of raising (decode speed does not depend on it);
#   7. convert each MODEL_DIR to .cache/llamacpp/gguf/<name>-f32.gguf, then quantize it to <name>-<type>.gguf for
#      each type of $TYPES with llama-quantize.
# Steps 5-7 run only when MODEL_DIRs are given.
#
# Environment: LLAMACPP_DIR (default <repo>/.cache/llamacpp), LLAMACPP_VERSION (pin the sdist version, default the
# newest), JOBS (default 2), PY (project python, default <repo>/.venv/bin/python, else python3 on PATH), CPU
# (noamx or native, default noamx), TYPES (llama-quantize types, default "q8_0 q4_0"; empty for f32 only).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
DIR=${LLAMACPP_DIR:-$REPO/.cache/llamacpp}
JOBS=${JOBS:-2}
CPU=${CPU:-noamx}
TYPES=${TYPES-q8_0 q4_0}
# The x86 extensions this CPU has (from /proc/cpuinfo), each turned on only when present: a build for
# another CPU's extensions dies with "Illegal instruction" here.
has() { grep -qw "$1" /proc/cpuinfo 2>/dev/null; }
onoff() { if has "$1"; then echo ON; else echo OFF; fi; }
case $CPU in
    noamx) cpu_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=$(onoff avx) -DGGML_AVX2=$(onoff avx2) -DGGML_FMA=$(onoff fma)
                      -DGGML_F16C=$(onoff f16c) -DGGML_BMI2=$(onoff bmi2) -DGGML_AVX_VNNI=$(onoff avx_vnni)
                      -DGGML_AVX512=$(onoff avx512f) -DGGML_AVX512_VBMI=$(onoff avx512vbmi)
                      -DGGML_AVX512_VNNI=$(onoff avx512_vnni) -DGGML_AVX512_BF16=$(onoff avx512_bf16)
                      -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF) ;;
    native) cpu_flags=(-DGGML_NATIVE=ON) ;;
    *) echo "CPU must be noamx or native, got '$CPU'" >&2; exit 1 ;;
esac
if [[ -z "${PY:-}" ]]; then
    PY=$REPO/.venv/bin/python
    [[ -x $PY ]] || PY=$(command -v python3) || { echo "no python3 on PATH: set PY" >&2; exit 1; }
fi
mkdir -p "$DIR/sdist" "$DIR/gguf"
say() { echo "[build_llamacpp] $*"; }

# 1. sdist
sdist=$(ls "$DIR"/sdist/llama_cpp_python-*.tar.gz 2>/dev/null | sort -V | tail -1 || true)
if [[ -n "${LLAMACPP_VERSION:-}" ]]; then
    sdist=$(ls "$DIR"/sdist/llama_cpp_python-"$LLAMACPP_VERSION".tar.gz 2>/dev/null || true)
fi
if [[ -z "$sdist" ]]; then
    spec=llama-cpp-python${LLAMACPP_VERSION:+==$LLAMACPP_VERSION}
    say "downloading the $spec sdist into $DIR/sdist"
    "$PY" -m pip download --no-deps --no-binary :all: "$spec" -d "$DIR/sdist"
    sdist=$(ls "$DIR"/sdist/llama_cpp_python-*.tar.gz | sort -V | tail -1)
else
    say "sdist present: $sdist"
fi
name=$(basename "$sdist" .tar.gz)

# 2. unpack
SRC=$DIR/$name/vendor/llama.cpp
if [[ ! -f $SRC/CMakeLists.txt ]]; then
    say "unpacking $sdist"
    tar -xzf "$sdist" -C "$DIR"
else
    say "sources present: $SRC"
fi

# 3. configure
# one build directory per mode and set of extensions (a cache carried to another CPU builds anew)
BUILD=$DIR/build-$name-$CPU-$(printf '%s\n' "${cpu_flags[@]}" | sha256sum | cut -c1-8)
if [[ ! -f $BUILD/build.ninja ]]; then
    say "configuring $BUILD ($CPU)"
    cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cpu_flags[@]}" -DGGML_CUDA=OFF \
        -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF
else
    say "configured: $BUILD"
fi

# 4. build (ninja is a no-op when up to date)
BIN=$BUILD/bin/llama-batched-bench
QUANTIZE=$BUILD/bin/llama-quantize
if [[ ! -x $BIN || ! -x $QUANTIZE ]]; then
    say "building llama-batched-bench and llama-quantize with $JOBS jobs (about 15 minutes on 2 cores)"
    cmake --build "$BUILD" --target llama-batched-bench llama-quantize -j "$JOBS"
else
    say "binaries present: $BIN $QUANTIZE"
fi
ln -sfn "$BIN" "$DIR/llama-batched-bench"
ln -sfn "$QUANTIZE" "$DIR/llama-quantize"
if [[ $# -eq 0 ]]; then
    say "done: binaries $DIR/llama-batched-bench $DIR/llama-quantize (no MODEL_DIR to convert)"
    exit 0
fi

# 5. converter venv
VENV=$DIR/venv
if [[ ! -f $VENV/.ready ]]; then
    say "creating the converter venv $VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet "$SRC/gguf-py" sentencepiece   # gguf brings its numpy (>= 2.2.6)
    project_site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    venv_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    # .pth lines are appended to sys.path, so the venv's own gguf/numpy win over the project's.
    echo "$project_site" > "$venv_site/zz_project_torch.pth"
    "$VENV/bin/python" -c 'import gguf, numpy, torch, transformers, sentencepiece'
    touch "$VENV/.ready"
else
    say "converter venv present: $VENV"
fi

# 6. scratch copy of the converter with the unknown-hash fallback
CONV=$DIR/convert-$name
if [[ ! -f $CONV/.patched ]]; then
    say "patching a scratch copy of convert_hf_to_gguf.py into $CONV"
    rm -rf "$CONV"
    mkdir -p "$CONV"
    cp "$SRC/convert_hf_to_gguf.py" "$CONV/"
    [[ -d $SRC/conversion ]] && cp -r "$SRC/conversion" "$CONV/"
    "$VENV/bin/python" - "$CONV" <<'EOF'
import pathlib, sys
conv = pathlib.Path(sys.argv[1])
needle = 'raise NotImplementedError("BPE pre-tokenizer was not recognized - update get_vocab_base_pre()")'
fallback = 'res = "gpt-2"  # scratch-copy patch: unknown pre-tokenizer hash falls back to gpt-2'
hits = [p for p in conv.rglob("*.py") if needle in p.read_text()]
if len(hits) != 1:
    sys.exit(f"expected the unknown-hash raise in exactly one file, found {len(hits)}: update this patch")
hits[0].write_text(hits[0].read_text().replace(needle, fallback))
print(f"[build_llamacpp] patched {hits[0]}")
EOF
    touch "$CONV/.patched"
else
    say "patched converter present: $CONV"
fi

# 7. conversions
for model in "$@"; do
    model=$(cd "$model" && pwd)
    out=$DIR/gguf/$(basename "$model")-f32.gguf
    if [[ ! -f $out ]]; then
        say "converting $model -> $out"
        "$VENV/bin/python" "$CONV/convert_hf_to_gguf.py" "$model" --outtype f32 --outfile "$out.part"
        mv "$out.part" "$out"
    fi
    for type in $TYPES; do
        qout=$DIR/gguf/$(basename "$model")-$type.gguf
        [[ -f $qout ]] && { say "GGUF present: $qout"; continue; }
        say "quantizing $out -> $qout"
        "$QUANTIZE" "$out" "$qout.part" "$(echo "$type" | tr a-z A-Z)"
        mv "$qout.part" "$qout"
    done
done
say "done: binary $DIR/llama-batched-bench, GGUF files in $DIR/gguf"
