"""The release check (`make test-release`): what a user installs is what `make test` tests.

1. Export the tree (the files git tracks, and untracked ones it does not ignore) to a
   temporary directory, and build the wheel and the sdist there (`python -m build`).
2. `twine check --strict` both archives.
3. List each archive against the package's files in the tree: a file under
   django_agentrun/ (bytecode aside) that an archive lacks fails the check, by name.
4. Per archive, a fresh virtualenv on the Python given (3.13 in `make test`), the archive
   installed into it with the `postgres`, `pytest` and `telemetry` extras, then the fresh-project test
   (tests/workers/test_fresh_project.py) with the project's processes on that virtualenv:
   the whole module for the wheel; `check` and one run for the sdist.

    python tools/release_check.py --python python3.13 [--keep DIR]

`make test` splits it in two so that the slow part (building, and installing into fresh
virtualenvs) runs while the first test stages do: `--prepare --keep DIR` does steps 1-4 up
to the installs (both virtualenvs at once) and records them in DIR/prepared.json;
`--prepared --keep DIR` later runs the fresh-project tests on them (both at once) and
removes DIR.

Needs what the fresh-project test needs: DATABASE_URL (Postgres) and Redis.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "django_agentrun"
EXTRAS = "postgres,pytest,telemetry"
FRESH_PROJECT = "tests/workers/test_fresh_project.py"
# What the sdist must pass at least: the project starts, `check` is clean, a run completes.
SDIST_TESTS = "runs_the_package_under_test or from_the_readme_to_a_completed_run"


class CheckFailed(Exception):
    pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--python", default="python3.13", help="the Python of the fresh virtualenvs (%(default)s)"
    )
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    parser.add_argument(
        "--archives-only", action="store_true", help="build and list the archives, no install"
    )
    parser.add_argument(
        "--prepare",
        action="store_true",
        help="build, list and install into --keep DIR only; a later --prepared run tests them",
    )
    parser.add_argument(
        "--prepared",
        action="store_true",
        help="run the fresh-project tests on what --prepare left in --keep DIR, then remove it",
    )
    args = parser.parse_args(argv)
    if (args.prepare or args.prepared) and args.keep is None:
        parser.error("--prepare and --prepared need --keep DIR")
    # Absolute: the installs run with the work directory as their current directory.
    work = (args.keep or Path(tempfile.mkdtemp(prefix="agentrun-release-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    record = work / "prepared.json"
    try:
        if args.prepared:
            if not record.exists():
                raise CheckFailed(f"{record} is missing: the --prepare run failed or never ran")
            pythons = [Path(p) for p in json.loads(record.read_text())]
        else:
            record.unlink(missing_ok=True)
            archives = build_and_list(work)
            if args.archives_only:
                say("passed")
                return 0
            with ThreadPoolExecutor(len(archives)) as pool:
                pythons = list(pool.map(lambda a: install(work, a, args.python), archives))
            if args.prepare:
                record.write_text(json.dumps([str(p) for p in pythons]))
                say(f"prepared in {work}")
                return 0
        # Both at once (each has a database, a queue and processes of its own); their
        # output one after the other.
        with ThreadPoolExecutor(len(pythons)) as pool:
            outcomes = list(pool.map(fresh_project, pythons, (None, SDIST_TESTS)))
        for python, (output, ok) in zip(pythons, outcomes, strict=True):
            print(output, end="", flush=True)
            if not ok:
                raise CheckFailed(f"the fresh-project test failed on {python}")
    except CheckFailed as exc:
        print(f"release check: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep is None or args.prepared:
            shutil.rmtree(work, ignore_errors=True)
    say("passed")
    return 0


def build_and_list(work: Path) -> tuple[Path, Path]:
    """The wheel and the sdist, each checked to hold every file of the package."""
    wheel, sdist = build(work)
    for archive in (wheel, sdist):
        missing = sorted(package_files(work / "export") - archive_files(archive))
        if missing:
            raise CheckFailed(
                f"{archive.name} lacks {len(missing)} file(s) of the package's tree "
                f"(pyproject.toml [tool.setuptools.package-data]): " + ", ".join(missing)
            )
        say(f"{archive.name}: every file of {PACKAGE}/ is in it")
    return wheel, sdist


def say(message: str) -> None:
    print(f"release check: {message}", flush=True)


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = subprocess.run(argv, text=True, capture_output=True, **kwargs)
    if done.returncode != 0:
        raise CheckFailed(
            f"{' '.join(map(str, argv))} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
        )
    say(
        f"{Path(argv[0]).name} {' '.join(map(str, argv[1:4]))} ... ({time.monotonic() - started:.0f} s)"
    )
    return done


def export(dest: Path) -> None:
    """The tree as a clean clone would have it, with the work in progress that git sees."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = ROOT / name
        if source.is_file():  # listed but deleted in the work tree: not exported
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def build(work: Path) -> tuple[Path, Path]:
    tree, dist = work / "export", work / "dist"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.rmtree(dist, ignore_errors=True)
    export(tree)
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(tree)])
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise CheckFailed(f"expected one wheel and one sdist in {dist}, found {os.listdir(dist)}")
    run([sys.executable, "-m", "twine", "check", "--strict", str(wheels[0]), str(sdists[0])])
    return wheels[0], sdists[0]


def package_files(tree: Path) -> set[str]:
    """Every file of the package in the exported tree, as a path from the tree's root."""
    return {
        path.relative_to(tree).as_posix()
        for path in (tree / PACKAGE).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def archive_files(archive: Path) -> set[str]:
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            return set(zf.namelist())
    with tarfile.open(archive) as tf:
        # Each member is under the sdist's top directory, `name-version/`.
        return {m.name.partition("/")[2] for m in tf.getmembers() if m.isfile()}


def install(work: Path, archive: Path, python: str) -> Path:
    """A fresh virtualenv with `archive` (and its extras) installed; its Python."""
    venv = work / f"venv-{'wheel' if archive.suffix == '.whl' else 'sdist'}"
    shutil.rmtree(venv, ignore_errors=True)
    run([python, "-m", "venv", str(venv)])
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
    ]
    run([*pip, f"{archive.resolve()}[{EXTRAS}]"], cwd=work)
    versions = run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import sys, django, django_agentrun; "
            "print(sys.version.split()[0], django.get_version(), django_agentrun.__version__)",
        ],
        cwd=work,
    ).stdout.split()
    say(f"{archive.name} on Python {versions[0]}, Django {versions[1]}: {PACKAGE} {versions[2]}")
    return venv / "bin" / "python"


def fresh_project(python: Path, tests: str | None) -> tuple[str, bool]:
    """The fresh-project test with the project's processes on `python`: its output (and a
    line saying how it went), and whether it passed."""
    argv = [sys.executable, "-m", "pytest", FRESH_PROJECT, "-q"]
    if tests:
        argv += ["-k", tests]
    env = {**os.environ, "AGENTRUN_TEST_PROJECT_PYTHON": str(python)}
    started = time.monotonic()
    done = subprocess.run(
        argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    verdict = "passed" if done.returncode == 0 else "FAILED"
    took = time.monotonic() - started
    line = f"release check: fresh project on {python.parent.parent.name}: {verdict} ({took:.0f} s)"
    return f"{done.stdout}{line}\n", done.returncode == 0


if __name__ == "__main__":
    sys.exit(main())
