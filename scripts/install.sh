#!/usr/bin/env bash
# Install chatrlhf's dependencies with its test extra (no package of its own: it runs from this clone). Torch first, pinned to the 2.13.0 build when no torch
# is installed: an unpinned torch would pull a multi-GB CUDA build onto a CPU-only machine. An existing torch
# (e.g. a CUDA build on a GPU machine) is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch" 2>/dev/null || python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet ".[test]"
