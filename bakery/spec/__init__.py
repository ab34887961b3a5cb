"""What an engine image is and what a value may be: the validated specs (images/<engine>.yaml),
every engine fact derived from them, the local-base catalogue, and the value rules (Dockerfile
tokens, image references, credentials). Pure: no Docker, no network, no git.
"""
