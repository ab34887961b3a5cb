"""The control plane: the vastai SDK behind one adapter (sdk_seam.py), and what the worker tells the
autoscaler (status reports, queue estimate, readiness)."""
