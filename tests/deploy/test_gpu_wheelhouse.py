"""The offline GPU wheelhouse: chunking, verified reassembly and ``install-offline.sh``, run for real on tiny
wheels built here (no network); and the rules that pick what the wheelhouse carries."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "deploy" / "gpu"


def load_wheelhouse() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_wheelhouse", GPU / "wheelhouse.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


wheelhouse = load_wheelhouse()


def build_wheel(out: Path, name: str, version: str, answer: int, payload_bytes: int = 0) -> Path:
    """A real, installable pure-Python wheel: module ``name`` with ``ANSWER`` and a stored data blob."""
    files = {
        f"{name}/__init__.py": f"ANSWER = {answer}\n".encode(),
        f"{name}/blob.bin": os.urandom(payload_bytes),  # random: no compression shrinks it below a chunk
    }
    info = f"{name}-{version}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


@pytest.fixture
def chunked(tmp_path: Path) -> Path:
    """Two wheels (about 2.5 MiB together) split into 1 MiB parts by ``wheelhouse.py chunk``."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels, "tinyalpha", "1.0", 41, payload_bytes=1_500_000)
    build_wheel(wheels, "tinybeta", "2.0", 42, payload_bytes=1_000_000)
    chunks = tmp_path / "chunks"
    run([sys.executable, str(GPU / "wheelhouse.py"), "chunk", str(wheels), str(chunks), "1"])
    return chunks


