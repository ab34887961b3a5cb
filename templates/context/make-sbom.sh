#!/bin/sh
# Write a CycloneDX SBOM (JSON) of what the image adds to $1/sbom.cdx.json: every distribution in the
# worker's venv ($1/venv), as cyclonedx-bom's `cyclonedx-py environment` finds it, plus the bundled
# Python ($1/python) when the image carries one. Runs after make-venv.sh, offline: the generator is
# installed from the wheelhouse (sbom-requirements.txt, --require-hashes) into a throwaway venv that
# is deleted before the stage's files reach the image. bakery.release.sbom.sbom_mismatches() checks the result.
# The worker-build stage of templates/base.Dockerfile.j2 runs it right after make-venv.sh.
set -eu
root=$1
wheels=${BAKERY_WHEELS:-/tmp/bakery/wheels}
requirements=${BAKERY_SBOM_REQUIREMENTS:-/tmp/bakery/sbom-requirements.txt}
tool=$(mktemp -d "${TMPDIR:-/tmp}/bakery-sbom-tool.XXXXXX")
trap 'rm -rf "$tool"' EXIT
"$root/venv/bin/python" -m venv --without-pip "$tool/venv"
pip_wheel=$(ls "$wheels"/pip-*.whl)
"$tool/venv/bin/python" "$pip_wheel/pip" install --quiet --no-cache-dir --disable-pip-version-check \
    --no-index --find-links "$wheels" --no-deps --require-hashes -r "$requirements"
# --output-reproducible: no timestamp or serial number, so an unchanged venv gives the same bytes
# (and the same cached layer).
"$tool/venv/bin/cyclonedx-py" environment --no-validate --output-reproducible --of JSON --sv 1.6 \
    --mc-type application -o "$root/sbom.cdx.json" "$root/venv/bin/python"
if [ -x "$root/python/bin/python3" ]; then
    # The bundled interpreter is a component too; the generator only sees distributions.
    version=$("$root/python/bin/python3" -c 'import platform; print(platform.python_version())')
    "$tool/venv/bin/python" - "$root/sbom.cdx.json" "$version" <<'PY'
import json, sys
path, version = sys.argv[1], sys.argv[2]
with open(path, encoding="utf-8") as handle:
    bom = json.load(handle)
bom.setdefault("components", []).append({
    "type": "application", "bom-ref": f"bundled-cpython@{version}", "name": "cpython", "version": version,
    "purl": f"pkg:generic/cpython@{version}", "description": "the Python bundled at /opt/bakery/python"})
with open(path, "w", encoding="utf-8") as handle:
    json.dump(bom, handle, indent=2)
PY
fi
echo "bakery: SBOM of the worker's environment in $root/sbom.cdx.json"
