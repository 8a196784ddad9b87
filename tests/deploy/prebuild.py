"""The deployment tests' images, built ahead of the tests, so that CI can build them while other tests run.

The build is mostly downloads (Debian's packages for ``debootstrap``, about 1.5 GB of wheels for pip inside
the build), so .ci/run starts it beside the search across hosts and hands the images to ``make
test-deploy`` through ``MOP_DEPLOY_IMAGE`` and ``MOP_DEPLOY_DEBIAN``, as a user reruns the tests on images
built before::

    python -m tests.deploy.prebuild build FILE    # builds; FILE: the images' tags and timings (JSON)
    python -m tests.deploy.prebuild env FILE      # the variables for make test-deploy, one a line
    python -m tests.deploy.prebuild remove FILE   # removes every image the build made

The tests then build only what they add on top (the search's DAG folder, the compose file's stand-ins) and
remove that; the images named in FILE are the caller's to remove.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from tests.deploy.podman import Podman, build_images, built_line, tools_missing, workdir


def build(out: Path) -> dict:
    missing = tools_missing()
    if missing:
        raise SystemExit(f"building the deployment images needs {', '.join(missing)}: "
                         "apt-get install podman runc debootstrap")
    folder = workdir()
    podman = Podman(folder)
    try:
        built = build_images(podman)
    except BaseException:
        podman.close()  # a failed build leaves nothing behind
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    made = {"image": built["image"], "debian": built["debian"], "made": list(podman.images),
            "timings": built["timings"], "size_bytes": built["size_bytes"]}
    out.write_text(json.dumps(made, indent=1))
    print(built_line(made))
    return made


def remove(made_file: Path) -> None:
    if not made_file.exists():
        return
    podman = Podman(workdir())
    podman.images.extend(json.loads(made_file.read_text())["made"])
    try:
        podman.close()
    finally:
        shutil.rmtree(podman.workdir, ignore_errors=True)
    made_file.unlink()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.deploy.prebuild", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["build", "env", "remove"])
    parser.add_argument("file", type=Path, help="the JSON file of the images built")
    args = parser.parse_args(argv)
    if args.action == "build":
        build(args.file)
    elif args.action == "env":
        made = json.loads(args.file.read_text())
        sys.stdout.write(f"MOP_DEPLOY_IMAGE={made['image']}\nMOP_DEPLOY_DEBIAN={made['debian']}\n")
    else:
        remove(args.file)


if __name__ == "__main__":
    main()
