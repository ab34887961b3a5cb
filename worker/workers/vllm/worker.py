"""vLLM worker: vLLM's log file and log grammar over the shared OpenAI-compatible core."""

from workers.openai.core import EngineDefaults, run

DEFAULTS = EngineDefaults(
    engine="vllm",
    model_log="/var/log/portal/vllm.log",
    load_lines=("Application startup complete.",),
    error_lines=("INFO exited: vllm", "RuntimeError: Engine", "Traceback (most recent call last):"),
)

if __name__ == "__main__":
    run(DEFAULTS)
