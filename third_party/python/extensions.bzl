"""Module extension for Bazel 7+ (bzlmod): the same repositories as WORKSPACE."""

load("//third_party/toolchains/python:python.bzl", "host_python")
load(":repositories.bzl", "maxtext_python_repositories")

def _python_deps_impl(_module_ctx):
    host_python(name = "python_host")
    maxtext_python_repositories()

python_deps = module_extension(
    implementation = _python_deps_impl,
    doc = "@python_host, @pypi, @pypi_test, @pypi_vllm, @pypi_gpu, @pypi_gpu_cudnn and the bundled data archives.",
)
