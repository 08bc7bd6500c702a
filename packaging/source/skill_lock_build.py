"""PEP 517 build backend for building skill-lock from its source checkout.

It is maturin (the wheel holds the Rust binary as its `skill-lock` script),
with two things a plugin cache needs and maturin alone does not do:

- **cargo missing fails at once**, with a message saying what to do, instead
  of maturin fetching puccinialin and a ~900 MB Rust toolchain;
- **a read-only checkout builds**: when the checkout's `target/` cannot be
  written and CARGO_TARGET_DIR is unset, cargo's target directory goes to the
  user's cache (`$XDG_CACHE_HOME/skill-lock/cargo-target`, else
  `~/.cache/skill-lock/cargo-target`), so later builds are incremental and
  nothing is written into the checkout.

The prebuilt plugin bundle (scripts/bundle) needs neither cargo nor this file.
"""

import os
import shutil
import sys

import maturin

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _writable(path):
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return False
        probe = parent
    if not os.access(probe, os.W_OK):
        return False
    # Root passes os.access on a read-only mount: ask the file system.
    try:
        return not (os.statvfs(probe).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _prepare():
    if shutil.which("cargo") is None:
        sys.stderr.write(
            "skill-lock: building from source needs cargo, the Rust package manager, "
            "on PATH (install it from https://rustup.rs), or use the prebuilt plugin "
            "bundle, which needs no toolchain: see docs/install.md.\n"
        )
        raise SystemExit(1)
    os.environ.setdefault("MATURIN_NO_INSTALL_RUST", "1")
    if not os.environ.get("CARGO_TARGET_DIR") and not _writable(os.path.join(ROOT, "target")):
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        os.environ["CARGO_TARGET_DIR"] = os.path.join(cache, "skill-lock", "cargo-target")


def get_requires_for_build_wheel(config_settings=None):
    _prepare()
    return maturin.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    return maturin.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _prepare()
    return maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _prepare()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    return maturin.build_sdist(sdist_directory, config_settings)
