"""`harness doctor`'s check of evaluation's model process: one started as a scorer starts it, with no team code.

Evaluation runs the team's model in model processes forked from a clean template (harness/scoring/template.py,
harness/ranks/models/model_template.py); each enters new namespaces, a root of its own and Landlock before anything of
the submission is imported (harness/ranks/confine/sandbox.py `enter`), and on a GPU track starts CUDA on its rank's GPU
and page-locks the shared logits buffer (harness/ranks/models/model_worker.py `pin_for_copies`). A host that refuses
any of it is found at the end of the first run, after its training. This check starts one through the same code
(harness/scoring/workers.py `ModelWorker`, the template, the track's sandbox mode, the scratch root, the
protected paths of a run), on a model the doctor writes itself (a table: logits[b, t] = table[idx[b, t]],
every value exact), feeds it one batch and compares the logits that come back.

Its submission and checkpoint are written in the runs folder, where a run's are (the folder the sandbox hides,
around them); they are removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

from harness.launcher.doctor.table import Check
from harness.tracks.spec import Track

VOCAB, ROWS, SEQ_LEN = 16, 2, 8  # values 0..255: exact in float32 and in bfloat16
PROBE_TIMEOUT_S = {"cpu": 120.0, "cuda": 300.0}  # the template's import of torch, CUDA's start, on a busy node
PROBE_MODEL = '''"""harness doctor's probe of evaluation's model process: the harness's own model, no team code."""

import torch.nn as nn


