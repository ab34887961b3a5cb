"""One engine image on this machine: built untagged (builder.py), gated (verify.py), tagged and
pushed only once verified (publish.py), and the steps strung together per plan (pipeline.py).
"""
