"""The control-plane stand-in: the project's own emulation of the autoscaler a worker talks to.

A stand-in, like the engine stand-ins of bases/standin: it serves the public key at /pubkey/,
records every /worker_status/ and /delete_requests/ post, and signs request envelopes the way the
platform does. Stdlib plus pycryptodome (the worker venv's crypto library), so it runs inside any
bakery image with /opt/bakery/venv/bin/python. See README.md.
"""
