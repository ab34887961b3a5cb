"""SGLang worker: SGLang's log file and log grammar over the shared OpenAI-compatible core."""

from app.core import run
from app.worker_config import EngineDefaults

DEFAULTS = EngineDefaults(
    engine="sglang",
    model_log="/var/log/portal/sglang.log",
    load_lines=("The server is fired up and ready to roll!",),
    ready_connections=256,  # the first burst's engine connections, opened at load (engine_warm.py)
    front_processes=None,  # a front process when there are 2 CPUs or more: bursts of hundreds (fronts.py)
    error_lines=("INFO exited: sglang", "Traceback (most recent call last):"),
)

if __name__ == "__main__":
    run(DEFAULTS)
