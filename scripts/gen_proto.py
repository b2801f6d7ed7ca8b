"""Regenerate the committed protobuf code of compactd from its own ``.proto``.

compactd commits ``message/proto/pulsar_api_pb2.py`` and ``pulsar_api_pb2.pyi`` so that
neither an install nor an import needs ``protoc``. This script is the one way to produce
them: it runs ``grpc_tools.protoc`` (the dev dependency ``grpcio-tools``) from the repository
root, so the generated ``# source:`` line and the module's import path are both
``message/proto/pulsar_api.proto`` / ``message.proto.pulsar_api_pb2``.

Usage (from anywhere)::

    python scripts/gen_proto.py            # rewrite message/proto/pulsar_api_pb2.py(i)
    python scripts/gen_proto.py --check    # regenerate to a temp dir; exit 1 on any difference
    python scripts/gen_proto.py --out-dir DIR   # write the generated files into DIR instead

The one change made to protoc's output: the ``.pyi`` gets a first line
``# mypy: ignore-errors``. protoc writes stubs with bare generics (``Mapping``) that
``mypy --strict`` rejects; the directive silences errors *inside* the stub while its types
still check every caller. Type-checking callers needs the ``types-protobuf`` stubs.

The output depends on the protoc bundled with grpcio-tools: the generated module pins the
minimum protobuf runtime it accepts (``ValidateProtobufRuntimeVersion``). Regenerate only
with the grpcio-tools version the committed files name in their header.
"""

from __future__ import annotations

import argparse
import difflib
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_PATH = Path("message/proto/pulsar_api.proto")
"""The one .proto, relative to the repository root (protoc's include path)."""
GENERATED_NAMES = ("pulsar_api_pb2.py", "pulsar_api_pb2.pyi")
"""The files protoc writes beside the .proto, in the package directory."""
STUB_HEADER = b"# mypy: ignore-errors\n"
"""Prepended to the generated .pyi (see the module docstring for why)."""
PROTOC_TIMEOUT_S = 120
"""protoc takes well under a second here; two minutes only guards against a hung process."""


def generate(out_dir: Path) -> dict[str, bytes]:
    """Run protoc on the committed .proto; return ``{file name: content}`` of what it wrote.

    The files land in ``out_dir / "message/proto"``; ``out_dir`` must exist.
    Raises ``RuntimeError`` with protoc's output when protoc fails.
    """
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={REPO_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        str(REPO_ROOT / PROTO_PATH),
    ]
    completed = subprocess.run(
        command,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=PROTOC_TIMEOUT_S,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"protoc failed ({completed.returncode}):\n{completed.stderr}")
    package_dir = out_dir / PROTO_PATH.parent
    stub = package_dir / "pulsar_api_pb2.pyi"
    stub.write_bytes(STUB_HEADER + stub.read_bytes())
    return {name: (package_dir / name).read_bytes() for name in GENERATED_NAMES}


def committed() -> dict[str, bytes]:
    """The generated files as committed; a missing file reads as empty."""
    package_dir = REPO_ROOT / PROTO_PATH.parent
    return {
        name: (package_dir / name).read_bytes() if (package_dir / name).exists() else b""
        for name in GENERATED_NAMES
    }


def differences(expected: dict[str, bytes], actual: dict[str, bytes]) -> list[str]:
    """Unified diffs (committed → regenerated), one string per file that differs."""
    diffs = []
    for name in GENERATED_NAMES:
        if expected[name] == actual[name]:
            continue
        lines = difflib.unified_diff(
            expected[name].decode("utf-8", "replace").splitlines(keepends=True),
            actual[name].decode("utf-8", "replace").splitlines(keepends=True),
            fromfile=f"committed/{name}",
            tofile=f"regenerated/{name}",
            n=1,
        )
        diffs.append("".join(lines))
    return diffs


def write_in_place() -> None:
    """Regenerate straight into ``message/proto``."""
    generate(REPO_ROOT)


def check() -> int:
    """Regenerate into a temporary directory; 0 if identical to the committed files."""
    with tempfile.TemporaryDirectory() as temporary:
        diffs = differences(committed(), generate(Path(temporary)))
    for diff in diffs:
        sys.stdout.write(diff[:20_000])
    if diffs:
        print("generated protobuf code is stale: run `python scripts/gen_proto.py`")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="diff instead of writing")
    parser.add_argument("--out-dir", type=Path, help="write the generated files here")
    arguments = parser.parse_args(argv)
    if arguments.check:
        return check()
    if arguments.out_dir is not None:
        arguments.out_dir.mkdir(parents=True, exist_ok=True)
        generate(arguments.out_dir)
        return 0
    write_in_place()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
