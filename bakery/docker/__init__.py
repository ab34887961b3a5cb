"""The Docker layer: the only code that talks to Docker. The client and image lookups (engine.py),
one build and its output stream (build.py), the push loop (push.py), the docker CLI where the SDK
has nothing (cli.py). Modules here import the Docker SDK absolutely (`import docker`), which is
the SDK, never this package.
"""
