"""The host's python3 as a hermetic Bazel Python toolchain.

`host_python` finds `python3` (3.11 or newer) on PATH when the repository is
fetched and generates @python_host with:
  * `:python3`, the interpreter for py_binary/py_test, started with -S (no
    site-packages) and -P (no script folder on sys.path): a module that a
    target does not declare fails to import instead of silently coming from
    the host;
  * `:py_toolchain`, to pass to register_toolchains();
  * `python_path.txt`, the absolute interpreter path, so that the pip
    repositories install for the same interpreter.
"""

_MIN_VERSION = (3, 11)

_BUILD = """\
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "py3_runtime",
    files = [],
    interpreter = ":python3",
    python_version = "PY3",
    stub_shebang = "#!/usr/bin/env python3",
)

py_runtime_pair(
    name = "py_runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "py_toolchain",
    toolchain = ":py_runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)

exports_files(["python3", "python_path.txt"])
"""

def _host_python_impl(rctx):
    python = rctx.which(rctx.attr.python)
    if not python:
        fail("host_python: no `{}` on PATH; install Python {}.{} or newer.".format(
            rctx.attr.python,
            _MIN_VERSION[0],
            _MIN_VERSION[1],
        ))
    result = rctx.execute([
        python,
        "-S",
        "-c",
        "import sys; print(sys.executable); print('%d.%d' % sys.version_info[:2])",
    ])
    if result.return_code:
        fail("host_python: `{}` failed: {}".format(python, result.stderr))
    executable, version = result.stdout.strip().split("\n")
    major, minor = [int(part) for part in version.split(".")]
    if (major, minor) < _MIN_VERSION:
        fail("host_python: `{}` is Python {}; Python {}.{} or newer is needed.".format(
            executable,
            version,
            _MIN_VERSION[0],
            _MIN_VERSION[1],
        ))
    rctx.file(
        "python3",
        "#!/bin/sh\nexec '{}' -S -P \"$@\"\n".format(executable),
        executable = True,
    )
    rctx.file("python_path.txt", executable + "\n")
    rctx.file("BUILD.bazel", _BUILD)

host_python = repository_rule(
    implementation = _host_python_impl,
    attrs = {
        "python": attr.string(
            default = "python3",
            doc = "Name of the interpreter to look up on PATH.",
        ),
    },
    environ = ["PATH"],
    doc = "The host's python3 as a hermetic Python toolchain.",
)
