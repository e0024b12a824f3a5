"""Offline stand-in for @rules_python//python:defs.bzl: forwards to Bazel's native Python rules.

Only for Bazel 4-6 through `--config=offline` (see .bazelrc); Bazel 7+ gets the real rules_python
from MODULE.bazel. Same names and attributes, so BUILD files load from @rules_python on every version.
"""

def py_library(**attrs):
    native.py_library(**attrs)

def py_binary(**attrs):
    native.py_binary(**attrs)

def py_test(**attrs):
    native.py_test(**attrs)

def py_runtime(**attrs):
    native.py_runtime(**attrs)
