"""llama.cpp worker: llama-server's log file and log grammar over the shared OpenAI-compatible core."""

from app.core import run
from app.worker_config import EngineDefaults

DEFAULTS = EngineDefaults(
    engine="llama",
    model_log="/var/log/portal/llama.log",
    load_lines=("model loaded",),
    error_lines=("INFO exited: llama", "error loading model", "failed to load model"),
)

if __name__ == "__main__":
    run(DEFAULTS)
