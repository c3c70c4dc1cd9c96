"""The JSON Schema of speculative_config is generated from its pydantic models; the committed copy is that output."""
from __future__ import annotations

import json
from pathlib import Path

from hyspec.spec.config import SpeculativeConfig

SCHEMA = Path(__file__).resolve().parents[1] / "docs" / "speculative_config.schema.json"


def test_committed_schema_is_the_generated_one():
    generated = json.dumps(SpeculativeConfig.json_schema(), indent=2, sort_keys=True) + "\n"
    assert SCHEMA.read_text() == generated, (
        "regenerate docs/speculative_config.schema.json from SpeculativeConfig.json_schema() "
        "(json.dumps(..., indent=2, sort_keys=True) plus a newline)")


def test_schema_states_the_keys_bounds_and_choices():
    schema = SpeculativeConfig.json_schema()
    assert schema["additionalProperties"] is False  # unknown keys are refused
    top = schema["properties"]
    assert (top["num_speculative_tokens"]["anyOf"][0]["minimum"], top["num_speculative_tokens"]["anyOf"][0]["maximum"]) == (1, 64)
    assert top["draft_placement"]["enum"] == ["local", "remote"]
    assert top["num_speculative_tokens"]["description"].startswith("Draft tokens per step")
    controller = schema["$defs"]["ControllerConfig"]["properties"]
    assert controller["ewma_alpha"]["exclusiveMinimum"] == 0.0 and controller["ewma_alpha"]["maximum"] == 1.0


def test_a_config_the_schema_describes_round_trips():
    cfg = SpeculativeConfig.from_dict({"method": "eagle", "tree": {"budget": 16}})
    assert set(cfg.to_dict()) == set(SpeculativeConfig.json_schema()["properties"])
