"""Port 3000's connections: the wire front that reads plain signed requests below aiohttp.web
(wire.py) and the front processes that run it on more cores (processes.py)."""
