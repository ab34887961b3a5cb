"""What BACKEND runs: workers/<engine>/worker.py states an engine's defaults and calls app.core.run."""
