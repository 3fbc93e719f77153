#!/usr/bin/env python3
"""The GPU machine's environment, read at the start of every bench/gpu_check.sh run (a task may
be the first on a new image): the GPU and driver (nvidia-smi), the CUDA toolkit (nvcc), the
CUDA runtime and driver API versions (cudaRuntimeGetVersion / cudaDriverGetVersion through
ctypes), cuBLASLt's version (cublasLtGetVersion), every libcudnn found (ldconfig's cache,
/usr/local/cuda, the Python packages' nvidia/cudnn) with its version from cudnnGetVersion()
(a dlopen of the library: what trident's run-time cuDNN loading will see), and PyTorch's view
(torch.version.cuda, torch.backends.cudnn.version(), the device). Prints a short text and
writes the whole as JSON (--out). Runs anywhere: what is missing is reported as missing.
usage: gpu_probe.py [--out env_probe.json]
"""
import argparse
import ctypes
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys


def run(cmd, timeout=30):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.stdout if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def version_int(v, scheme):
    """CUDA's integers: 12040 -> 12.4; cuDNN 9: 90100 -> 9.1.0 (major*10000+minor*100+patch)."""
    if v is None:
        return None
    if scheme == "cuda":
        return f"{v // 1000}.{(v % 1000) // 10}"
    if v >= 10000:
        return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"
    return f"{v // 1000}.{(v % 1000) // 100}.{v % 100}"  # cuDNN 8: major*1000+minor*100+patch


def call_int(lib, fn):
    """fn(int*) -> status 0, or fn() -> size_t."""
    f = getattr(lib, fn)
    out = ctypes.c_int(0)
    f.argtypes = [ctypes.POINTER(ctypes.c_int)]
    f.restype = ctypes.c_int
    return out.value if f(ctypes.byref(out)) == 0 else None


def site_dirs():
    dirs = []
    for p in sys.path:
        if p and os.path.isdir(os.path.join(p, "nvidia")):
            dirs.append(os.path.join(p, "nvidia"))
    return dirs


def find_libs(stem):
    """Paths of lib<stem>.so* in the usual places, resolved, without duplicates."""
    found = []
    cache = run(["ldconfig", "-p"]) or ""
    for m in re.finditer(r"\s(lib%s\.so[.0-9]*) .*=> (\S+)" % re.escape(stem), cache):
        found.append(m.group(2))
    pats = [f"/usr/local/cuda/lib64/lib{stem}.so*", f"/usr/local/cuda/targets/*/lib/lib{stem}.so*",
            f"/usr/lib/x86_64-linux-gnu/lib{stem}.so*", f"/usr/local/nvidia/lib64/lib{stem}.so*"]
    for d in site_dirs():
        pats += [f"{d}/*/lib/lib{stem}.so*", f"{d}/lib/lib{stem}.so*"]
    for pat in pats:
        found += glob.glob(pat)
    seen, out = set(), []
    for f in found:
        r = os.path.realpath(f)
        if r not in seen and os.path.isfile(r) and re.search(r"\.so(\.\d+)*$", r):
            seen.add(r)
            out.append(r)
    return out


def probe_cudnn(path):
    r = {"path": path}
    try:
        lib = ctypes.CDLL(path)
        lib.cudnnGetVersion.restype = ctypes.c_size_t
        r["version"] = version_int(int(lib.cudnnGetVersion()), "cudnn")
        if hasattr(lib, "cudnnGetCudartVersion"):
            lib.cudnnGetCudartVersion.restype = ctypes.c_size_t
            r["built_for_cudart"] = version_int(int(lib.cudnnGetCudartVersion()), "cuda")
    except (OSError, AttributeError) as e:
        r["error"] = str(e)[:200]
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    env = {"host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
           "python": sys.version.split()[0]}
    smi = run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,"
               "clocks.sm,power.limit", "--format=csv,noheader"])
    env["gpus"] = [ln.strip() for ln in smi.splitlines() if ln.strip()] if smi else None
    head = run(["nvidia-smi"]) or ""
    m = re.search(r"CUDA Version:\s*([0-9.]+)", head)
    env["driver_cuda_version"] = m.group(1) if m else None
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                    if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    out = run([nvcc, "--version"]) if nvcc else None
    m = re.search(r"release ([0-9.]+)", out or "")
    env["nvcc"] = {"path": nvcc, "release": m.group(1) if m else None}

    cudart = find_libs("cudart")
    env["cudart"] = {"found": cudart}
    for path in cudart:  # the first that loads
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        env["cudart"].update(
            loaded=path, runtime=version_int(call_int(lib, "cudaRuntimeGetVersion"), "cuda"),
            driver_api=version_int(call_int(lib, "cudaDriverGetVersion"), "cuda"))
        break
    lt = find_libs("cublasLt")
    env["cublasLt"] = {"found": lt}
    for path in lt:
        try:
            lib = ctypes.CDLL(path)
            lib.cublasLtGetVersion.restype = ctypes.c_size_t
            v = int(lib.cublasLtGetVersion())  # major*10000 + minor*100 + patch
            env["cublasLt"].update(loaded=path, version=f"{v // 10000}.{(v % 10000) // 100}.{v % 100}")
            break
        except (OSError, AttributeError):
            continue
    # libcudnn.so* itself (the front library whose cudnnGetVersion trident would call)
    env["cudnn"] = [probe_cudnn(p) for p in find_libs("cudnn")]
    try:
        import torch
        t = {"version": torch.__version__, "cuda": torch.version.cuda,
             "cuda_available": torch.cuda.is_available()}
        try:
            t["cudnn"] = torch.backends.cudnn.version()
        except Exception as e:  # noqa: BLE001  (a report, whatever goes wrong)
            t["cudnn"] = f"error: {e}"
        if t["cuda_available"]:
            p = torch.cuda.get_device_properties(0)
            t["device"] = {"name": p.name, "sms": p.multi_processor_count,
                           "memory_gib": round(p.total_memory / 2**30, 1),
                           "capability": f"{p.major}.{p.minor}"}
        env["torch"] = t
    except ImportError as e:
        env["torch"] = {"error": str(e)}

    lines = [f"GPU: {'; '.join(env['gpus']) if env['gpus'] else 'none (nvidia-smi absent or failed)'}",
             f"driver CUDA {env['driver_cuda_version']}, nvcc {env['nvcc']['release']}, "
             f"cudart {env['cudart'].get('runtime')} (driver API {env['cudart'].get('driver_api')}), "
             f"cuBLASLt {env['cublasLt'].get('version')}"]
    if env["cudnn"]:
        for c in env["cudnn"]:
            lines.append(f"cuDNN {c.get('version', '?')} (cudart {c.get('built_for_cudart', '?')}) "
                         f"at {c['path']}" + (f": {c['error']}" if "error" in c else ""))
    else:
        lines.append("cuDNN: no libcudnn.so found")
    t = env["torch"]
    lines.append(f"torch {t.get('version')} (CUDA {t.get('cuda')}, cuDNN {t.get('cudnn')}), "
                 f"GPU visible: {t.get('cuda_available')}" if "version" in t
                 else f"torch: {t['error']}")
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(env, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
