"""platform_py_test: one integration test, declared once per accelerator platform."""

load("@rules_python//python:defs.bzl", "py_test")

# Environment each platform's test runs with. Tests read HF2MAXTEXT_TEST_PLATFORM;
# JAX_PLATFORMS makes JAX fail loudly instead of silently falling back to the CPU.
PLATFORM_ENV = {
    "cpu": {"HF2MAXTEXT_TEST_PLATFORM": "cpu", "JAX_PLATFORMS": "cpu"},
    "gpu": {"HF2MAXTEXT_TEST_PLATFORM": "gpu", "JAX_PLATFORMS": "cuda"},
    "tpu": {"HF2MAXTEXT_TEST_PLATFORM": "tpu", "JAX_PLATFORMS": "tpu"},
}

# Nothing downloads from the Hugging Face Hub during tests.
COMMON_ENV = {"HF_HUB_OFFLINE": "1"}

def platform_py_test(name, srcs, main = None, env = {}, tags = [], size = "large", **kwargs):
    """Declares `name` (CPU), `name_gpu` and `name_tpu` from the same sources.

    The CPU test is an ordinary test (in //... and :cpu_tests). The GPU and TPU ones are tagged
    "manual" (so `bazel test //...` skips them; run them through :gpu_tests / :tpu_tests) and
    "exclusive".

    Args:
      name: name of the CPU test; the others get _gpu / _tpu appended.
      srcs: the test's sources.
      main: the file to run (default: the single entry of srcs).
      env: extra environment for every variant.
      tags: extra tags for every variant.
      size: Bazel test size (default "large": 15 minutes).
      **kwargs: passed on to py_test (deps, data, args, shard_count, ...).
    """
    if main == None:
        if len(srcs) != 1:
            fail("platform_py_test %s: give `main` when srcs has several files" % name)
        main = srcs[0]
    for platform, suffix, extra_tags in [
        ("cpu", "", []),
        # exclusive: one accelerator test at a time (JAX takes most of a GPU's memory; a TPU admits
        # one process).
        ("gpu", "_gpu", ["manual", "exclusive"]),
        ("tpu", "_tpu", ["manual", "exclusive"]),
    ]:
        test_env = dict(COMMON_ENV)
        test_env.update(PLATFORM_ENV[platform])
        test_env.update(env)
        py_test(
            name = name + suffix,
            srcs = srcs,
            main = main,
            size = size,
            env = test_env,
            tags = [platform] + extra_tags + tags,
            **kwargs
        )

def py_unit_tests(deps = [], data = [], size = "medium", tags = [], srcs = ["*_test.py"]):
    """One CPU py_test per file matching `srcs` (globs, default *_test.py) in the calling package, plus a
    `tests` suite of them.

    For unit tests next to the code (handlers/, converter/ and its subdirectories, tools/).
    //integration_tests:cpu_tests includes each package's :tests.
    """
    for src in native.glob(srcs, allow_empty = True):
        py_test(
            name = src[:-len(".py")],
            size = size,
            srcs = [src],
            main = src,
            env = dict(COMMON_ENV, HF2MAXTEXT_TEST_PLATFORM = "cpu", JAX_PLATFORMS = "cpu"),
            tags = ["cpu"] + tags,
            deps = deps,
            data = data,
        )
    native.test_suite(name = "tests")
