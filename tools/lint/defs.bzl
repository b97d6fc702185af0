"""The `py_srcs` filegroup of a package, the data of //tools/lint:module_size_test,
and its `build_file`, the data of //tools/lint:api_test."""

def py_srcs(name = "py_srcs"):
    """Declares the package's library modules and its BUILD file.

    `name` holds the library modules (tests excluded), `build_file` the
    BUILD.bazel.

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
