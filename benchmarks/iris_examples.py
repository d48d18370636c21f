"""Every example program of an Iris checkout, run unchanged under ``gemmar run``, with its outcome in a table.

Not a benchmark: a compatibility sweep. Iris is not part of gemmar; fetch a checkout yourself (the table in
docs/iris.md used ROCm/iris's PRs up to #533, commit abd3f2a of 2026-05-12, through the fork
github.com/ryanswann-amd/iris; the table is in docs/iris.md). Then, from anywhere:

    python3 benchmarks/iris_examples.py IRIS_CHECKOUT [--ranks 2] [--backend cpu] [--only 04 24] [--json OUT]

Each program runs from the checkout's root with ``PYTHONPATH`` set to it (its ``examples.common`` imports
need that) and ``--replace_iris`` (the checkout's own ``iris`` is importable there), with arguments small
enough for the Triton interpreter and the example's own validation turned on where it has one. Printed per
example: gemmar's exit status, what its own validation said, and the first failure line.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

GEMM = ["-m", "64", "-n", "64", "-k", "128", "--BLK_M", "32", "--BLK_N", "32", "--BLK_K", "32", "-v"]
# (example, arguments): small sizes, validation on; a GEMM example's programs split so that some communicate
# (their defaults derive the split from the GPU's SMs; the cpu backend's "SMs" are its 2 cores here).
EXAMPLES = [
    ("00_load/load_bench.py", ["-z", "4096", "-b", "256", "-n", "2", "-w", "1", "-d", "-v"]),
    ("01_store/store_bench.py", ["-z", "4096", "-b", "256", "-n", "2", "-w", "1", "-d", "-v"]),
    ("02_all_load/all_load_bench.py", ["-m", "4096", "-M", "4096", "-b", "256", "-x", "2", "-w", "1", "-d", "-v"]),
    ("03_all_store/all_store_bench.py", ["-m", "4096", "-M", "4096", "-b", "256", "-x", "2", "-w", "1", "-d", "-v"]),
    ("04_atomic_add/atomic_add_bench.py", ["-z", "4096", "-b", "256", "-x", "2", "-w", "1", "-d", "-v"]),
    ("05_atomic_xchg/atomic_xchg_bench.py", ["-z", "4096", "-b", "256", "-x", "2", "-w", "1", "-d", "-v"]),
    ("06_message_passing/message_passing_device_context.py", []),
    ("06_message_passing/message_passing_gluon.py", ["-s", "1024", "-b", "256"]),
    ("06_message_passing/message_passing_load_store.py", ["-s", "1024", "-b", "256"]),
    ("06_message_passing/message_passing_put.py", ["-s", "1024", "-b", "256"]),
    ("07_gemm_all_scatter/benchmark.py", GEMM),
    ("08_gemm_all_reduce_atomics/benchmark.py", GEMM),
    ("09_gemm_one_shot_all_reduce/benchmark.py", GEMM + ["--gemm_sms", "2", "--total_sms", "3"]),
    ("10_gemm_all_scatter_wg_specialization/benchmark.py", GEMM + ["--gemm_sms", "2", "--num_sms", "3"]),
    ("11_gemm_all_scatter_producer_consumer/benchmark.py", GEMM + ["--gemm_sms", "2", "--comm_sms", "1"]),
    ("12_gemm_all_scatter_bulk_synchronous/benchmark.py", GEMM),
    ("13_flash_decode/example_run.py", ["--kv_len_per_rank", "64", "--num_heads", "4", "--head_dim", "32",
                                        "--num_seqs", "2", "--num_ranks", "{ranks}"]),
    ("14_all_gather_gemm/example_run_pull.py", ["--M", "64", "--N", "64", "--K", "256", "--BLOCK_SIZE_M", "32",
                                                "--BLOCK_SIZE_N", "32", "--BLOCK_SIZE_K", "32",
                                                "--num_ranks", "{ranks}"]),
    ("14_all_gather_gemm/example_run_push.py", ["--M", "64", "--N", "64", "--K", "256", "--BLOCK_SIZE_M", "32",
                                                "--BLOCK_SIZE_N", "32", "--BLOCK_SIZE_K", "32",
                                                "--num_ranks", "{ranks}"]),
    ("15_gemm_all_reduce_ring_based/benchmark.py", GEMM + ["--gemm_sms", "4", "--comm_sms", "2"]),
    ("16_all_reduce_ring_based/benchmark.py", ["-m", "64", "-n", "128", "--BLK_M", "32", "--BLK_N", "32",
                                               "--num_sms", "4", "-v"]),
    ("20_gemm_all_scatter_independent/benchmark.py", GEMM + ["--gemm_sms", "2", "--comm_sms", "1", "-r", "{ranks}"]),
    ("21_gemm_one_shot_all_reduce_independent/benchmark.py", GEMM + ["--gemm_sms", "4", "--comm_sms", "2",
                                                                     "-r", "{ranks}"]),
    ("22_gemm_one_shot_reduce_scatter_wg_specialization/benchmark.py", GEMM + ["--gemm_sms", "2", "--num_sms", "3"]),
    ("23_gemm_all_scatter_tracing/benchmark.py", GEMM + ["--trace"]),
    ("24_ccl_all_reduce/example.py", ["-m", "64", "-n", "96", "-v"]),
    ("25_ccl_all_gather/example.py", ["-m", "64", "-n", "96", "-v"]),
    ("26_ccl_all_to_all/example.py", ["-m", "64", "-n", "32", "-v"]),
    ("27_ccl_reduce_scatter/example.py", ["-m", "64", "-n", "96", "-v"]),
    ("28_ops_matmul_all_reduce/example.py", ["-m", "64", "-n", "96", "-k", "128", "-v"]),
    ("29_ops_all_gather_matmul/example.py", ["-m", "64", "-n", "96", "--k_local", "64", "-v"]),
    ("30_ops_matmul_all_gather/example.py", ["-m", "64", "-n", "96", "-k", "128", "-v"]),
    ("31_expert_sharded_moe/example_run.py", ["--num_ranks", "{ranks}", "--n_tokens", "32", "--d_model", "32"]),
    ("31_message_passing/example.py", ["-s", "1024", "-b", "256", "-v"]),
    ("32_gluon_all_gather_tracing/all_gather_tracing.py", ["--num_elements", "1024"]),
    ("benchmark/bench_all_shapes.py", []),
]

VERDICT = re.compile(r"(validation (passed|successful|failed)|final c validation \w+|verified successfully|"
                     r"verification failed|max absolute difference|mismatch|passed: [^.]*|success\": \w+)",
                     re.IGNORECASE)


def run_one(checkout, example, args, ranks, backend, timeout):
    command = [sys.executable, "-m", "gemmar", "run", "-r", str(ranks), "--backend", backend, "--replace_iris",
               "--timeout", str(timeout), os.path.join("examples", example)]
    command += [a.replace("{ranks}", str(ranks)) for a in args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (checkout, os.environ.get("PYTHONPATH")) if p))
    start = time.monotonic()
    p = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=timeout + 120)
    lines = (p.stdout + p.stderr).splitlines()
    said = sorted({m.group(0).lower() for line in lines for m in [VERDICT.search(line)] if m})
    failure = next((line for line in lines if line.startswith("gemmar run: ")), "")
    return dict(example=example, exit_code=p.returncode, seconds=round(time.monotonic() - start, 1),
                validation=said, failure=failure[len("gemmar run: "):][:300], tail=lines[-12:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", help="an Iris checkout (the folder holding iris/ and examples/)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda", "auto"))
    parser.add_argument("--only", nargs="*", help="examples whose path starts with these (e.g. 04 24)")
    parser.add_argument("--timeout", type=int, default=240, help="seconds per example")
    parser.add_argument("--json", help="write every outcome here")
    args = parser.parse_args()
    checkout = os.path.abspath(args.checkout)
    if not os.path.isdir(os.path.join(checkout, "examples")):
        parser.error(f"{checkout} has no examples/ folder: give the root of an Iris checkout")
    chosen = [(e, a) for e, a in EXAMPLES if not args.only or any(e.startswith(o) for o in args.only)]
    results = []
    print("| example | exit | its validation | seconds | first failure |")
    print("|---|---|---|---|---|")
    for example, example_args in chosen:
        r = run_one(checkout, example, example_args, args.ranks, args.backend, args.timeout)
        results.append(r)
        print(f"| {r['example']} | {r['exit_code']} | {'; '.join(r['validation']) or '-'} | {r['seconds']} | "
              f"{r['failure'].replace('|', '/') or '-'} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(checkout=checkout, ranks=args.ranks, backend=args.backend, results=results), f, indent=1)
    ran = sum(r["exit_code"] == 0 for r in results)
    print(f"\n{ran} of {len(results)} examples exited 0 at {args.ranks} ranks on the {args.backend} backend")


if __name__ == "__main__":
    main()
