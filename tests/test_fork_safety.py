"""Nothing CUDA is touched in a process that forks before it forks (issue 23, item 1).

On a CUDA build, torch.cuda.is_available() and device_count() initialise the driver, and torch then
refuses CUDA in every forked child ("Cannot re-initialize CUDA in forked subprocess"): every GPU
evaluation would crash. The CPU build answers without a driver, so a run on a CPU cannot show it:
these tests record every CUDA query the template makes before its forks, whatever the build."""

from __future__ import annotations

import pytest
import subprocess
import sys

from conftest import ROOT

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)

# Every torch.cuda entry point that may start the driver on a CUDA build; is_initialized() is the one that
# never does (it is how a process asks whether it may still fork).
QUERIES = ("is_available", "device_count", "init", "current_device", "get_device_name", "get_device_properties",
           "get_device_capability", "set_device", "mem_get_info", "synchronize", "_lazy_init")

RECORDER = f"""
import torch, torch.cuda
called = []
for name in {QUERIES!r}:
    if hasattr(torch.cuda, name):
        real = getattr(torch.cuda, name)
        def record(*args, _name=name, _real=real, **kwargs):
            called.append(_name)
            return _real(*args, **kwargs)
        setattr(torch.cuda, name, record)
"""


def test_the_model_template_asks_nothing_of_cuda_before_it_forks():
    code = RECORDER + "from harness.ranks.models import model_template\nmodel_template._preload()\nprint(called)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"CUDA queried before the forks: {out.stdout.strip()}"


def test_the_recorder_sees_a_cuda_query_on_a_cpu_build():
    # The recorder must catch what the template is tested for, on this very build.
    code = RECORDER + "torch.cuda.is_available()\ntorch.cuda.device_count()\nprint(called)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.stdout.strip() == "['is_available', 'device_count']", out.stdout + out.stderr
