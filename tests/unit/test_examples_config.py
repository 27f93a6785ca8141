"""The example configuration shipped in examples/ loads with the documented values."""

from __future__ import annotations

from pathlib import Path

import afterword

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_example_config_loads() -> None:
    config = afterword.load_config(
        EXAMPLES / "afterword.json", environ={"WORK_CONTROL_CONTINUATION_TOKEN": "example-token-0123456789"}
    )
    assert (config.host, config.port, config.enabled) == ("127.0.0.1", 4319, True)
    assert config.continuation_servers == ("work-control",)
    assert set(config.named_routes) == {"daily-attention", "verification", "background-index"}
    assert config.state_dir == str(EXAMPLES / ".mono-agent" / "continuations")
