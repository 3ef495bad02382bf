#!/usr/bin/env bash
# Packs a built `mneme` binary into a wheel, so `pip install` puts it on a
# virtual environment's PATH (the way ruff and uv ship theirs):
#
#   scripts/wheel.sh                      # target/debug/mneme, as `cargo build` left it
#   scripts/wheel.sh path/to/mneme        # another build (or MNEME_BIN=path)
#   scripts/wheel.sh --release            # cargo build --release -p mneme, then that
#   scripts/wheel.sh --out DIR ...        # into DIR, not target/wheels
#   pip install target/wheels/mneme-*.whl
#
# It builds nothing itself (but with --release): CI packs the binary its test
# build made, so the wheel costs no second build. maturin's `bindings =
# "bin"` makes the same layout but always runs cargo itself, with its own
# features, which would rebuild the workspace; so this writes the wheel
# directly: a zip holding mneme-VERSION.data/scripts/mneme and
# mneme-VERSION.dist-info/{METADATA,WHEEL,RECORD} (each file's SHA-256 in
# RECORD), as PEP 427 says.
#
# The platform tag is read off the binary: manylinux_2_X_ARCH where X is the
# newest glibc symbol version it needs (at least 2.17, manylinux2014's) and
# it links nothing but glibc's own libraries and libgcc_s; otherwise
# linux_ARCH, which promises nothing about the system (PyPI refuses it). The
# version is the workspace's (Cargo.toml). The wheel's path is the last line
# of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${MNEME_BIN:-target/debug/mneme}
out=target/wheels
while [ $# -gt 0 ]; do
    case "$1" in
    --release)
        cargo build --release -p mneme >&2
        bin=target/release/mneme
        ;;
    --out)
        out=$2
        shift
        ;;
    -h | --help)
        sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) bin=$1 ;;
    esac
    shift
done

[ -x "$bin" ] || {
    echo "wheel: no executable $bin (build it first: cargo build -p mneme, or pass --release)" >&2
    exit 1
}
command -v python3 >/dev/null 2>&1 || {
    echo "wheel: python3 is needed to write the wheel (apt-get install python3)" >&2
    exit 1
}

version=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
[ -n "$version" ] || {
    echo "wheel: no version under [workspace.package] in Cargo.toml" >&2
    exit 1
}

arch=$(uname -m)
tag="linux_$arch"
why="objdump (binutils) not found"
if command -v objdump >/dev/null 2>&1; then
    # Libraries a manylinux wheel may link (PEP 600 leaves glibc's own and
    # libgcc_s to the system); anything else ties it to this machine.
    allowed='^(libc|libm|libpthread|libdl|librt|libutil|libgcc_s|ld-linux.*|ld64)\.so'
    others=$(objdump -p "$bin" | awk '/NEEDED/ { print $2 }' | grep -Ev "$allowed" || true)
    glibc=$(objdump -T "$bin" | grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2,2n -u | tail -n 1 | cut -d. -f2)
    if [ -n "$others" ]; then
        why="it links $(echo "$others" | tr '\n' ' ')"
    elif [ -z "$glibc" ]; then
        why="no glibc symbol versions found (a static or non-glibc build)"
    else
        [ "$glibc" -ge 17 ] || glibc=17
        tag="manylinux_2_${glibc}_$arch"
        why="it needs glibc 2.$glibc"
    fi
fi
echo "wheel: mneme $version from $bin, tagged $tag ($why)" >&2

mkdir -p "$out"
python3 - "$bin" "$version" "$tag" "$out" <<'PY'
import base64, hashlib, os, sys, zipfile

binary, version, platform, out = sys.argv[1:]
name = "mneme"
tag = f"py3-none-{platform}"
wheel = os.path.join(out, f"{name}-{version}-{tag}.whl")
dist_info = f"{name}-{version}.dist-info"
data = f"{name}-{version}.data"

metadata = f"""Metadata-Version: 2.1
Name: {name}
Version: {version}
Summary: An event-sourced agent runtime: crash-safe agent sessions as hash-chained logs (the mneme binary)
License: Apache-2.0
Requires-Python: >=3.7
Classifier: License :: OSI Approved :: Apache Software License
Classifier: Operating System :: POSIX :: Linux
Classifier: Programming Language :: Rust
Description-Content-Type: text/markdown

# mneme

The `mneme` binary: an event-sourced agent runtime. Run `mneme demo`, then see
the guide (docs/guide/) of the mneme repository.
"""
wheel_file = f"""Wheel-Version: 1.0
Generator: mneme scripts/wheel.sh
Root-Is-Purelib: false
Tag: {tag}
"""

def digest(data):
    sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + sha.decode()

def entry(path, mode):
    info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = (0o100000 | mode) << 16  # a regular file, and its mode
    info.compress_type = zipfile.ZIP_DEFLATED
    return info

records = []
partial = wheel + ".part"
with zipfile.ZipFile(partial, "w", compresslevel=6) as zf:
    # The binary, streamed (it may be hundreds of MiB unstripped).
    script = f"{data}/scripts/{name}"
    sha, size = hashlib.sha256(), 0
    with open(binary, "rb") as src, zf.open(entry(script, 0o755), "w", force_zip64=True) as dst:
        while chunk := src.read(1 << 20):
            sha.update(chunk)
            size += len(chunk)
            dst.write(chunk)
    b64 = base64.urlsafe_b64encode(sha.digest()).rstrip(b"=").decode()
    records.append(f"{script},sha256={b64},{size}")
    for path, text in [(f"{dist_info}/METADATA", metadata), (f"{dist_info}/WHEEL", wheel_file)]:
        body = text.encode()
        zf.writestr(entry(path, 0o644), body)
        records.append(f"{path},{digest(body)},{len(body)}")
    records.append(f"{dist_info}/RECORD,,")
    zf.writestr(entry(f"{dist_info}/RECORD", 0o644), "\n".join(records) + "\n")
os.replace(partial, wheel)
print(wheel)
PY
