"""The `py_srcs` filegroup of a package, the data of //tools/lint:module_size_test,
and its `build_file`, the data of //tools/lint:api_test."""

def py_srcs(name = "py_srcs"):
    """Declares `name`: the package's library modules (tests excluded), and
    `build_file`: its BUILD.bazel.

    Args:
      name: The filegroup's name; the lint test's data names `py_srcs`.
    """
    native.filegroup(
        name = name,
        srcs = native.glob(
            ["*.py"],
            exclude = ["*_test.py"],
        ),
        visibility = ["//tools/lint:__pkg__"],
    )
    native.filegroup(
        name = "build_file",
        srcs = ["BUILD.bazel"],
        visibility = ["//tools/lint:__pkg__"],
    )
