"""The image's Docker HEALTHCHECK: exit 0 when what the container runs is ready, 1 when it is not.

With SERVERLESS=true it reads the worker's ready mark (control/ready_mark.py): port 3000 answers only what the
platform signed. Otherwise it asks the engine's health endpoint. Standard library only and no import of the
worker's serving code: it runs every interval, so it must start fast. See docs/image.md, "Health check".
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urljoin, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the worker's stdlib-only config table
from config import table

TIMEOUT = 4.0  # seconds for the engine's answer: below the HEALTHCHECK's own --timeout
MARK = "worker-ready"  # control/ready_mark.MARK


def _setting(name: str) -> str:
    """A variable's text as the worker reads it (stripped, blank is unset), else its row's default."""
    return table.text(table.snapshot(), name) or table.BY_NAME[name].default


def engine_health_url() -> str:
    """The URL the worker's own health check asks (a path resolves against MODEL_SERVER_URL)."""
    endpoint = _setting("MODEL_HEALTH_ENDPOINT")
    if urlsplit(endpoint).scheme in ("http", "https"):
        return endpoint
    server = _setting("MODEL_SERVER_URL").rstrip("/")
    return urljoin(server + "/", endpoint)


def check_worker() -> tuple[bool, str]:
    """(ready, why) from the worker's ready mark."""
    mark = Path(_setting("BAKERY_RUN_DIR")) / MARK
    if mark.is_file():
        return True, "the worker is ready (model loaded, not errored)"
    return False, f"the worker is not ready ({mark} is absent: loading, or errored)"


def check_engine() -> tuple[bool, str]:
    """(ready, why) from one GET of the engine's health endpoint."""
    url = engine_health_url()
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:  # noqa: S310 (the engine's own URL)
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        return False, f"the engine does not answer at {url} ({type(exc).__name__})"
    if status == 200:
        return True, f"the engine answers 200 at {url}"
    return False, f"the engine answers {status} at {url}"


def main() -> int:
    """Check, print the one line, and return Docker's health code (0 healthy, 1 unhealthy)."""
    serverless = table.read(table.snapshot(), "SERVERLESS", errors=[])  # the entry point refused a bad one
    try:
        ready, why = check_worker() if serverless else check_engine()
    except Exception as exc:  # noqa: BLE001 - a health check answers, it never dies with a traceback
        ready, why = False, f"the check itself failed ({type(exc).__name__}: {exc})"
    sys.stdout.write(f"bakery health: {'healthy' if ready else 'unhealthy'}: {why}\n")
    sys.stdout.flush()
    return 0 if ready else 1


if __name__ == "__main__":
    sys.exit(main())
