"""PEP 517 build backend of the skill-lock plugin bundle (stdlib only).

A plugin installs the directory that `scripts/bundle` writes at, e.g.,
~/.claude/magpie/skill-lock, and skills call

    uvx --from ~/.claude/magpie/skill-lock skill-lock <command> ...

uv then builds a wheel from that directory with this backend: no compiler, no
package index, no write into the directory (which may be read-only). The
wheel's one script is the prebuilt binary for this host, taken from
bin/<os>-<arch>/skill-lock (skill-lock.exe for windows-*); uv runs it directly on every later call, so no
Python starts after the first. On a host the bundle has no binary for, the
script is a small sh program that prints the one JSON error object the
contract promises (exit 2), naming the platforms the bundle has and how to
build from source.
"""

import base64
import hashlib
import io
import os
import platform
import re
import sysconfig
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "skill_lock"
SUMMARY = "A lease lock per (skill, repository) that batch automation takes before it posts"


def _version():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        match = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
    if not match:
        raise RuntimeError("skill-lock bundle: pyproject.toml has no version")
    return match.group(1)


def host_platform():
    """This host as the bundle names platforms: linux-x86_64, macos-aarch64, ..."""
    system = platform.system().lower()
    machine = platform.machine().lower()
    system = {"darwin": "macos"}.get(system, system)
    machine = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return "%s-%s" % (system, machine)


def binary_name(plat):
    """The file name of a platform's binary in bin/<plat>/ and in the wheel."""
    return "skill-lock.exe" if plat.startswith("windows-") else "skill-lock"


def bundled_platforms():
    """The platforms this bundle carries a binary for."""
    base = os.path.join(ROOT, "bin")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    return [n for n in names if os.path.isfile(os.path.join(base, n, binary_name(n)))]


def _no_binary_script(host, have):
    listed = ", ".join(have) if have else "none"
    message = (
        "this skill-lock bundle has no binary for %s (it has: %s); build from "
        "source with `cargo install --locked --git <skill-lock repository>` or "
        "`uvx --from <skill-lock checkout> skill-lock`, or install a bundle made "
        "for this platform (scripts/bundle)" % (host, listed)
    )
    have_json = ",".join('"%s"' % p for p in have)
    obj = (
        '{"result":"error","error":"internal","message":"%s",'
        '"platform":"%s","platforms":[%s]}' % (message, host, have_json)
    )
    # `run` prints its JSON on stderr (SPEC 2.7); everything else on stdout.
    return (
        "#!/bin/sh\n"
        "# skill-lock: no binary for this platform in the bundle.\n"
        "line='%s'\n"
        'for a in "$@"; do [ "$a" = -- ] && break; if [ "$a" = run ]; then '
        'printf \'%%s\\n\' "$line" >&2; exit 2; fi; done\n'
        "printf '%%s\\n' \"$line\"\n"
        "exit 2\n" % obj
    ).encode()


def _tag():
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "py3-none-" + plat


def _dist_info(version):
    metadata = (
        "Metadata-Version: 2.1\nName: skill-lock\nVersion: %s\nSummary: %s\n"
        "Requires-Python: >=3.8\n" % (version, SUMMARY)
    )
    wheel = (
        "Wheel-Version: 1.0\nGenerator: skill-lock-bundle\nRoot-Is-Purelib: false\n"
        "Tag: %s\n" % _tag()
    )
    return {"METADATA": metadata.encode(), "WHEEL": wheel.encode()}


def _files(version):
    """(path in the wheel, bytes, executable) of everything the wheel holds."""
    data = "%s-%s.data" % (NAME, version)
    host = host_platform()
    binary = os.path.join(ROOT, "bin", host, binary_name(host))
    if os.path.isfile(binary):
        with open(binary, "rb") as f:
            script = f.read()
    else:
        script = _no_binary_script(host, bundled_platforms())
    out = [(data + "/scripts/" + binary_name(host), script, True)]
    share = os.path.join(ROOT, "share")
    for dirpath, _dirs, names in os.walk(share):
        for n in sorted(names):
            path = os.path.join(dirpath, n)
            rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
            with open(path, "rb") as f:
                out.append((data + "/data/" + rel, f.read(), False))
    info = "%s-%s.dist-info" % (NAME, version)
    for n, b in _dist_info(version).items():
        out.append((info + "/" + n, b, False))
    return out, info


def _record_line(name, content):
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=")
    return "%s,sha256=%s,%d\n" % (name, digest.decode(), len(content))


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    version = _version()
    info = "%s-%s.dist-info" % (NAME, version)
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    for n, b in _dist_info(version).items():
        with open(os.path.join(metadata_directory, info, n), "wb") as f:
            f.write(b)
    return info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    files, info = _files(version)
    name = "%s-%s-%s.whl" % (NAME, version, _tag())
    record = "".join(_record_line(n, b) for n, b, _x in files)
    record += info + "/RECORD,,\n"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for n, b, executable in files + [(info + "/RECORD", record.encode(), False)]:
            zi = zipfile.ZipInfo(n, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = (0o100755 if executable else 0o100644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, b)
    return name


def build_sdist(sdist_directory, config_settings=None):
    version = _version()
    base = "%s-%s" % (NAME, version)
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for dirpath, dirs, names in os.walk(ROOT):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for n in sorted(names):
                path = os.path.join(dirpath, n)
                t.add(path, arcname=base + "/" + os.path.relpath(path, ROOT), recursive=False)
        pkg_info = _dist_info(version)["METADATA"]
        ti = tarfile.TarInfo(base + "/PKG-INFO")
        ti.size = len(pkg_info)
        t.addfile(ti, io.BytesIO(pkg_info))
    return name
