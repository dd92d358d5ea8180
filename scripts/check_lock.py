"""Check that a Python environment holds exactly the versions of requirements-lock.txt.

    python scripts/check_lock.py [--complete] [--lock requirements-lock.txt]

Every installed distribution (omnijax itself and pip's own tools aside) must appear in the lock at its locked
version (local build labels such as ``+cpu`` aside); with ``--complete``, every package of the lock's main
section must also be installed (the test command's environment). The lock's sections:

    (no marker)            the main section: the package with its test and train extras
    # [optional: NAME]     an extra the test command does not install (may be absent; if present, locked)
    # [outside]            installed apart by the tests, never into the environment (e.g. tests/fixtures/llama4_reference.py)

Exit status 0 when the environment matches, 1 (with one line per difference) when it does not.
Standard library only: it runs before anything is known about the environment.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import pathlib
import re
import sys

NOT_CHECKED = {"pip", "omnijax"}  # the installer itself, and the package under test (an editable install)


def normalize(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def public(version: str) -> str:
    """The version without its local label ("2.13.0+cpu" -> "2.13.0")."""
    return version.split("+", 1)[0]


def read_lock(path: pathlib.Path) -> dict[str, dict[str, str]]:
    """{section: {normalised name: version}}; sections "main", "optional: NAME", "outside"."""
    sections: dict[str, dict[str, str]] = {"main": {}}
    section = "main"
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        marker = re.fullmatch(r"#\s*\[([^\]]+)\].*", line)
        if marker:
            section = marker.group(1).strip()
            sections.setdefault(section, {})
            continue
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        pin = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if not pin:
            raise SystemExit(f"{path}:{number}: not a 'name==version' pin: {raw!r}")
        sections[section][normalize(pin.group(1))] = pin.group(2)
    return sections


def installed() -> dict[str, str]:
    found = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[normalize(name)] = dist.version
    return found


def differences(lock: dict[str, dict[str, str]], env: dict[str, str], complete: bool) -> list[str]:
    allowed = {}
    for section, pins in lock.items():
        if section != "outside":
            allowed.update(pins)
    problems = []
    for name, version in sorted(env.items()):
        if name in NOT_CHECKED:
            continue
        if name in lock.get("outside", {}):
            problems.append(f"{name}=={version} is installed, but the lock keeps it outside the environment")
        elif name not in allowed:
            problems.append(f"{name}=={version} is installed but not in the lock")
        elif public(version) != public(allowed[name]):
            problems.append(f"{name}=={version} is installed; the lock has {allowed[name]}")
    if complete:
        for name, version in sorted(lock["main"].items()):
            if name not in env and name not in NOT_CHECKED:
                problems.append(f"{name}=={version} is in the lock but not installed")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lock", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parents[1] / "requirements-lock.txt")
    parser.add_argument("--complete", action="store_true", help="also require every main-section package")
    args = parser.parse_args(argv)
    problems = differences(read_lock(args.lock), installed(), args.complete)
    if problems:
        print(f"this environment ({sys.prefix}) differs from {args.lock.name}:", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        print("remove the virtual environment and run the command again (or refresh the lock: "
              "bash scripts/refresh_lock.sh)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