def run(argv: list[str], ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO)
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def install(chunks: Path, target: Path) -> subprocess.CompletedProcess[str]:
    env_python = f"PYTHON={sys.executable}"
    script = GPU / "install-offline.sh"
    return subprocess.run(
        ["env", env_python, "bash", str(script), "--chunks", str(chunks), "--target", str(target)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


def test_chunks_are_at_most_the_size_asked_and_the_manifest_hashes_each_part_and_the_whole(
    chunked: Path,
) -> None:
    whole, parts = wheelhouse.read_manifest(chunked)
    assert len(parts) == 3  # ~2.5 MiB of tar in 1 MiB parts
    for sha, size, name in parts:
        part = chunked / name
        assert part.stat().st_size == size <= 2**20
        assert hashlib.sha256(part.read_bytes()).hexdigest() == sha
    joined = b"".join((chunked / name).read_bytes() for _, _, name in parts)
    assert (hashlib.sha256(joined).hexdigest(), len(joined)) == whole[:2]
    assert not (chunked / "wheelhouse.tar").exists()  # only parts travel


def test_install_offline_reassembles_and_the_packages_import_once_its_exports_are_evaluated(
    chunked: Path, tmp_path: Path
) -> None:
    target = tmp_path / "site"
    probe = "import tinyalpha, tinybeta; print(tinyalpha.ANSWER + tinybeta.ANSWER)"
    script = f'eval "$(bash {GPU / "install-offline.sh"} --chunks {chunked} --target {target})" && '
    script += f'echo "$PYTHONPATH" && {sys.executable} -c "{probe}"'
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHON": sys.executable}
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(target.resolve()), "83"]
    assert (target / "tinyalpha-1.0.dist-info" / "RECORD").is_file()
    assert not (chunked / "wheels" / "wheelhouse.tar").exists()  # the joined archive is not kept


def test_a_corrupt_part_is_refused_by_name_and_nothing_is_installed(chunked: Path, tmp_path: Path) -> None:
    part = chunked / "wheelhouse.tar.part-001"
    data = bytearray(part.read_bytes())
    data[1000] ^= 0xFF  # one flipped bit, same size: only the sha256 can tell
    part.write_bytes(bytes(data))
    target = tmp_path / "site"
    done = install(chunked, target)
    assert done.returncode == 1
    assert "wheelhouse.tar.part-001: sha256 differs" in done.stderr and "nothing installed" in done.stderr
    assert not target.exists()


def test_a_missing_or_truncated_part_is_refused_by_name(chunked: Path, tmp_path: Path) -> None:
    (chunked / "wheelhouse.tar.part-002").unlink()
    truncated = chunked / "wheelhouse.tar.part-000"
    truncated.write_bytes(truncated.read_bytes()[:-10])
    done = install(chunked, tmp_path / "site")
    assert done.returncode == 1
    assert "wheelhouse.tar.part-002: missing" in done.stderr
    assert "wheelhouse.tar.part-000: 1048566 bytes, manifest says 1048576" in done.stderr
    (chunked / "MANIFEST").unlink()
    assert "MANIFEST is missing" in install(chunked, tmp_path / "site").stderr


def test_a_tampered_manifest_cannot_smuggle_a_path_out_of_the_chunk_dir(
    chunked: Path, tmp_path: Path
) -> None:
    manifest = chunked / "MANIFEST"
    manifest.write_text(manifest.read_text().replace("wheelhouse.tar.part-000", "../../etc/passwd"))
    done = install(chunked, tmp_path / "site")
    assert done.returncode == 1 and "not a manifest line" in done.stderr


def test_install_offline_wants_one_source_and_one_destination(tmp_path: Path) -> None:
    script = str(GPU / "install-offline.sh")
    done = run(["bash", script, "--target", str(tmp_path)], ok=False)
    assert done.returncode == 2 and "exactly one of --chunks DIR or --wheels DIR" in done.stderr
    done = run(["bash", script, "--wheels", str(tmp_path)], ok=False)
    assert done.returncode == 2 and "exactly one of --target DIR or --venv DIR" in done.stderr


def test_wheelhouse_sh_wants_the_image_freeze_and_a_sane_chunk_size(tmp_path: Path) -> None:
    script = str(GPU / "wheelhouse.sh")
    done = run(["bash", script], ok=False)
    assert done.returncode == 2 and "--image-freeze is required" in done.stderr
    freeze = tmp_path / "image.freeze"
    freeze.write_text("torch==2.11.0+cu130\n")
    done = run(["bash", script, "--image-freeze", str(freeze), "--chunk-mib", "0"], ok=False)
    assert done.returncode == 2 and "--chunk-mib wants a whole number" in done.stderr


VLLM_REQUIRES = [
    "regex",
    "fastapi[standard]<0.137.0,>=0.133.0",
    'llguidance<1.8.0,>=1.7.0; platform_machine == "x86_64"',
    "torch==2.11.0",
    "flashinfer-python==0.6.14",
    'pandas; extra == "bench"',
]


def test_carried_vllm_requirements_keep_vllms_specifiers_and_every_dependency_needs_a_decision() -> None:
    carry = ["regex", "fastapi", "llguidance"]
    skip = ["torch", "flashinfer-python"]
    assert wheelhouse.carried_requirements(VLLM_REQUIRES, carry, skip) == [
        "regex",
        "fastapi[standard]<0.137.0,>=0.133.0",
        "llguidance<1.8.0,>=1.7.0",
    ]  # markers dropped (they hold on the target), extras never carried
    with pytest.raises(wheelhouse.WheelhouseError, match="neither carries nor skips: flashinfer-python"):
        wheelhouse.carried_requirements(VLLM_REQUIRES, carry, ["torch"])


def test_the_shipped_vllm_deps_list_parses_and_decides_each_name_once() -> None:
    carry, skip = wheelhouse.read_deps(GPU / "vllm-deps.txt")
    assert not set(carry) & set(skip)
    assert {"pyzmq", "msgspec", "xgrammar", "fastapi"} <= set(carry)
    assert {"torch", "flashinfer-python", "tilelang", "quack-kernels"} <= set(skip)


def test_a_vllm_built_for_another_torch_is_refused() -> None:
    wheelhouse.check_torch_pin(VLLM_REQUIRES, "torch==2.11.0+cu130\n")
    with pytest.raises(
        wheelhouse.WheelhouseError, match=r"pins torch==2.11.0 but the image has torch 2.10.0"
    ):
        wheelhouse.check_torch_pin(VLLM_REQUIRES, "torch==2.10.0+cu128\n")


def test_the_image_freeze_becomes_constraints_and_filters_what_is_carried(tmp_path: Path) -> None:
    freeze = "torch==2.11.0+cu130\nTyping_Extensions==4.16.0\nmyproj @ file:///src\ntriton\n# comment\n"
    assert wheelhouse.constraints(freeze) == ["torch==2.11.0", "typing-extensions==4.16.0"]
    report = {
        "install": [
            {"metadata": {"name": "typing_extensions", "version": "4.16.0"}},
            {"metadata": {"name": "msgspec", "version": "0.19.0"}},
            {"metadata": {"name": "Triton", "version": "3.5.0"}},
            {"metadata": {"name": "myproj", "version": "1"}},
        ]
    }
    assert wheelhouse.missing_pins(report, freeze) == ["msgspec==0.19.0"]
    site = tmp_path / "site"
    assert wheelhouse.fake_site(freeze, site) == 2
    metadata = (site / "torch-2.11.0+cu130.dist-info" / "METADATA").read_text()
    assert "Name: torch\nVersion: 2.11.0+cu130" in metadata


def test_a_manylinux_target_also_accepts_older_tags() -> None:
    tags = wheelhouse.platform_tags("manylinux_2_35_x86_64")
    assert tags[0] == "manylinux_2_35_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux_2_36_x86_64" not in tags
    assert wheelhouse.platform_tags("win_amd64") == ["win_amd64"]


def test_install_offline_into_a_venv_that_still_sees_the_images_packages(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels, "tinygamma", "3.0", 7)
    venv = tmp_path / "venv"
    script = f"bash {GPU / 'install-offline.sh'} --wheels {wheels} --venv {venv}"
    done = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f'export PATH="{venv.resolve()}/bin:$PATH"'
    probe = "import sys, tinygamma; print(tinygamma.ANSWER); print(*sys.path, sep=chr(10))"
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True
    )
    answer, *path = result.stdout.splitlines()
    base = "import sys, sysconfig; print(sysconfig.get_paths(vars={'base': sys.base_prefix})['purelib'])"
    base_site = subprocess.run([sys.executable, "-c", base], capture_output=True, text=True, check=True)
    assert answer == "7" and base_site.stdout.strip() in path  # the interpreter's own packages (torch) too


def requirement_names(lines: list[str]) -> set[str]:
    names = set()
    for line in lines:
        match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line.split("#", 1)[0])
        if match:
            names.add(wheelhouse.normalize(match.group(1)))
    return names


LEFT_OUT = {"wandb", "torch"}
"""Run-time dependencies the GPU wheelhouse does not carry: wandb (GPU runs log no W&B), torch (the image's)."""


def test_the_gpu_wheelhouse_carries_every_run_time_dependency_of_the_project() -> None:
    """A worker on the GPU image imports what the project needs at run time (the OpenTelemetry packages a traced
    worker loads included): every dependency of pyproject.toml and its cpu extra is in requirements-project.txt."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    needed = requirement_names([*project["dependencies"], *project["optional-dependencies"]["cpu"]])
    carried = requirement_names((GPU / "requirements-project.txt").read_text().splitlines())
    assert {"opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"} <= needed
    assert needed - LEFT_OUT - carried == set()
