# Shell helpers sourced by scripts/bundle-check and scripts/sandbox-check.
# shellcheck shell=bash
CHECKS=0
ok() { CHECKS=$((CHECKS + 1)); printf 'ok   %s\n' "$*"; }
die() { printf 'FAIL %s\n' "$*" >&2; exit 1; }
# field JSON NAME: one field of a JSON object ("" when null or absent).
field() {
    python3 -c 'import json, sys
v = json.loads(sys.argv[1]).get(sys.argv[2])
print("" if v is None else (v if isinstance(v, str) else json.dumps(v)))' "$1" "$2"
}
# uv_from_pypi VENV PYTHON: prints the path of a uv binary, from the `uv`
# module PYTHON already has, else installed from PyPI into VENV (made once).
uv_from_pypi() {
    local venv=$1 py=$2
    if "$py" -c 'import uv' 2>/dev/null; then
        "$py" -c 'import uv; print(uv.find_uv_bin())'
        return
    fi
    if ! "$venv/bin/python3" -c 'import uv' 2>/dev/null; then
        rm -rf "$venv"
        "$py" -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check uv >&2
    fi
    "$venv/bin/python3" -c 'import uv; print(uv.find_uv_bin())'
}