class Table(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.table = nn.Embedding(config["vocab_size"], config["vocab_size"])

    def forward(self, idx, targets=None):
        return self.table(idx), None


def get_model(config):
    return Table(config)
'''
FIX = ("no run could be scored on this node: read the model process's error; the namespaces and sandbox checks "
       "name the host's settings, a scratch root that cannot hold its folder is the scratch checks', and on a GPU "
       "track the driver check and `ulimit -l` (docs/organizer.md, The day before)")


def _protected(runs: Path, data) -> list[str]:
    """What a run protects from its model processes (harness/launcher/run/training.py `protected_paths`)."""
    from harness.results.records import leaderboard_root

    return [str(runs.resolve()), str(leaderboard_root(runs=runs).resolve()), *(s.path for s in (data.val if data else []))]


def model_process_check(track: Track, runs: Path, data) -> Check:
    from harness.tracks.precision import resolve_precision
    from harness.launcher.run.runner import resolve_nproc
    from harness.launcher.run.training import threads_per_rank
    from harness.ranks.confine.scratch import scratch_root
    from harness.scoring.scorer import DETERMINISM, one_visible_device

    try:
        nproc = resolve_nproc(track)
    except RuntimeError as exc:  # a GPU track on a machine without GPUs: the gpus check says it
        return Check(name="eval-model", status="skipped", measured=f"no model process to start ({exc})")
    cuda = track.device == "cuda"
    probe = runs / f".doctor-eval-{socket.gethostname()}-{os.getpid()}"
    setup = {"checkpoint": str(probe / "checkpoint.pt"), "submission_dir": str(probe / "submission"),
             "device": "cuda:0" if cuda else "cpu",
             "cuda_visible_devices": one_visible_device(os.environ.get("CUDA_VISIBLE_DEVICES"), 0) if cuda else None,
             "precision": resolve_precision(track.dtype, track.device)[0],
             "threads": threads_per_rank(track, track.eval.nproc_per_node or nproc), "vocab_out": VOCAB,
             "sandbox": track.sandbox, "model_file": "submission.py",
             "determinism": DETERMINISM}  # what a scorer gives its model processes (harness/scoring/scorer.py)
    try:
        return _probe(track, probe, setup, _protected(runs, data), str(scratch_root()))
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _probe(track: Track, probe: Path, setup: dict, protected: list[str], scratch_dir: str) -> Check:
    from harness.scoring.template import model_template
    from harness.scoring.workers import ModelWorker, WorkerFailed

    t0 = time.monotonic()
    template = worker = None
    timeout_s = PROBE_TIMEOUT_S[track.device]
    # A model process that hangs is ended with its template (a copy's death takes its model process: PDEATHSIG);
    # the pipes then close, and the wait below says how it ended instead of waiting for ever.
    watchdog = threading.Timer(timeout_s, lambda: _end(template))
    watchdog.daemon = True
    error, log = "", ""
    try:
        template = model_template()  # first, as the scorer starts it: it imports torch while this process does
        watchdog.start()
        import torch

        (probe / "submission").mkdir(parents=True)
        (probe / "submission" / "submission.py").write_text(PROBE_MODEL)
        table = torch.arange(VOCAB * VOCAB, dtype=torch.float32).view(VOCAB, VOCAB)  # every logit distinct
        torch.save({"config": {"vocab_size": VOCAB}, "model": {"table.weight": table}, "step": 0, "tokens": 0},
                   setup["checkpoint"])
        worker = ModelWorker(setup=setup, buffer_bytes=ROWS * SEQ_LEN * VOCAB * 4, log_dir=probe / "logs",
                             protected=protected, template=template, scratch_dir=scratch_dir,
                             validation=False)  # its own probe and tokens: its words are kept
        ready = worker.wait_ready()
        ready_s = time.monotonic() - t0
        idx = torch.arange(ROWS * SEQ_LEN, dtype=torch.int64).view(ROWS, SEQ_LEN) % VOCAB
        t_batch = time.monotonic()
        worker.submit(idx.numpy())
        logits = worker.logits(VOCAB)
        batch_s = time.monotonic() - t_batch
        exact = bool(torch.equal(logits, table[idx]))
    except WorkerFailed as exc:  # its own report, or how it ended
        error = f"the model process failed: {str(exc) or exc.harness_status}"
    except Exception as exc:  # noqa: BLE001  (its folder, its pipes, the template: the check's failure, said)
        error = f"the model process {'failed' if worker is not None else 'could not start'}: {type(exc).__name__}: {exc}"
    finally:
        watchdog.cancel()
        try:
            if worker is not None:
                worker.close()
        except (WorkerFailed, RuntimeError) as exc:
            error = error or f"the model process could not be ended: {exc}"
        finally:
            if template is not None:
                template.close()
            if worker is not None:
                worker.name_log()
                log = _tail(worker.log_path)
    if error:
        if time.monotonic() - t0 >= timeout_s:
            error = f"not ready within {timeout_s:.0f} s ({error})"
        return Check(name="eval-model", status="fail", fix=FIX,
                     measured=f"{error[:500]}" + (f"; its log ends: {log}" if log else ""))
    return _judge(track, ready, worker.exposed, exact, ready_s, batch_s)


def _end(template) -> None:
    if template is not None:
        try:
            os.killpg(template.proc.pid, signal.SIGKILL)  # the template, its copies, and through them the model
        except (ProcessLookupError, PermissionError):
            pass


def _tail(path: Path, limit: int = 300) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return (lines[-1] if lines else "")[-limit:]


def _judge(track: Track, ready: dict, exposed: list[str], exact: bool, ready_s: float, batch_s: float) -> Check:
    """What the model process said of itself before the model loaded (its sandbox report), and its answer."""
    box = ready.get("sandbox") or {}
    ns, root = box.get("namespaces") or {}, box.get("filesystem") or {}
    timing = f"ready in {ready_s:.1f} s, one batch of {ROWS}x{SEQ_LEN} in {batch_s * 1e3:.0f} ms"
    if track.device == "cuda":
        device = f"CUDA started, logits buffer {ready.get('logits_buffer')}"
    else:
        device = f"CUDA skipped (track {track.name} runs on cpu)"
    if not exact:
        return Check(name="eval-model", status="fail", measured=f"{timing}; WRONG LOGITS for the doctor's own model",
                     fix="the shared logits buffer or the model process's arithmetic is broken here: take the node "
                         "out, and report it with the doctor's output")
    if track.sandbox == "off":
        return Check(name="eval-model", status="ok", value=ready_s, unit="s",
                     measured=f"{timing}; track {track.name} turns the sandbox off; {device}")
    if not box.get("active"):
        return Check(name="eval-model", status="fail", value=ready_s, unit="s",
                     measured=f"{timing}; no Landlock in the model process: {box.get('why')}",
                     fix="a kernel with Landlock (5.13 or newer, `landlock` in /sys/kernel/security/lsm) and the "
                         "py-landlock package: docs/organizer.md, Without Landlock")
    parts = ["its own user, PID, IPC and network namespaces" if ns.get("active") else f"NO namespaces ({ns.get('why')})",
             "its own root" if root.get("active") else f"NO root of its own ({root.get('why')})",
             f"{box.get('why')}, seccomp {box.get('seccomp') or '?'}", device]
    measured = f"{timing}; {'; '.join(parts)}"
    if not ns.get("active") or not root.get("active"):
        return Check(name="eval-model", status="warn", measured=measured, value=ready_s, unit="s",
                     fix="the sandbox is Landlock alone for evaluation: allow unprivileged user namespaces for the "
                         "harness's user (see the namespaces check)")
    if exposed:
        return Check(name="eval-model", status="warn", measured=f"{measured}; it may read {', '.join(exposed)}",
                     value=ready_s, unit="s", fix="keep the runs folder and the validation shards out of the folders "
                                                  "the sandbox allows (the Python installation, /usr, /etc, ...)")
    if track.device == "cuda" and ready.get("logits_buffer") != "page-locked":
        return Check(name="eval-model", status="warn", measured=measured, value=ready_s, unit="s",
                     fix="the logits' copy goes through the driver's staging (slower evaluation): `ulimit -l "
                         "unlimited` for the harness's user (see the memlock check)")
    return Check(name="eval-model", status="ok", measured=measured, value=ready_s, unit="s")
