"""CI's release path for other builders: the buildx bake file (bakefile.py), verify, push by digest
and assemble the manifest (ci.py; `python -m bakery.release`), the pushed provenance and its
read-back (provenance.py), the image's SBOM (sbom.py).
"""
