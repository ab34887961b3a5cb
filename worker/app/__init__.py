"""The worker put together: settings resolved and every part installed in order (core.py), the
serving parts (serving.py), the event loop, and a front process's own main (front_process.py)."""
