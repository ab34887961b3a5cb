"""llama.cpp: the shared worker as it is (a few streams at once). Its log file and log grammar are
images/llama.yaml's, baked into the image (MODEL_LOG, MODEL_LOAD_LOG_MSG, MODEL_ERROR_LOG_MSGS)."""

from app.core import run
from app.worker_config import EngineDefaults

DEFAULTS = EngineDefaults(engine="llama")

if __name__ == "__main__":
    run(DEFAULTS)
