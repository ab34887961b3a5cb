"""Keeping the specs current with the engines upstream: the baked log lines against the engine's
pinned source (`python -m bakery.upkeep.drift`), the engines' release feeds (feeds.py) and the
spec edit that follows them (`python -m bakery.upkeep.bump`).
"""
