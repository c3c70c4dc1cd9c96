#!/usr/bin/env bash
# First contact with an Ascend NPU machine (the twin of scripts/gpu_check.py): see scripts/npu_first_contact.py.
#   bash scripts/npu_first_contact.sh                  # on the NPU machine (sources CANN + NNAL if not loaded)
#   bash scripts/npu_first_contact.sh --dry-run        # here: against hyspec's emulated torch_npu (pinned release)
#   bash scripts/npu_first_contact.sh --dry-run 7.1.0  # against an older release's signatures and limits
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ " $* " != *" --dry-run"* ]]; then
    # torch_npu needs the toolkit's libraries; the _npu_* ATB ops need NNAL's (both as docker/Dockerfile.ascend)
    [[ -z "${ASCEND_HOME_PATH:-}" && -f /usr/local/Ascend/ascend-toolkit/set_env.sh ]] \
        && source /usr/local/Ascend/ascend-toolkit/set_env.sh
    [[ -z "${ATB_HOME_PATH:-}" && -f /usr/local/Ascend/nnal/atb/set_env.sh ]] \
        && source /usr/local/Ascend/nnal/atb/set_env.sh
fi
PYTHON="${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3 )}"
# hyspec's vllm-ascend plugin in vLLM's python (docs/vllm.md); HYSPEC_VLLM_MODEL=DIR also compares plain vs hyspec
[[ " $* " != *" --dry-run"* ]] && { "${HYSPEC_VLLM_PYTHON:-$PYTHON}" -m hyspec.vllm.ascend_check \
    ${HYSPEC_VLLM_MODEL:+--model "$HYSPEC_VLLM_MODEL"} > npu_vllm_ascend.json || echo "see npu_vllm_ascend.json" >&2; }
exec "$PYTHON" scripts/npu_first_contact.py "$@"
