#!/usr/bin/env bash
# Build the offline wheelhouse for a GPU image: exactly the wheels that image lacks to run durable-grpo's
# inference worker (vLLM), trainer and embedded stack, for the image's Python and platform.
#
#   deploy/gpu/wheelhouse.sh --image-freeze IMAGE.freeze [--python-version 3.12]
#       [--platform manylinux_2_35_x86_64] [--vllm 0.26.0] [--out deploy/gpu/wheelhouse] [--chunk-mib 60]
#
# IMAGE.freeze is the image's `python -m pip list --format=freeze` (bare names are allowed for packages known
# to be there at an unknown version). Its versions are constraints: a carried package that needs another
# torch or transformers than the image's fails resolution here, not on the GPU. --platform is the image's
# glibc as a manylinux tag (`python -c 'import platform; print(platform.libc_ver())'` there; 2.35 is Ubuntu
# 22.04); wheels for older manylinux tags are accepted too. vLLM 0.26.0: see deploy/gpu/README.md.
#
# What it does (needs PyPI; the GPU machine needs nothing):
#  1. downloads vllm==VERSION and nodeps.txt's packages alone (--no-deps);
#  2. takes the vLLM dependencies vllm-deps.txt carries, with the wheel's own version specifiers, plus
#     requirements-project.txt, and resolves them for the target (pip --dry-run --report);
#  3. downloads (--no-deps, --only-binary=:all:) every resolved package the image does not have;
#  4. with --chunk-mib N: tars the wheels and splits the tar into parts of at most N MiB, with a MANIFEST
#     of sha256 sums (each part and the whole), for a link that carries at most N MiB at a time.
#
# Output: OUT/wheels/*.whl and OUT/wheels.txt (name, MiB); OUT/chunks/ with --chunk-mib. OUT is git-ignored.
# Install on the GPU machine with deploy/gpu/install-offline.sh.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
freeze="" pyver="3.12" platform="manylinux_2_35_x86_64" vllm="0.26.0" out="$here/wheelhouse" chunk_mib=""

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --image-freeze) freeze="$2"; shift 2 ;;
        --python-version) pyver="$2"; shift 2 ;;
        --platform) platform="$2"; shift 2 ;;
        --vllm) vllm="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --chunk-mib) chunk_mib="$2"; shift 2 ;;
        -h|--help) usage ;;
        *) echo "wheelhouse.sh: unknown option $1" >&2; usage ;;
    esac
done
[ -n "$freeze" ] || { echo "wheelhouse.sh: --image-freeze is required (the image's pip list --format=freeze)" >&2; exit 2; }
[ -f "$freeze" ] || { echo "wheelhouse.sh: $freeze: no such file" >&2; exit 2; }
if [ -n "$chunk_mib" ] && ! [ "$chunk_mib" -ge 1 ] 2>/dev/null; then
    echo "wheelhouse.sh: --chunk-mib wants a whole number of MiB >= 1, got $chunk_mib" >&2; exit 2
fi

pip=("$python" -m pip --disable-pip-version-check)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
read -r -a platforms <<<"$("$python" "$here/wheelhouse.py" platforms "$platform")"
target=(--only-binary=:all: --python-version "$pyver" --implementation cp "${platforms[@]}")
rm -rf "$out/wheels" "$out/chunks"
mkdir -p "$out/wheels"

echo "1/4 vllm==$vllm and nodeps.txt, without their dependencies" >&2
"${pip[@]}" download -q "${target[@]}" --no-deps -d "$out/wheels" "vllm==$vllm" -r "$here/nodeps.txt"
vllm_wheel="$(ls "$out/wheels"/vllm-"$vllm"-*.whl)"

echo "2/4 resolving vLLM's carried dependencies and the project's for Python $pyver on $platform" >&2
"$python" "$here/wheelhouse.py" requirements "$vllm_wheel" --image-freeze "$freeze" >"$work/vllm-deps.txt"
"$python" "$here/wheelhouse.py" constraints "$freeze" >"$work/constraints.txt"
# An empty environment holding the image's packages as bare dist-infos: pip takes them as installed, so
# it resolves only what is missing and never re-resolves the image's torch and its CUDA wheels.
"$python" -m venv --without-pip "$work/image"
"$python" "$here/wheelhouse.py" fake-site "$freeze" "$(echo "$work"/image/lib/python3*/site-packages)"
"${pip[@]}" --python "$work/image/bin/python" install -q --dry-run --report "$work/report.json" \
    "${target[@]}" -r "$work/vllm-deps.txt" -r "$here/requirements-project.txt" -c "$work/constraints.txt"
"$python" "$here/wheelhouse.py" missing "$work/report.json" "$freeze" >"$work/missing.txt"

echo "3/4 downloading the $(wc -l <"$work/missing.txt") resolved packages the image lacks" >&2
if [ -s "$work/missing.txt" ]; then
    "${pip[@]}" download -q "${target[@]}" --no-deps -d "$out/wheels" -r "$work/missing.txt"
fi
(cd "$out/wheels" && stat -c '%n %s' -- *.whl | awk '{printf "%s %.1f\n", $1, $2 / 1048576}') >"$out/wheels.txt"
total_mib="$(du -cm "$out/wheels"/*.whl | tail -1 | cut -f1)"
echo "wheelhouse: $(ls "$out/wheels"/*.whl | wc -l) wheels, $total_mib MiB in $out/wheels (list: $out/wheels.txt)" >&2

if [ -n "$chunk_mib" ]; then
    echo "4/4 splitting into parts of at most $chunk_mib MiB" >&2
    "$python" "$here/wheelhouse.py" chunk "$out/wheels" "$out/chunks" "$chunk_mib" >/dev/null
    echo "chunks: $(ls "$out/chunks" | grep -c part-) parts and MANIFEST in $out/chunks" >&2
else
    echo "4/4 no --chunk-mib: not split" >&2
fi
