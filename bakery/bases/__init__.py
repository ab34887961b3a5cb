"""The local bases: how each base of the catalogue (bakery.spec.base_catalogue) is made on this
machine (make.py); `python -m bakery.bases` makes them from the command line.
"""
