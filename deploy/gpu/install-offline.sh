#!/usr/bin/env bash
# Install a wheelhouse built by wheelhouse.sh on a machine with no network.
#
#   deploy/gpu/install-offline.sh (--chunks DIR | --wheels DIR) (--target DIR | --venv DIR)
#
# --chunks DIR: the parts and MANIFEST that wheelhouse.sh --chunk-mib wrote; every part is checked against
#               its sha256 in MANIFEST, the joined archive against the whole's, before anything is unpacked
#               (into DIR/wheels). A missing or corrupt part stops the install and names the part.
# --wheels DIR: a directory of wheels (an unsplit wheelhouse).
# --target DIR: pip install --no-index --no-deps --target DIR; prints the PYTHONPATH and PATH to export.
# --venv DIR:   into that virtual environment instead (created with --system-site-packages if absent, so
#               the packages of PYTHON's base installation, the image's torch, stay visible; if the image's
#               torch is itself in a venv, use --target, which adds to whatever PYTHON sees).
# PYTHON (default python3) is the interpreter the packages are for.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
chunks="" wheels="" target="" venv=""

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --chunks) chunks="$2"; shift 2 ;;
        --wheels) wheels="$2"; shift 2 ;;
        --target) target="$2"; shift 2 ;;
        --venv) venv="$2"; shift 2 ;;
        -h|--help) usage ;;
        *) echo "install-offline.sh: unknown option $1" >&2; usage ;;
    esac
done
if { [ -z "$chunks" ] && [ -z "$wheels" ]; } || { [ -n "$chunks" ] && [ -n "$wheels" ]; }; then
    echo "install-offline.sh: give exactly one of --chunks DIR or --wheels DIR" >&2; exit 2
fi
if { [ -z "$target" ] && [ -z "$venv" ]; } || { [ -n "$target" ] && [ -n "$venv" ]; }; then
    echo "install-offline.sh: give exactly one of --target DIR or --venv DIR" >&2; exit 2
fi

if [ -n "$chunks" ]; then
    wheels="$chunks/wheels"
    rm -rf "$wheels"
    echo "verifying and joining the parts in $chunks" >&2
    if ! "$python" "$here/wheelhouse.py" reassemble "$chunks" "$wheels" >/dev/null; then
        echo "install-offline.sh: the wheelhouse in $chunks is incomplete or corrupt (see above); nothing installed" >&2
        exit 1
    fi
fi
shopt -s nullglob
files=("$wheels"/*.whl)
[ ${#files[@]} -gt 0 ] || { echo "install-offline.sh: no wheels in $wheels" >&2; exit 1; }

if [ -n "$venv" ]; then
    [ -x "$venv/bin/python" ] || "$python" -m venv --system-site-packages "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps "${files[@]}"
    echo "installed ${#files[@]} wheels into $venv" >&2
    echo "export PATH=\"$(cd "$venv" && pwd)/bin:\$PATH\""
else
    mkdir -p "$target"
    "$python" -m pip install -q --disable-pip-version-check --no-index --no-deps --upgrade --target "$target" "${files[@]}"
    target="$(cd "$target" && pwd)"
    echo "installed ${#files[@]} wheels into $target; export these:" >&2
    echo "export PYTHONPATH=\"$target\${PYTHONPATH:+:\$PYTHONPATH}\""
    echo "export PATH=\"$target/bin:\$PATH\""
fi
