"""Engines that bench/compare.py runs side by side on the same GGUF and token ids.

Each module has `run(spec: RunSpec) -> PeerResult` and raises PeerUnavailable when its
package is not installed, so a missing peer is reported, not fatal.
"""
