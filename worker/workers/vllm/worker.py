"""vLLM: the shared worker tuned for bursts of hundreds of streams. Its log file and log grammar are
images/vllm.yaml's, baked into the image (MODEL_LOG, MODEL_LOAD_LOG_MSG, MODEL_ERROR_LOG_MSGS)."""

from app.core import run
from app.worker_config import EngineDefaults

DEFAULTS = EngineDefaults(
    engine="vllm",
    ready_connections=256,  # the first burst's engine connections, opened at load (engine_warm.py)
    front_processes=None,  # a front process when there are 2 CPUs or more: bursts of hundreds (processes.py)
)

if __name__ == "__main__":
    run(DEFAULTS)
