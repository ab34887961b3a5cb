"""`zeta`, the engine tests add as one YAML file: the vLLM stand-in's command and log grammar under a
name of its own, its own model variable, no worker adapter (the generic worker serves it) and no
template of its own (the skeleton renders it as it is)."""

from __future__ import annotations

from typing import Any

STANDIN_MODEL = "standin/tiny-chat"  # the model the vLLM stand-in base serves


def zeta_spec(description: str, base: dict[str, Any]) -> dict[str, Any]:
    """zeta's spec (images/zeta.yaml as data) with `description` and the `base:` mapping given."""
    return {
        "name": "zeta",
        "description": description,
        "version": "2.0.0",
        "source": "https://github.com/example/zeta",
        "base": {"image": "example/zeta:2.0.0", **base},
        "template": "base.Dockerfile.j2",
        "engine": {"command": ["vllm", "serve", "${ZETA_MODEL}", "--host", "127.0.0.1", "--port", "18000"],
                   "model_var": "ZETA_MODEL", "args_var": "ZETA_ARGS"},
        "bake": {"env": {"BACKEND": "zeta", "MODEL_LOG": "/var/log/portal/zeta.log",
                         "MODEL_LOAD_LOG_MSG": ["Application startup complete."],
                         "MODEL_ERROR_LOG_MSGS": ["INFO exited: zeta", "EngineCore failed to start."],
                         "MODEL_INFO_LOG_MSGS": ['"message":"Download'], "MODEL_HEALTH_ENDPOINT": "/health"},
                 "expose": [3000]},
    }
