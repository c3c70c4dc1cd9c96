#!/usr/bin/env bash
# The benchmark (HumanEval and chat, llama.cpp in the same run) with hyspec on --quantization a8, writing here.
# PEER_PY: a python with llama-cpp-python (../shared/tools/llamacpp-venv.sh).
set -euo pipefail
OUT=docs/results/2026-12-03/cpu-vs-llamacpp-a8 SETS_ONLY=1 QUANTIZATION=a8 exec bash docs/results/2026-12-03/cpu-vs-llamacpp/run.sh
