"""The engine side of a request: bakery's own engine client (forward.py), its connections
(engine_warm, engine_close) and the streamed body's relay in C (native_relay.py)."""
