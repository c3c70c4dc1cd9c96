#!/usr/bin/env bash
# The Sapphire Rapids run's benchmark (HumanEval and chat, llama.cpp in the same run), writing here.
# PEER_PY: a python with llama-cpp-python (../shared/tools/llamacpp-venv.sh).
set -euo pipefail
OUT=docs/results/2026-12-03/cpu-vs-llamacpp-zen4 SETS_ONLY=1 exec bash docs/results/2026-12-03/cpu-vs-llamacpp/run.sh
