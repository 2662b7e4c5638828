"""Runs a test script in several processes (torch_xla_core.launch --nproc N
--devices 1) and reads what each process wrote: OUT/rank{r}.json. The
multi-process tests' fixtures (test_collectives, test_subgroups, test_fsdp)."""
import json
import os
import re
import subprocess
import sys


def launched_ranks(script: str, nproc: int, out) -> list:
    """[rank r's JSON for r in range(nproc)] after one launch of `script out`
    (asserts it succeeded, showing each process's first error lines and the end of its stderr, less
    torch's deprecation warnings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXC_NUM_CPU") and k != "XLA_FLAGS"}
    r = subprocess.run([sys.executable, "-m", "torch_xla_core.launch", "--nproc", str(nproc), "--devices", "1",
                        script, str(out)], env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        lines = [line for line in r.stderr.splitlines() if "Warning" not in line and "return func(*args" not in line]
        errors = [line for line in lines if re.search(r"Error|Traceback|exited|killed|signal", line)]
        raise AssertionError(f"the launch of {script} exited with status {r.returncode}; error lines:\n"
                             + "\n".join(errors[:40]) + "\n--- end of stderr:\n" + "\n".join(lines)[-4000:])
    return [json.loads((out / f"rank{i}.json").read_text()) for i in range(nproc)]
