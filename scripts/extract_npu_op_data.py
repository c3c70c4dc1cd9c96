"""Rebuild ``npu_ops/op_plugin_data/<branch>.json`` from a clone of Ascend/op-plugin.

The signatures are read from the sources, not typed in: the ``- func:``
lines of ``op_plugin/config/op_plugin_functions.yaml`` (its ``custom:``
section; ``symint:`` repeats some with SymInt types) for the aclnn ops and the
``m.def("...")`` registrations in ``op_plugin/ops/atb/*.cpp`` for the ATB ops.
The documented constraints (dtypes, head dims, block sizes, layouts) are prose
in the Chinese API docs; they are carried here as a table per branch with the
doc file each rule comes from (``CONSTRAINTS`` below), and the script checks
that every cited doc file exists at that commit.

    git clone https://github.com/Ascend/op-plugin /tmp/op-plugin   # or any mirror holding its branches
    python scripts/extract_npu_op_data.py --repo /tmp/op-plugin --branch 7.1.0 \
        --branch 26.1.0=8b9c8534fa41eff367a41c155843daa530ab3a08   # what torch-npu 2.10.0.post4 ships

Each file records the branch, the commit and the source paths, so the data can
be checked against the sources it came from.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parents[1] / "npu_ops" / "op_plugin_data"
YAML = "op_plugin/config/op_plugin_functions.yaml"
ATB_DIR = "op_plugin/ops/atb"

#: every torch_npu function hyspec calls or may fall back to
FUNCTIONS = (
    "npu_fused_infer_attention_score", "npu_fused_infer_attention_score.out",
    "_npu_fused_infer_attention_score_get_max_workspace",
    "npu_fused_infer_attention_score_v2",
    "npu_scatter_pa_kv_cache", "npu_rms_norm", "npu_add_rms_norm", "npu_apply_rotary_pos_emb", "npu_rotary_mul",
    "_npu_paged_attention", "_npu_paged_attention_get_workspace", "_npu_reshape_and_cache", "_npu_rotary_embedding",
)
ATB_FUNCTIONS = ("_npu_paged_attention", "_npu_paged_attention_get_workspace", "_npu_reshape_and_cache",
                 "_npu_rotary_embedding")

#: which torch-npu / torch / CANN releases ship each branch (Ascend/pytorch COMPATIBILITY.en.md @ 9e73e708)
RELEASES = {
    "7.1.0": {"torch_npu": ["2.5.1.post1", "2.6.0", "2.1.0.post13"], "torch": ["2.5.1", "2.6.0", "2.1.0"],
              "cann": "8.2.RC1"},
    "26.1.0": {"torch_npu": ["2.10.0.post4", "2.9.0.post6", "2.7.1.post8"], "torch": ["2.10.0", "2.9.0", "2.7.1"],
               "cann": "9.1.0"},
}

_D71, _D26 = "docs/context/", "docs/zh/custom_APIs/torch_npu/"
_ATB_LIMITS = {"external": "CANN ascendtb API reference, PagedAttentionOperation (ascendtb_01_0070); the ATB ops "
                           "have no op-plugin doc page",
               "block_size_multiple": 16, "max_head_dim": 256, "max_head_dim_x_block": 16384}
#: PageAttention with input_layout BSND, the same text in both branches: "block_size最小为128，最大为512，且要求是128的
#: 倍数" when Q_S > 1; "16对齐" (fp16/bf16) when Q_S == 1; KV cache only (blocknum, blocksize, H); D 16-aligned <= 512.
_BSND = {"head_dims": None, "head_dim_multiple": 16, "max_head_dim": 512, "dtypes": ["float16", "bfloat16"],
         "multi_query_block_size_multiple": 128, "block_size_range": [16, 512], "block_size_multiple": 16}

#: Documented constraints per branch; "doc" is an op-plugin file at the branch's commit (checked to exist),
#: "external" names a source outside op-plugin.  "documented": False marks a function the branch defines but
#: whose doc page does not exist there (hyspec does not call it).
CONSTRAINTS: dict[str, dict] = {
    "7.1.0": {
        "npu_fused_infer_attention_score": {
            "doc": _D71 + "torch_npu-npu_fused_infer_attention_score.md",
            # TND without MLA: "Q_D、K_D=192", "数据类型仅支持BFLOAT16", "不支持...page attention": no TND here
            "paged_layouts": {"BSND": _BSND},
        },
        "npu_rotary_mul": {"doc": _D71 + "torch_npu-npu_rotary_mul.md", "rotary_modes": ["half", "interleave"],
                           "layouts": ["BNSD", "BSND", "SBND"], "head_dim_multiple": 2, "max_head_dim": 894,
                           "dtypes": ["float16", "bfloat16", "float32"]},
        "npu_rms_norm": {"doc": _D71 + "（beta）torch_npu-npu_rms_norm.md", "dtypes": ["float16", "bfloat16", "float32"]},
        "npu_apply_rotary_pos_emb": {"documented": False, "note": "no doc page in 7.1.0; `layout` is ignored by "
                                     "ApplyRotaryPosEmbNpuOpApi.cpp and there is no rotary_mode"},
        "npu_add_rms_norm": {"documented": False, "note": "no doc page in 7.1.0"},
        "_npu_paged_attention": _ATB_LIMITS,
    },
    "26.1.0": {
        "npu_fused_infer_attention_score": {
            "doc": _D26 + "torch_npu-npu_fused_infer_attention_score.md",
            # TND without rope: "Q_D、K_D、V_D都等于128" (or Q/K 192): D = 64 is not documented for TND
            "paged_layouts": {"TND": dict(_BSND, head_dims=[128]), "BSND": _BSND},
        },
        "npu_apply_rotary_pos_emb": {"doc": _D26 + "torch_npu-apply_rotary_pos_emb.md", "layouts": ["BSND", "TND"],
                                     "rotary_modes": ["half"], "head_dims": [64, 128],
                                     "dtypes": ["float16", "bfloat16", "float32"]},
        "npu_rotary_mul": {"doc": _D26 + "torch_npu-npu_rotary_mul.md", "rotary_modes": ["half", "interleave"],
                           "layouts": ["BNSD", "BSND", "SBND", "TND"], "head_dim_multiple": 2, "max_head_dim": 894,
                           "dtypes": ["float16", "bfloat16", "float32"]},
        "npu_scatter_pa_kv_cache": {"doc": _D26 + "torch_npu-npu_scatter_pa_kv_cache.md",
                                    "cache_modes": ["PA_NZ", "Norm", None]},
        "npu_rms_norm": {"doc": _D26 + "（beta）torch_npu-npu_rms_norm.md", "dtypes": ["float16", "bfloat16", "float32"]},
        "npu_add_rms_norm": {"doc": _D26 + "torch_npu-npu_add_rms_norm.md", "dtypes": ["float16", "bfloat16", "float32"]},
        "_npu_paged_attention": _ATB_LIMITS,
    },
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def schemas_from_yaml(text: str) -> dict[str, str]:
    """name -> schema of the ``custom:`` section (the first definition of each name)."""
    found: dict[str, str] = {}
    for match in re.finditer(r"^\s*- func: (([\w.]+)\(.*\) -> .*)$", text, re.MULTILINE):
        schema, name = match.group(1).strip(), match.group(2)
        found.setdefault(name, schema)
    return found


def schemas_from_atb(repo: Path, branch: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in git(repo, "ls-tree", "-r", "--name-only", branch, ATB_DIR).split():
        if not path.endswith(".cpp"):
            continue
        for match in re.finditer(r'm\.def\("((\w+)\(.*?\) -> [^"]*)"\)', git(repo, "show", f"{branch}:{path}")):
            found.setdefault(match.group(2), re.sub(r",\s*\*\s*,?", ", *, ", match.group(1)).replace(", *, ,", ", *,"))
    return found


def extract(repo: Path, branch: str, ref: str) -> dict:
    commit = git(repo, "rev-parse", ref).strip()
    yaml_schemas = schemas_from_yaml(git(repo, "show", f"{commit}:{YAML}"))
    atb_schemas = schemas_from_atb(repo, commit)
    functions = {}
    for name in FUNCTIONS:
        schema = atb_schemas.get(name) if name in ATB_FUNCTIONS else yaml_schemas.get(name)
        if schema is not None:
            functions[name] = schema
    constraints = CONSTRAINTS.get(branch, {})
    files = set(git(repo, "-c", "core.quotepath=off", "ls-tree", "-r", "--name-only", commit, "docs").splitlines())
    for op, rules in constraints.items():
        if "doc" in rules and rules["doc"] not in files:
            raise SystemExit(f"{branch}: the doc cited for {op} ({rules['doc']}) is not at {commit[:10]}")
    return {"op_plugin_branch": branch, "commit": commit, "repository": "https://github.com/Ascend/op-plugin",
            "sources": {"aclnn_schemas": f"{YAML} (custom: section)", "atb_schemas": f"{ATB_DIR}/*.cpp m.def(...)"},
            **RELEASES.get(branch, {}), "functions": functions, "constraints": constraints}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True, help="a git clone of Ascend/op-plugin with its branches")
    parser.add_argument("--branch", action="append", required=True,
                        help="an op-plugin branch, or BRANCH=COMMIT for the commit a torch-npu release ships")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in args.branch:
        branch, _, ref = spec.partition("=")
        data = extract(args.repo, branch, ref or branch)
        path = args.out / f"{branch}.json"
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        print(f"{path}: {len(data['functions'])} functions, commit {data['commit'][:10]}")


if __name__ == "__main__":
    main()
