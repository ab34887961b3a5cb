"""The worker's configuration: the table of every variable it reads (table.py), port 3000's request path
declared (request_path.py), the routes it can serve (routes.py) and what a request weighs (workload.py,
uploads.py). Standard library only."""
