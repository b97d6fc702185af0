"""Forwards @rules_cc's macros to the native rules (offline stand-in)."""

def cc_binary(**attrs):
    native.cc_binary(**attrs)  # buildifier: disable=native-cc-binary

def cc_library(**attrs):
    native.cc_library(**attrs)  # buildifier: disable=native-cc-library

def cc_test(**attrs):
    native.cc_test(**attrs)  # buildifier: disable=native-cc-test

def cc_import(**attrs):
    native.cc_import(**attrs)  # buildifier: disable=native-cc-import

def cc_proto_library(**attrs):
    native.cc_proto_library(**attrs)  # buildifier: disable=native-cc-proto

def cc_toolchain(**attrs):
    native.cc_toolchain(**attrs)  # buildifier: disable=native-cc-toolchain

def cc_toolchain_suite(**attrs):
    native.cc_toolchain_suite(**attrs)  # buildifier: disable=native-cc-toolchain-suite

def objc_library(**attrs):
    native.objc_library(**attrs)  # buildifier: disable=native-cc-objc-library

def objc_import(**attrs):
    native.objc_import(**attrs)  # buildifier: disable=native-cc-objc-import
