"""The offline wheelhouse for a GPU image: what to carry, split into chunks, reassembled and verified.

Stdlib only, so it runs on the machine that builds the wheelhouse and on the offline GPU machine alike.
``wheelhouse.sh`` and ``install-offline.sh`` (beside this file) are the commands; this module is their
logic. Subcommands:

- ``requirements VLLM_WHEEL``: the vLLM run-time dependencies we carry, with vLLM's own version
  specifiers read from the wheel's METADATA (``vllm-deps.txt`` says which are carried and why).
- ``constraints FREEZE``: the image's ``pip list --format=freeze`` as pip constraints (local version
  labels such as ``+cu130`` dropped), so nothing resolves another version of what the image has.
- ``platforms PLATFORM``: pip ``--platform`` options for a manylinux target and the older tags it runs.
- ``fake-site FREEZE SITE``: the image's pinned packages as bare installed dist-infos in SITE, so a
  resolution there takes them as given.
- ``missing REPORT FREEZE``: the ``name==version`` pins of a ``pip install --dry-run --report`` that the
  image does not already have.
- ``chunk DIR ARCHIVE_NAME MIB``: tar DIR's wheels into one archive, split it into parts of at most MIB
  MiB, and write ``MANIFEST`` (sha256 and size of each part and of the whole archive).
- ``reassemble CHUNK_DIR DEST``: check every part against ``MANIFEST``, join them, check the whole, and
  unpack the wheels into DEST; a missing or corrupt part stops it with the part's name.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tarfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

MANIFEST = "MANIFEST"
MANIFEST_HEADER = "# dgrpo wheelhouse manifest v1: kind sha256 size name"
MIB = 1024 * 1024
_BLOCK = 4 * MIB
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")


class WheelhouseError(Exception):
    """A wheelhouse that cannot be built or trusted; the message says which file and what to do."""


def normalize(name: str) -> str:
    """PEP 503 name: ``Foo_Bar.baz`` and ``foo-bar-baz`` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def freeze_pins(text: str) -> dict[str, str]:
    """The ``name==version`` lines of a freeze file as {normalized name: version}."""
    pins = {}
    for line in text.splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep and _NAME.fullmatch(name):
            pins[normalize(name)] = version.strip()
    return pins


def image_names(text: str) -> set[str]:
    """Every package a freeze file says the image has: ``name==version``, ``name @ url`` or a bare
    ``name`` (a package known to be there, version unknown); ``#`` starts a comment."""
    names = set()
    for line in text.splitlines():
        match = _NAME.match(line.split("#", 1)[0].strip())
        if match and not line.lstrip().startswith("-"):
            names.add(normalize(match.group(1)))
    return names


def constraints(freeze_text: str) -> list[str]:
    """The image's pins as constraints, without local labels (``2.11.0+cu130`` -> ``2.11.0``)."""
    return [
        f"{name}=={version.split('+', 1)[0]}" for name, version in sorted(freeze_pins(freeze_text).items())
    ]


