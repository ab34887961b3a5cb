"""The worker put together: the environment resolved once (worker_config.py), the SDK's config
(sdk_config.py), the port claimed (ports.py), every part installed in order and run (core.py); the
worker's own lines (output.py), the serving parts, the event loop, a front process's main."""