def wheel_requires(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        metadata = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        if metadata is None:
            raise WheelhouseError(f"{wheel}: no .dist-info/METADATA inside; is it a wheel?")
        text = zf.read(metadata).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def carried_requirements(requires: Iterable[str], carry: list[str], skip: list[str]) -> list[str]:
    """vLLM's requirements for the names in ``carry``, markers dropped (the target is Linux x86-64,
    Python >= 3.12, where every marker vLLM puts on them holds). Every requirement outside an extra must
    be in ``carry`` or ``skip``, so a new vLLM version with a new dependency forces a decision."""
    out, undecided = [], []
    for req in requires:
        spec, _, marker = req.partition(";")
        if "extra ==" in marker:
            continue
        match = _NAME.match(spec.strip())
        if match is None:
            raise WheelhouseError(f"cannot read the requirement {req!r}")
        name = normalize(match.group(1).split("[", 1)[0])
        if name in carry:
            out.append(spec.strip())
        elif name not in skip:
            undecided.append(name)
    if undecided:
        raise WheelhouseError(
            "vLLM requires packages that deploy/gpu/vllm-deps.txt neither carries nor skips: "
            + ", ".join(undecided)
            + "; add each to one of its two lists, with the reason"
        )
    return out


def check_torch_pin(requires: Iterable[str], freeze_text: str) -> None:
    """vLLM's compiled kernels work only with the torch it pins: refuse an image with another torch."""
    have = freeze_pins(freeze_text).get("torch")
    for req in requires:
        spec = req.partition(";")[0].replace(" ", "")
        if have is not None and spec.startswith("torch=="):
            pinned = spec.removeprefix("torch==")
            if have.split("+", 1)[0] != pinned:
                raise WheelhouseError(
                    f"this vLLM pins torch=={pinned} but the image has torch {have}: pick the vLLM release "
                    "built for the image's torch (--vllm), or an image with that torch"
                )


def report_pins(report: dict[str, object]) -> dict[str, str]:
    """{normalized name: version} of everything a ``pip install --dry-run --report`` would install."""
    pins = {}
    for item in report.get("install", []):  # type: ignore[union-attr]
        meta = item["metadata"]
        pins[normalize(meta["name"])] = meta["version"]
    return pins


def missing_pins(report: dict[str, object], freeze_text: str) -> list[str]:
    """``name==version`` of the resolved packages the image does not have (by name: the image's own
    versions were constraints, so a name it has is satisfied)."""
    have = image_names(freeze_text)
    return [f"{n}=={v}" for n, v in sorted(report_pins(report).items()) if n not in have]


def platform_tags(platform: str) -> list[str]:
    """``manylinux_2_N_ARCH`` and every older manylinux tag a machine with glibc 2.N also runs (pip's
    ``--platform`` matches a tag exactly); any other platform is returned alone."""
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if match is None:
        return [platform]
    glibc, arch = int(match.group(1)), match.group(2)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{name}_{arch}" for minor, name in legacy.items() if glibc >= minor]


def fake_site(freeze_text: str, site_dir: Path) -> int:
    """Write a bare ``.dist-info`` (name and version, no files, no requirements) for each pinned package
    of the image into ``site_dir``, so pip run against that environment treats them as installed and
    never resolves, say, the image's torch's CUDA dependencies again."""
    pins = freeze_pins(freeze_text)
    for name, version in pins.items():
        info = site_dir / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("dgrpo-wheelhouse\n")
        (info / "RECORD").write_text("")
    return len(pins)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def chunk(wheel_dir: Path, out_dir: Path, archive_name: str, chunk_mib: int) -> list[Path]:
    """Tar the wheels of ``wheel_dir`` (uncompressed: wheels are zips already), split the archive into
    parts of at most ``chunk_mib`` MiB in ``out_dir``, write MANIFEST; return the parts."""
    if chunk_mib < 1:
        raise WheelhouseError("--chunk-mib must be at least 1")
    wheels = sorted(wheel_dir.glob("*.whl"))
    if not wheels:
        raise WheelhouseError(f"{wheel_dir}: no wheels to chunk")
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / archive_name
    with tarfile.open(archive, "w") as tar:
        for wheel in wheels:
            tar.add(wheel, arcname=wheel.name)
    lines = [MANIFEST_HEADER, f"whole {sha256_file(archive)} {archive.stat().st_size} {archive_name}"]
    parts = []
    with archive.open("rb") as src:
        index = 0
        while data := src.read(chunk_mib * MIB):
            part = out_dir / f"{archive_name}.part-{index:03d}"
            part.write_bytes(data)
            lines.append(f"part {hashlib.sha256(data).hexdigest()} {len(data)} {part.name}")
            parts.append(part)
            index += 1
    archive.unlink()
    (out_dir / MANIFEST).write_text("\n".join(lines) + "\n")
    return parts


def read_manifest(chunk_dir: Path) -> tuple[tuple[str, int, str], list[tuple[str, int, str]]]:
    """(whole, parts) of ``chunk_dir/MANIFEST``, each as (sha256, size, file name)."""
    path = chunk_dir / MANIFEST
    if not path.is_file():
        raise WheelhouseError(f"{path} is missing: copy it along with the parts")
    whole, parts = None, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 4 or fields[0] not in ("whole", "part") or "/" in fields[3]:
            raise WheelhouseError(f"{path}:{number}: not a manifest line: {line!r}")
        entry = (fields[1], int(fields[2]), fields[3])
        if fields[0] == "whole":
            whole = entry
        else:
            parts.append(entry)
    if whole is None or not parts:
        raise WheelhouseError(f"{path}: needs one 'whole' line and at least one 'part' line")
    return whole, parts


def verify_parts(chunk_dir: Path) -> tuple[str, int, str]:
    """Check every part named in MANIFEST exists with its size and sha256; return the whole's entry."""
    whole, parts = read_manifest(chunk_dir)
    problems = []
    for sha, size, name in parts:
        part = chunk_dir / name
        if not part.is_file():
            problems.append(f"{name}: missing")
        elif part.stat().st_size != size:
            problems.append(f"{name}: {part.stat().st_size} bytes, manifest says {size}")
        elif sha256_file(part) != sha:
            problems.append(f"{name}: sha256 differs from the manifest (corrupt copy)")
    if problems:
        raise WheelhouseError("wheelhouse parts fail verification; copy these again: " + "; ".join(problems))
    return whole


def reassemble(chunk_dir: Path, dest: Path) -> list[Path]:
    """Verify the parts, join them, verify the whole archive, unpack its wheels into ``dest``."""
    whole_sha, whole_size, archive_name = verify_parts(chunk_dir)
    _, parts = read_manifest(chunk_dir)
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / archive_name
    digest = hashlib.sha256()
    with archive.open("wb") as out:
        for _, _, name in parts:
            with (chunk_dir / name).open("rb") as f:
                while block := f.read(_BLOCK):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != whole_sha or archive.stat().st_size != whole_size:
        archive.unlink()
        raise WheelhouseError(f"{archive_name}: the joined parts differ from the manifest's whole archive")
    wheels = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.isfile() or "/" in member.name or not member.name.endswith(".whl"):
                raise WheelhouseError(f"{archive_name}: unexpected entry {member.name!r} (only wheels)")
            tar.extract(member, dest, filter="data")
            wheels.append(dest / member.name)
    archive.unlink()
    return wheels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("requirements")
    p.add_argument("wheel", type=Path)
    p.add_argument("--deps", type=Path, default=Path(__file__).with_name("vllm-deps.txt"))
    p.add_argument(
        "--image-freeze", type=Path, help="refuse the wheel if its torch pin differs from the image's"
    )
    p = sub.add_parser("constraints")
    p.add_argument("freeze", type=Path)
    p = sub.add_parser("platforms")
    p.add_argument("platform")
    p = sub.add_parser("fake-site")
    p.add_argument("freeze", type=Path)
    p.add_argument("site_dir", type=Path)
    p = sub.add_parser("missing")
    p.add_argument("report", type=Path)
    p.add_argument("freeze", type=Path)
    p = sub.add_parser("chunk")
    p.add_argument("wheel_dir", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("chunk_mib", type=int)
    p.add_argument("--archive-name", default="wheelhouse.tar")
    p = sub.add_parser("reassemble")
    p.add_argument("chunk_dir", type=Path)
    p.add_argument("dest", type=Path)
    a = parser.parse_args(argv)
    try:
        if a.command == "requirements":
            carry, skip = read_deps(a.deps)
            requires = wheel_requires(a.wheel)
            if a.image_freeze is not None:
                check_torch_pin(requires, a.image_freeze.read_text())
            print("\n".join(carried_requirements(requires, carry, skip)))
        elif a.command == "constraints":
            print("\n".join(constraints(a.freeze.read_text())))
        elif a.command == "platforms":
            print(" ".join(f"--platform {tag}" for tag in platform_tags(a.platform)))
        elif a.command == "fake-site":
            fake_site(a.freeze.read_text(), a.site_dir)
        elif a.command == "missing":
            report = json.loads(a.report.read_text())
            print("\n".join(missing_pins(report, a.freeze.read_text())))
        elif a.command == "chunk":
            for part in chunk(a.wheel_dir, a.out_dir, a.archive_name, a.chunk_mib):
                print(part)
        else:
            for wheel in reassemble(a.chunk_dir, a.dest):
                print(wheel)
    except WheelhouseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def read_deps(path: Path) -> tuple[list[str], list[str]]:
    """(carry, skip) from ``vllm-deps.txt``: lines ``carry NAME  # why`` or ``skip NAME  # why``."""
    carry, skip = [], []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.split("#", 1)[0].split()
        if not text:
            continue
        if len(text) != 2 or text[0] not in ("carry", "skip"):
            raise WheelhouseError(f"{path}:{number}: expected 'carry NAME' or 'skip NAME', got {line!r}")
        (carry if text[0] == "carry" else skip).append(normalize(text[1]))
    return carry, skip


if __name__ == "__main__":
    sys.exit(main())
